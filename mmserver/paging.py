"""Listing by an opaque cursor: a page of entries sorted by name, and the token of the next one.

``GET /models`` pages the models of one process (``registry``) and the
registrations of a Ray cluster (``mmserver.ray.registrations``) alike. The
token names the last entry returned, not an offset, so entries added or removed
between pages neither repeat nor hide the ones present throughout. A leaf: the
standard library and ``errors`` only.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable
from typing import Protocol, TypeVar

from mmserver.errors import InvalidRequest

DEFAULT_PAGE_LIMIT = 100
MAX_PAGE_LIMIT = 1000
_TOKEN_PREFIX = "after:"


class Named(Protocol):
    """What a listing pages by: anything with a ``name`` (a model, a cluster's registration)."""

    name: str


N = TypeVar("N", bound=Named)


def paginate(entries: Iterable[N], limit: int | None = None,
             next_page_token: str | None = None) -> tuple[list[N], str | None]:
    """``entries`` sorted by name after the cursor, at most ``limit``; the next page's token
    when more follow."""
    limit = DEFAULT_PAGE_LIMIT if limit is None else limit
    if not 1 <= limit <= MAX_PAGE_LIMIT:
        raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE_LIMIT}, got {limit}")
    after = decode_page_token(next_page_token) if next_page_token else None
    remaining = sorted((e for e in entries if after is None or e.name > after),
                       key=lambda e: e.name)
    page = remaining[:limit]
    token = encode_page_token(page[-1].name) if len(remaining) > limit else None
    return page, token


def encode_page_token(last_name: str) -> str:
    return base64.urlsafe_b64encode((_TOKEN_PREFIX + last_name).encode()).decode().rstrip("=")


def decode_page_token(token: str) -> str:
    try:
        padded = token + "=" * (-len(token) % 4)
        text = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        text = ""
    if not text.startswith(_TOKEN_PREFIX):
        raise InvalidRequest(f"next_page_token {token!r} is not a token this server issued")
    return text[len(_TOKEN_PREFIX):]
