"""What the aiohttp handlers share: the application's keys and the body readers.

``http.app`` (SageMaker's routes) and ``http.v2`` (the Open Inference Protocol's)
reach the registry, the pipeline and the settings through these keys;
``http.app.create_app`` adds every route of ``http.table`` to one application on
one port.
"""

from __future__ import annotations

from aiohttp import web

from mmserver.config import Settings
from mmserver.http.requests import check_json_object_size, parse_json_object
from mmserver.metrics import Metrics
from mmserver.pipeline import InvocationPipeline, read_chunks_within
from mmserver.registry import ModelRegistry

SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", ModelRegistry)
METRICS = web.AppKey("metrics", Metrics)
PIPELINE = web.AppKey("pipeline", InvocationPipeline)


async def read_json_object(request: web.Request, *, empty_allowed: bool = False) -> dict:
    """The body as a JSON object of at most
    :data:`~mmserver.http.requests.MAX_JSON_OBJECT_BYTES`; ``{}`` for an empty body when
    ``empty_allowed``."""
    check_json_object_size(request.content_length)
    return parse_json_object(await request.read(), empty_allowed=empty_allowed)


async def read_body(request: web.Request, limit: int) -> bytes:
    """An invocation's body, at most ``limit`` bytes; a chunked body past it is 413 too."""
    if request.content_length is not None:  # already checked against the limit
        return await request.read()
    return await read_chunks_within(request.content.iter_chunked(256 * 1024), limit)
