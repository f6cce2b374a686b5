"""``mmserver/paging.py``: pages sorted by name, the documented limits, and the opaque cursor."""

from __future__ import annotations

import base64
import dataclasses

import pytest

from mmserver.errors import InvalidRequest
from mmserver.paging import (
    DEFAULT_PAGE_LIMIT,
    MAX_PAGE_LIMIT,
    decode_page_token,
    encode_page_token,
    paginate,
)


@dataclasses.dataclass(frozen=True)
class Entry:
    name: str


def entries(count: int) -> list[Entry]:
    return [Entry(f"m{i:04d}") for i in reversed(range(count))]  # listed out of order


def names(page) -> list[str]:
    return [e.name for e in page]


def test_the_documented_limits():
    assert (DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT) == (100, 1000)


def test_the_default_page_is_100_entries_sorted_by_name():
    page, token = paginate(entries(250))
    assert names(page) == [f"m{i:04d}" for i in range(100)]
    assert decode_page_token(token) == "m0099"
    page, token = paginate(entries(250), next_page_token=token)
    assert names(page) == [f"m{i:04d}" for i in range(100, 200)]
    page, token = paginate(entries(250), None, token)
    assert names(page) == [f"m{i:04d}" for i in range(200, 250)] and token is None


@pytest.mark.parametrize("count, limit, size, more", [
    (100, None, 100, False), (101, None, 100, True), (1000, 1000, 1000, False),
    (1001, 1000, 1000, True), (3, 1, 1, True), (1, 1, 1, False), (0, None, 0, False),
    (2, 2, 2, False), (3, 2, 2, True),
])
def test_a_token_only_when_more_follow(count, limit, size, more):
    page, token = paginate(entries(count), limit)
    assert len(page) == size
    assert (token is not None) == more
    if more:
        assert decode_page_token(token) == page[-1].name


@pytest.mark.parametrize("limit", [0, -1, 1001, 10**6])
def test_a_limit_outside_1_to_1000_is_refused(limit):
    with pytest.raises(InvalidRequest) as refused:
        paginate(entries(3), limit)
    assert str(refused.value) == f"limit must be between 1 and 1000, got {limit}"


def test_the_cursor_is_a_name_so_changes_between_pages_neither_repeat_nor_hide():
    present = [Entry(n) for n in ("b", "d", "f", "h")]
    page, token = paginate(present, 2)
    assert names(page) == ["b", "d"]
    changed = [Entry(n) for n in ("a", "c", "f", "h")]  # b and d gone, a and c added
    page, token = paginate(changed, 2, token)
    assert names(page) == ["f", "h"] and token is None
    page, token = paginate(present, 2, encode_page_token("c"))
    assert names(page) == ["d", "f"] and decode_page_token(token) == "f"


def test_the_token_is_unpadded_urlsafe_base64_of_the_last_name():
    assert encode_page_token("b") == "YWZ0ZXI6Yg"
    assert encode_page_token("abW") == "YWZ0ZXI6YWJX"  # ends in X: only "=" is stripped
    assert decode_page_token("YWZ0ZXI6YWJX") == "abW"
    assert base64.urlsafe_b64decode("YWZ0ZXI6Yg==") == b"after:b"
    for name in ("", "a", "ab", "model-ü/?", "x" * 300):
        token = encode_page_token(name)
        assert "=" not in token and "+" not in token and "/" not in token
        assert decode_page_token(token) == name


def test_an_empty_token_means_the_first_page():
    assert names(paginate(entries(2), 5, "")[0]) == ["m0000", "m0001"]


@pytest.mark.parametrize("token", [
    "not a token", "é", "YWZ0ZXI", base64.urlsafe_b64encode(b"before:b").decode(),
    base64.urlsafe_b64encode(b"\xff\xfeafter:").decode(), "AFTER6Yg", "=",
])
def test_a_token_this_server_did_not_issue_is_refused(token):
    with pytest.raises(InvalidRequest) as refused:
        paginate(entries(2), 5, token)
    assert str(refused.value) == f"next_page_token {token!r} is not a token this server issued"
