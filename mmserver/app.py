"""The aiohttp application: SageMaker's multi-model contract over HTTP.

Routes (docs/design.md section 4)::

    POST   /models                  load {"model_name", "url"}
    GET    /models                  list, ?limit=N&next_page_token=T
    GET    /models/{name}           describe
    DELETE /models/{name}           unload after accepted requests finish
    POST   /models/{name}/invoke    run the model on the body
    POST   /invocations             single-model mode (or X-Amzn-SageMaker-Target-Model)
    GET    /ping                    health
    GET    /metrics                 Prometheus text format

The HTTP layer is this module (routes and their handlers), ``http_errors``
(every exception to a status code and a JSON body) and ``http_answers`` (the
camelCase answers). Each route declares here whether it needs the management
token. Where SageMaker's contract is silent we follow AWS's multi-model-server.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import hdrs, web

from mmserver import errors, http_answers
from mmserver.config import Settings
from mmserver.http_errors import INVOCATION, answer_errors, requires_token
from mmserver.metrics import CONTENT_TYPE_LATEST, Metrics
from mmserver.pipeline import Invocation, InvocationPipeline, check_payload_size
from mmserver.registry import ModelRegistry, validate_name
from mmserver.toolkit import RequestContext

log = logging.getLogger(__name__)

TARGET_MODEL_HEADER = "X-Amzn-SageMaker-Target-Model"
OPENAPI_FILE = Path(__file__).with_name("openapi.json")
#: After answering (413, 408) before a body was read, read and drop the rest for at most this
#: long, so a client still sending gets to read the answer; aiohttp's 10 s default would hold
#: a trickling client, and with it shutdown, past SageMaker's 30 s.
LINGERING_SECONDS = 2.0
CUSTOM_ATTRIBUTES_HEADER = "X-Amzn-SageMaker-Custom-Attributes"
#: Name the single model of single-model mode is registered under.
SINGLE_MODEL_NAME = "model"
#: Load requests are small JSON objects; anything larger is not one.
MAX_LOAD_BODY_BYTES = 64 * 1024

SETTINGS = web.AppKey("settings", Settings)
REGISTRY = web.AppKey("registry", ModelRegistry)
METRICS = web.AppKey("metrics", Metrics)
PIPELINE = web.AppKey("pipeline", InvocationPipeline)


# -- model management ---------------------------------------------------------

async def load_model(request: web.Request) -> web.Response:
    body = await _read_json_object(request)
    name, url = body.get("model_name"), body.get("url")
    if not isinstance(name, str) or not name:
        raise errors.InvalidRequest('the body needs "model_name": a string')
    if not isinstance(url, str) or not url:
        raise errors.InvalidRequest('the body needs "url": the path of the model directory')
    model = await request.app[REGISTRY].load(name, url)
    return web.json_response(http_answers.loaded(model))


async def list_models(request: web.Request) -> web.Response:
    query = request.query
    limit = None
    if "limit" in query:
        try:
            limit = int(query["limit"])
        except ValueError:
            raise errors.InvalidRequest(f"limit must be an integer, got {query['limit']!r}") from None
    page, token = request.app[REGISTRY].page(limit, query.get("next_page_token"))
    return web.json_response(http_answers.listed(page, token))


async def describe_model(request: web.Request) -> web.Response:
    info = request.app[REGISTRY].info(request.match_info["name"])
    return web.json_response(http_answers.described(info))


async def unload_model(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    await request.app[REGISTRY].unload(name)
    return web.json_response(http_answers.unloaded(name))


async def _read_json_object(request: web.Request) -> dict:
    if request.content_length is not None and request.content_length > MAX_LOAD_BODY_BYTES:
        raise errors.PayloadTooLarge(f"a load request is at most {MAX_LOAD_BODY_BYTES} bytes")
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise errors.InvalidRequest(f"the body must be a JSON object: {error}") from None
    if not isinstance(body, dict):
        raise errors.InvalidRequest(f"the body must be a JSON object, got {type(body).__name__}")
    return body


# -- invocation -----------------------------------------------------------------

async def invoke(request: web.Request) -> web.Response:
    """``POST /models/{name}/invoke`` and ``POST /invocations``: one handler, no extra await.

    Errors are answered (and the request counted) by ``http_errors.answer_errors``.
    """
    started = time.perf_counter()
    name = request.match_info.get("name")
    if name is None:
        name = _invocations_target(request)
    request[INVOCATION] = (name, started)
    app = request.app
    model = app[REGISTRY].get(name)
    answer = await app[PIPELINE].run(model, _invocation(request, app[SETTINGS], name))
    return web.Response(body=answer.body, content_type=answer.content_type)


def _invocations_target(request: web.Request) -> str:
    """``/invocations``: the target model header's name, else the single model's."""
    target = request.headers.get(TARGET_MODEL_HEADER)
    if target:
        validate_name(target)
        return target
    return SINGLE_MODEL_NAME


def _invocation(request: web.Request, settings: Settings, name: str) -> Invocation:
    headers = request.headers
    context = RequestContext.from_headers(
        name, headers.get(hdrs.CONTENT_TYPE), headers.get(hdrs.ACCEPT),
        headers.get(CUSTOM_ATTRIBUTES_HEADER), settings.default_accept)
    return Invocation(context=context, content_length=request.content_length,
                      read_body=lambda limit: _read_body(request, limit),
                      body_arrived=request.content.is_eof())


async def _read_body(request: web.Request, limit: int) -> bytes:
    """Read at most ``limit`` bytes; a chunked body past it is 413 too."""
    if request.content_length is not None:  # already checked against the limit
        return await request.read()
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(256 * 1024):
        size += len(chunk)
        check_payload_size(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


# -- health and metrics -----------------------------------------------------------

async def ping(request: web.Request) -> web.Response:
    return web.json_response({"status": "Healthy"})


async def openapi(request: web.Request) -> web.Response:
    """The OpenAPI description of these routes, shipped with the package."""
    return web.Response(body=OPENAPI_FILE.read_bytes(), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].exposition(),
                        headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST})


# -- the application ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    #: With MMSERVER_MANAGEMENT_TOKEN set, the route needs "Authorization: Bearer <token>".
    #: Invocations, /ping and /metrics stay open: SageMaker authenticates callers in front of
    #: the container, and only it manages models.
    management: bool = False


ROUTES = (
    Route("POST", "/models", load_model, management=True),
    Route("GET", "/models", list_models),
    Route("GET", "/models/{name}", describe_model),
    Route("DELETE", "/models/{name}", unload_model, management=True),
    Route("POST", "/models/{name}/invoke", invoke),
    Route("POST", "/invocations", invoke),
    Route("GET", "/ping", ping),
    Route("GET", "/metrics", metrics),
    Route("GET", "/openapi.json", openapi),
)


def create_app(settings: Settings | None = None) -> web.Application:
    """Build the application; models in ``settings.preload`` load at start-up."""
    settings = settings or Settings.from_env()
    metrics_ = Metrics()
    app = web.Application(middlewares=[answer_errors(metrics_.request_done)],
                          client_max_size=settings.max_payload_bytes + 1,
                          handler_args={"lingering_time": LINGERING_SECONDS})
    app[SETTINGS] = settings
    app[PIPELINE] = InvocationPipeline(settings)
    app[METRICS] = metrics_
    app[REGISTRY] = ModelRegistry(settings, on_loaded=metrics_.model_loaded,
                                  on_unloaded=metrics_.model_unloaded)
    for route in ROUTES:
        handler = route.handler
        if route.management and settings.management_token:
            handler = requires_token(handler, settings.management_token)
        if route.method == "GET":  # HEAD too, as aiohttp's add_get does
            app.router.add_get(route.path, handler)
        else:
            app.router.add_route(route.method, route.path, handler)
    app.on_startup.append(_preload)
    app.on_shutdown.append(_drain)
    return app


async def _preload(app: web.Application) -> None:
    settings, registry = app[SETTINGS], app[REGISTRY]
    if not settings.multi_model:
        await registry.load_single(SINGLE_MODEL_NAME, settings.single_model_dir)
    for name, url in settings.preload:
        await registry.load(name, url)


async def _drain(app: web.Application) -> None:
    """SIGTERM: answer accepted requests, leaving time to exit before SageMaker's SIGKILL."""
    await app[REGISTRY].close(drain_timeout=max(1.0, app[SETTINGS].shutdown_timeout_seconds - 5))
    app[PIPELINE].close()
