"""Assertions the test modules share, written once so every module means the same by them."""

from __future__ import annotations

import json


def assert_error(answer, status: int, error_type: str | None = None) -> dict:
    """Assert that ``answer`` is mmserver's error answer ``status``, and return its body.

    ``answer`` is what a client call returns: ``(status, body)`` from ``json``, ``load``,
    ``unload`` or ``invoke``, or ``(status, headers, raw)`` from ``request`` (a raw body is
    decoded here). Every error is ``{"code": status, "type": "...", "message": "..."}``, the
    MMS/TorchServe shape clients parse, with a type and a message that say something.
    """
    got, *_, body = answer
    if isinstance(body, (bytes, str)):
        body = json.loads(body)
    assert got == status, (got, body)
    assert isinstance(body, dict) and set(body) == {"code", "type", "message"}, body
    assert body["code"] == status, body
    assert isinstance(body["type"], str) and body["type"], body
    if error_type is not None:
        assert body["type"] == error_type, body
    assert isinstance(body["message"], str) and body["message"], body
    return body
