"""What every route module shares: the :class:`Route` record, the application's keys, body readers.

``app`` (SageMaker's routes) and ``http.v2`` (the Open Inference Protocol's)
each declare their routes as :class:`Route` records and reach the registry,
the pipeline and the settings through these keys; ``app.create_app`` adds
every route to one application on one port. A route's ``protocol`` tells
``http.errors`` which error body and status codes its errors get.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from aiohttp import web

from mmserver.config import Settings
from mmserver.http.errors import SAGEMAKER
from mmserver.http.requests import check_json_object_size, parse_json_object
from mmserver.metrics import Metrics
from mmserver.pipeline import InvocationPipeline, read_chunks_within
from mmserver.registry import ModelRegistry

SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", ModelRegistry)
METRICS = web.AppKey("metrics", Metrics)
PIPELINE = web.AppKey("pipeline", InvocationPipeline)


@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    #: With MMSERVER_MANAGEMENT_TOKEN set, the route needs "Authorization: Bearer <token>".
    #: Invocations, health and metrics stay open: SageMaker authenticates callers in front
    #: of the container, and only it manages models.
    management: bool = False
    #: Which protocol's error shape the route answers with (``http.errors``).
    protocol: str = SAGEMAKER
    #: For a route that invokes a model: which model a request names. The app then records
    #: the request under ``http.errors.INVOCATION``, so its answer is counted in the request
    #: metrics whatever it is; no handler has to remember to.
    invokes: Callable[[web.Request], str] | None = None


def model_in_path(request: web.Request) -> str:
    """The ``{name}`` of the route's path: the model a request to it invokes."""
    return request.match_info["name"]


async def read_json_object(request: web.Request, *, empty_allowed: bool = False) -> dict:
    """The body as a JSON object of at most :data:`~mmserver.http.requests.MAX_JSON_OBJECT_BYTES`; ``{}`` for an
    empty body when ``empty_allowed``."""
    check_json_object_size(request.content_length)
    return parse_json_object(await request.read(), empty_allowed=empty_allowed)


async def read_body(request: web.Request, limit: int) -> bytes:
    """An invocation's body, at most ``limit`` bytes; a chunked body past it is 413 too."""
    if request.content_length is not None:  # already checked against the limit
        return await request.read()
    return await read_chunks_within(request.content.iter_chunked(256 * 1024), limit)
