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

and, on the same port, the Open Inference Protocol's ``/v2`` routes (``http.v2``),
which serve the same models through the same queues.

The routes, each with its operation, management flag and protocol, are the one
table of ``http.table``; this module holds SageMaker's handlers and builds the
application from that table, ``http.v2`` the v2 handlers, ``http.routes`` what the
handlers share, ``http.errors`` every exception to a status code and an error body
(in the shape of the route's protocol) and ``http.answers`` the camelCase answers.
Where SageMaker's contract is silent we follow AWS's multi-model-server.
"""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import hdrs, web

from mmserver.config import Settings
from mmserver.http import answers, v2
from mmserver.http.errors import answer_errors, counted_invocation, requires_token
from mmserver.http.requests import (
    CUSTOM_ATTRIBUTES_HEADER,
    SINGLE_MODEL_NAME,
    TARGET_MODEL_HEADER,
    invocations_target,
    load_request,
    page_limit,
)
from mmserver.http.routes import (
    METRICS,
    PIPELINE,
    REGISTRY,
    SETTINGS,
    read_body,
    read_json_object,
)
from mmserver.http.table import (
    NAME_IN_PATH,
    NAME_IN_TARGET_HEADER,
    ROUTES,
    SAGEMAKER,
    V2,
    is_v2_path,
)
from mmserver.loaded_model import LoadedModel
from mmserver.metrics import CONTENT_TYPE_LATEST, Metrics
from mmserver.pipeline import Invocation, InvocationPipeline, ToolkitWire
from mmserver.registry import ModelRegistry

__all__ = ["METRICS", "PIPELINE", "REGISTRY", "ROUTES", "SETTINGS", "Route", "create_app"]

log = logging.getLogger(__name__)

OPENAPI_FILE = Path(__file__).with_name("openapi.json")
#: After answering (413, 408) before a body was read, read and drop the rest for at most this
#: long, so a client still sending gets to read the answer; aiohttp's 10 s default would hold
#: a trickling client, and with it shutdown, past SageMaker's 30 s.
LINGERING_SECONDS = 2.0


# -- model management ---------------------------------------------------------

async def load_model(request: web.Request) -> web.Response:
    name, url = load_request(await read_json_object(request))
    model = await request.app[REGISTRY].load(name, url)
    return web.json_response(answers.loaded(model))


async def list_models(request: web.Request) -> web.Response:
    query = request.query
    page, token = request.app[REGISTRY].page(page_limit(query.get("limit")),
                                             query.get("next_page_token"))
    return web.json_response(answers.listed(page, token))


async def describe_model(request: web.Request) -> web.Response:
    info = request.app[REGISTRY].info(request.match_info["name"])
    return web.json_response(answers.described(info))


async def unload_model(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    await request.app[REGISTRY].unload(name)
    return web.json_response(answers.unloaded(name))


# -- invocation -----------------------------------------------------------------

async def invoke(request: web.Request) -> web.Response:
    """``POST /models/{name}/invoke`` and ``POST /invocations``: one handler, no extra await.

    Errors are answered (and the request counted) by ``http.errors.answer_errors``.
    """
    name = request.match_info.get("name") or _invocations_target(request)
    app = request.app
    model = app[REGISTRY].get(name)
    answer = await app[PIPELINE].run(model, _invocation(request, app[SETTINGS], model))
    return web.Response(body=answer.body, content_type=answer.content_type)


def _invocations_target(request: web.Request) -> str:
    return invocations_target(request.headers.get(TARGET_MODEL_HEADER))


def _invocation(request: web.Request, settings: Settings, model: LoadedModel) -> Invocation:
    headers = request.headers
    wire = ToolkitWire.for_request(model, headers.get(hdrs.CONTENT_TYPE),
                                   headers.get(hdrs.ACCEPT),
                                   headers.get(CUSTOM_ATTRIBUTES_HEADER), settings.default_accept)
    return Invocation(wire=wire,
                      content_length=request.content_length,
                      read_body=lambda limit: read_body(request, limit),
                      body_arrived=request.content.is_eof())


# -- health and metrics -----------------------------------------------------------

async def ping(request: web.Request) -> web.Response:
    return web.json_response(answers.healthy())


async def openapi(request: web.Request) -> web.Response:
    """The OpenAPI description of these routes, shipped with the package."""
    return web.Response(body=OPENAPI_FILE.read_bytes(), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=request.app[METRICS].exposition(),
                        headers={hdrs.CONTENT_TYPE: CONTENT_TYPE_LATEST})


# -- the application ----------------------------------------------------------------

#: The handler of each operation of ``http.table.ROUTES``: every one is served here.
HANDLERS = {handler.__name__: handler for handler in (
    load_model, list_models, describe_model, unload_model, invoke, ping, metrics, openapi)}
HANDLERS.update(v2.HANDLERS)
#: Where an invoking route's model name is, by the table's word for it.
MODEL_NAME = {NAME_IN_PATH: lambda request: request.match_info["name"],
              NAME_IN_TARGET_HEADER: _invocations_target}


def create_app(settings: Settings | None = None) -> web.Application:
    """Build the application; models in ``settings.preload`` load at start-up."""
    settings = settings or Settings.from_env()
    metrics_ = Metrics()
    protocols: dict[object, str] = {}
    app = web.Application(middlewares=[answer_errors(metrics_.request_done,
                                                     _protocol_of(protocols))],
                          client_max_size=settings.max_payload_bytes + 1,
                          handler_args={"lingering_time": LINGERING_SECONDS})
    app[SETTINGS] = settings
    app[PIPELINE] = InvocationPipeline(settings)
    app[METRICS] = metrics_
    app[REGISTRY] = ModelRegistry(settings, on_loaded=metrics_.model_loaded,
                                  on_unloaded=metrics_.model_unloaded)
    for route in ROUTES:
        handler = HANDLERS[route.operation]
        if route.invokes is not None:
            handler = counted_invocation(handler, MODEL_NAME[route.invokes])
        if route.management and settings.management_token:
            handler = requires_token(handler, settings.management_token)
        if route.method == "GET":  # HEAD too, as aiohttp's add_get does
            added = app.router.add_get(route.path, handler)
        else:
            added = app.router.add_route(route.method, route.path, handler)
        protocols[added.resource] = route.protocol
    app.on_startup.append(_preload)
    app.on_shutdown.append(_drain)
    return app


def _protocol_of(protocols: dict[object, str]):
    """Which protocol a request speaks: its route's, else (no route matched) its path's."""

    def protocol_of(request: web.Request) -> str:
        protocol = protocols.get(request.match_info.route.resource)
        if protocol is not None:
            return protocol
        return V2 if is_v2_path(request.path) else SAGEMAKER
    return protocol_of


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
