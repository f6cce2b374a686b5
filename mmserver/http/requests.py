"""What a request must hold, read without any web framework.

The operations (``http.sagemaker``, ``http.v2``) read a load's body, a listing's
``limit``, SageMaker's header names and ``/invocations``' target through these,
whichever host serves them, so a client gets the same 400 with the same words from
``mmserver serve`` and from a Ray cluster. Each raises
:class:`~mmserver.errors.InvalidRequest` (or :class:`~mmserver.errors.PayloadTooLarge`);
the HTTP layer picks the status.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from mmserver import errors
from mmserver.registry import validate_name

if TYPE_CHECKING:
    from mmserver.http.service import Call

#: Management requests are small JSON objects; anything larger is not one.
MAX_JSON_OBJECT_BYTES = 64 * 1024
TARGET_MODEL_HEADER = "X-Amzn-SageMaker-Target-Model"
CUSTOM_ATTRIBUTES_HEADER = "X-Amzn-SageMaker-Custom-Attributes"
#: Name the single model of single-model mode is registered under (``/invocations``
#: without the target model header).
SINGLE_MODEL_NAME = "model"


def check_json_object_size(content_length: int | None) -> None:
    """A management body announced larger than :data:`MAX_JSON_OBJECT_BYTES` is refused
    before it is read."""
    if content_length is not None and content_length > MAX_JSON_OBJECT_BYTES:
        raise errors.PayloadTooLarge(f"this request's body is at most {MAX_JSON_OBJECT_BYTES} "
                                     "bytes")


def parse_json_object(raw: bytes, *, empty_allowed: bool = False) -> dict:
    """The body as a JSON object; ``{}`` for an empty body when ``empty_allowed``."""
    check_json_object_size(len(raw))
    if empty_allowed and not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise errors.InvalidRequest(f"the body must be a JSON object: {error}") from None
    if not isinstance(body, dict):
        raise errors.InvalidRequest(f"the body must be a JSON object, got {type(body).__name__}")
    return body


def load_request(body: dict) -> tuple[str, str]:
    """``POST /models``' ``(model_name, url)``, both non-empty strings, the name valid."""
    name, url = body.get("model_name"), body.get("url")
    if not isinstance(name, str) or not name:
        raise errors.InvalidRequest('the body needs "model_name": a string')
    if not isinstance(url, str) or not url:
        raise errors.InvalidRequest('the body needs "url": the path of the model directory')
    return validate_name(name), url


def page_limit(raw: str | None) -> int | None:
    """``GET /models?limit=N``: an integer, or None when absent (the registry checks its range)."""
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise errors.InvalidRequest(f"limit must be an integer, got {raw!r}") from None


def invocations_target(target_model_header: str | None) -> str:
    """``POST /invocations``: the target model header's name, else the single model's."""
    if target_model_header:
        return validate_name(target_model_header)
    return SINGLE_MODEL_NAME


async def read_json_object(call: Call, *, empty_allowed: bool = False) -> dict:
    """The body as a JSON object of at most :data:`MAX_JSON_OBJECT_BYTES`; ``{}`` for an
    empty body when ``empty_allowed``."""
    check_json_object_size(call.content_length)
    return parse_json_object(await call.read_body(MAX_JSON_OBJECT_BYTES),
                             empty_allowed=empty_allowed)
