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

This is the only module that knows status codes: it maps the package's
domain errors to them and answers every error as
``{"code": N, "type": "...", "message": "..."}`` (the MMS/TorchServe shape).
Where SageMaker's contract is silent we follow AWS's multi-model-server.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import time
from http import HTTPStatus
from pathlib import Path

from aiohttp import hdrs, web

from mmserver import codecs, errors
from mmserver.config import Settings
from mmserver.handlers import RequestContext
from mmserver.metrics import CONTENT_TYPE_LATEST, Metrics
from mmserver.pipeline import Invocation, InvocationPipeline
from mmserver.registry import ModelRegistry, validate_name

log = logging.getLogger(__name__)

#: Status code per error class. A raised error takes the entry of the nearest class in its
#: hierarchy (as Starlette looks up exception handlers), so the order here does not matter.
STATUS_BY_ERROR: dict[type[BaseException], int] = {
    errors.InvalidRequest: 400,
    errors.InvalidInput: 400,
    errors.InvalidModelArtifact: 400,
    errors.Unauthorized: 401,
    errors.ModelUrlNotFound: 404,
    errors.ModelNotFound: 404,
    errors.RunnerClosed: 404,
    errors.NotAcceptable: 406,
    errors.BodyTimeout: 408,
    errors.ModelAlreadyLoaded: 409,
    errors.ModelLoading: 409,
    errors.PayloadTooLarge: 413,
    errors.UnsupportedContentType: 415,
    errors.ModelError: 500,
    errors.QueueFull: 503,
    errors.ModelUnhealthy: 503,
    errors.InvocationTimeout: 504,
    errors.LoadTimeout: 504,
    errors.InsufficientResources: 507,
    errors.ModelOutOfMemory: 507,
}

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


def error_response(status: int, message: str, error_type: str | None = None,
                   headers: dict | None = None) -> web.Response:
    body = {"code": status, "type": error_type or _reason(status), "message": message}
    return web.json_response(body, status=status, headers=headers)


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase.replace(" ", "")
    except ValueError:
        return "Error"


def status_for(error: BaseException) -> int | None:
    """The status of the nearest class of ``error`` that has one; None for a foreign error."""
    for cls in type(error).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return None


@web.middleware
async def errors_as_json(request: web.Request, handler):
    """Every error leaves as JSON; unexpected ones are logged and answered 500."""
    try:
        return await handler(request)
    except web.HTTPException as http_error:
        if http_error.status < 400:
            raise
        return error_response(http_error.status, http_error.reason or _reason(http_error.status),
                              headers={k: v for k, v in http_error.headers.items()
                                       if k in (hdrs.ALLOW,)})
    except errors.MMServerError as error:
        return _domain_error_response(error)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - the server must answer, not die
        log.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "internal server error; see the server log")


def _domain_error_response(error: BaseException) -> web.Response:
    status = status_for(error) or 500
    headers = None
    if isinstance(error, errors.QueueFull):
        headers = {hdrs.RETRY_AFTER: str(math.ceil(error.retry_after_seconds))}
    elif isinstance(error, errors.Unauthorized):
        headers = {hdrs.WWW_AUTHENTICATE: "Bearer"}
    return error_response(status, str(error), type(error).__name__, headers)


@web.middleware
async def management_token_required(request: web.Request, handler):
    """With MMSERVER_MANAGEMENT_TOKEN set, loading and unloading need the bearer token.

    Invocations, /ping, /invocations and /metrics stay open: SageMaker authenticates
    callers in front of the container, and only it manages models.
    """
    token = request.app[SETTINGS].management_token
    if _is_management(request):
        scheme, _, given = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                  token.encode()):
            raise errors.Unauthorized("loading and unloading models needs "
                                      "'Authorization: Bearer <MMSERVER_MANAGEMENT_TOKEN>'")
    return await handler(request)


def _is_management(request: web.Request) -> bool:
    if request.method == "POST":
        return request.path.rstrip("/") == "/models"
    return request.method == "DELETE" and request.path.startswith("/models/")


# -- model management ---------------------------------------------------------

async def load_model(request: web.Request) -> web.Response:
    body = await _read_json_object(request)
    name, url = body.get("model_name"), body.get("url")
    if not isinstance(name, str) or not name:
        raise errors.InvalidRequest('the body needs "model_name": a string')
    if not isinstance(url, str) or not url:
        raise errors.InvalidRequest('the body needs "url": the path of the model directory')
    entry = await request.app[REGISTRY].load(name, url)
    return web.json_response({"status": f"model {name!r} loaded", "modelName": entry.name,
                              "modelUrl": entry.url})


async def list_models(request: web.Request) -> web.Response:
    query = request.query
    limit = None
    if "limit" in query:
        try:
            limit = int(query["limit"])
        except ValueError:
            raise errors.InvalidRequest(f"limit must be an integer, got {query['limit']!r}") from None
    page, token = request.app[REGISTRY].page(limit, query.get("next_page_token"))
    body: dict = {"models": [{"modelName": e.name, "modelUrl": e.url} for e in page]}
    if token is not None:
        body["nextPageToken"] = token
    return web.json_response(body)


async def describe_model(request: web.Request) -> web.Response:
    entry = request.app[REGISTRY].find(request.match_info["name"])
    return web.json_response(entry.describe())


async def unload_model(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    await request.app[REGISTRY].unload(name)
    return web.json_response({"status": f"model {name!r} unloaded", "modelName": name})


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
    """``POST /models/{name}/invoke`` and ``POST /invocations``: one handler, no extra await."""
    started = time.perf_counter()
    name = request.match_info.get("name")
    if name is None:
        name = _invocations_target(request)
    app = request.app
    try:
        entry = app[REGISTRY].get(name)
        answer = await app[PIPELINE].run(entry, _invocation(request, app[SETTINGS], name))
        response = web.Response(body=answer.body, content_type=answer.content_type)
    except errors.MMServerError as error:
        response = _domain_error_response(error)
        _log_failed_invocation(name, response.status, error)
    except Exception:  # noqa: BLE001 - a bug of ours: answered, counted and logged in full
        log.exception("model=%s unexpected error on invoke", name)
        response = error_response(500, "internal server error; see the server log")
    # names that are not loaded are counted under one label, so /metrics cannot grow for ever
    app[METRICS].request_done(name, response.status, time.perf_counter() - started)
    return response


def _invocations_target(request: web.Request) -> str:
    """``/invocations``: the target model header's name, else the single model's."""
    target = request.headers.get(TARGET_MODEL_HEADER)
    if target:
        validate_name(target)
        return target
    return SINGLE_MODEL_NAME


def _invocation(request: web.Request, settings: Settings, name: str) -> Invocation:
    headers = request.headers
    accept = headers.get(hdrs.ACCEPT, "")
    if not accept.strip() or accept.strip() == "*/*":
        accept = settings.default_accept
    context = RequestContext(
        model_name=name,
        content_type=headers.get(hdrs.CONTENT_TYPE, codecs.DEFAULT_TYPE),
        accept=accept,
        custom_attributes=headers.get(CUSTOM_ATTRIBUTES_HEADER),
    )
    return Invocation(context=context, content_length=request.content_length,
                      read_body=lambda limit: _read_body(request, limit),
                      body_arrived=request.content.is_eof())


def _log_failed_invocation(name: str, status: int, error: BaseException) -> None:
    """One line per failure; the full chain of a server-side error only at debug level."""
    if status >= 500 and status != 503:  # shedding load is routine
        log.warning("model=%s invoke answered %d: %s", name, status, error)
        log.debug("model=%s cause of the %d", name, status, exc_info=error)
    else:
        log.debug("model=%s invoke answered %d: %s", name, status, error)


async def _read_body(request: web.Request, limit: int) -> bytes:
    """Read at most ``limit`` bytes; a chunked body past it is 413 too."""
    if request.content_length is not None:  # already checked against the limit
        return await request.read()
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(256 * 1024):
        size += len(chunk)
        if size > limit:
            raise errors.PayloadTooLarge(f"the body exceeds the limit of {limit} bytes "
                                         "(SAGEMAKER_MAX_PAYLOAD_IN_MB)")
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

def create_app(settings: Settings | None = None) -> web.Application:
    """Build the application; models in ``settings.preload`` load at start-up."""
    settings = settings or Settings.from_env()
    middlewares = [errors_as_json]
    if settings.management_token:  # no middleware on every request when there is no token
        middlewares.append(management_token_required)
    app = web.Application(middlewares=middlewares,
                          client_max_size=settings.max_payload_bytes + 1,
                          handler_args={"lingering_time": LINGERING_SECONDS})
    app[SETTINGS] = settings
    app[PIPELINE] = InvocationPipeline(settings)
    app[METRICS] = metrics_ = Metrics()
    app[REGISTRY] = ModelRegistry(settings, on_loaded=metrics_.model_loaded,
                                  on_unloaded=metrics_.model_unloaded)
    app.router.add_post("/models", load_model)
    app.router.add_get("/models", list_models)
    app.router.add_get("/models/{name}", describe_model)
    app.router.add_delete("/models/{name}", unload_model)
    app.router.add_post("/models/{name}/invoke", invoke)
    app.router.add_post("/invocations", invoke)
    app.router.add_get("/ping", ping)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
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
