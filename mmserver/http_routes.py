"""What every route module shares: the :class:`Route` record, the application's keys, body readers.

``app`` (SageMaker's routes) and ``http_v2`` (the Open Inference Protocol's)
each declare their routes as :class:`Route` records and reach the registry,
the pipeline and the settings through these keys; ``app.create_app`` adds
every route to one application on one port. A route's ``protocol`` tells
``http_errors`` which error body and status codes its errors get.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable

from aiohttp import web

from mmserver import errors
from mmserver.config import Settings
from mmserver.http_errors import SAGEMAKER
from mmserver.metrics import Metrics
from mmserver.pipeline import InvocationPipeline, check_payload_size
from mmserver.registry import ModelRegistry

SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", ModelRegistry)
METRICS = web.AppKey("metrics", Metrics)
PIPELINE = web.AppKey("pipeline", InvocationPipeline)

#: Management requests are small JSON objects; anything larger is not one.
MAX_JSON_OBJECT_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    #: With MMSERVER_MANAGEMENT_TOKEN set, the route needs "Authorization: Bearer <token>".
    #: Invocations, health and metrics stay open: SageMaker authenticates callers in front
    #: of the container, and only it manages models.
    management: bool = False
    #: Which protocol's error shape the route answers with (``http_errors``).
    protocol: str = SAGEMAKER


async def read_json_object(request: web.Request, *, empty_allowed: bool = False) -> dict:
    """The body as a JSON object of at most :data:`MAX_JSON_OBJECT_BYTES`; ``{}`` for an
    empty body when ``empty_allowed``."""
    if request.content_length is not None and request.content_length > MAX_JSON_OBJECT_BYTES:
        raise errors.PayloadTooLarge(f"this request's body is at most {MAX_JSON_OBJECT_BYTES} "
                                     "bytes")
    raw = await request.read()
    if empty_allowed and not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise errors.InvalidRequest(f"the body must be a JSON object: {error}") from None
    if not isinstance(body, dict):
        raise errors.InvalidRequest(f"the body must be a JSON object, got {type(body).__name__}")
    return body


async def read_body(request: web.Request, limit: int) -> bytes:
    """An invocation's body, at most ``limit`` bytes; a chunked body past it is 413 too."""
    if request.content_length is not None:  # already checked against the limit
        return await request.read()
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(256 * 1024):
        size += len(chunk)
        check_payload_size(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)
