"""The aiohttp host: every route of ``http.table`` in one application on one port.

``mmserver serve`` runs this application over a :class:`~mmserver.http.local.LocalService`
(the models of this process). It is a thin adapter: each aiohttp request becomes a
:class:`~mmserver.http.service.Call` for the route's operation (``http.sagemaker``,
``http.v2``), and its :class:`~mmserver.http.service.Reply` an aiohttp response. What
comes with a route's line of the table is added here, once per route: the management
token, and the invocation count (each request of an invoking route is counted in the
request metrics with the status it was answered, whatever raised). One middleware
answers every exception in the route's protocol (``http.errors``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import hdrs, web

from mmserver import heap
from mmserver.config import Settings
from mmserver.errors import MMServerError, Unavailable
from mmserver.http import sagemaker, v2
from mmserver.http.errors import (
    INTERNAL_ERROR_MESSAGE,
    ErrorAnswer,
    check_bearer_token,
    domain_error_answer,
    error_answer,
    reason,
)
from mmserver.http.local import LocalService
from mmserver.http.service import Call, ModelService, Reply
from mmserver.http.table import ROUTES, SAGEMAKER, V2, RouteSpec, is_v2_path
from mmserver.pipeline import read_chunks_within

__all__ = ["SERVICE", "create_app"]

log = logging.getLogger(__name__)

class HostedService(ModelService, Protocol):
    """A service this host can run: the operations, and its life and request counts."""

    async def start(self) -> None:
        """Before the first request (``LocalService`` loads the preloaded models)."""

    async def close(self) -> None:
        """On SIGTERM, after the last request."""

    def count_invocation(self, name: str, status: int, seconds: float,
                         unavailable: Unavailable | None = None) -> None:
        """One invocation answered, with its status and seconds (and a 503's reason)."""


SERVICE = web.AppKey("service", HostedService)
#: With ``--http-workers``: which worker answered (``mmserver.engine``).
WORKER_HEADER = "X-Mmserver-Worker"
#: After answering (413, 408) before a body was read, read and drop the rest for at most this
#: long, so a client still sending gets to read the answer; aiohttp's 10 s default would hold
#: a trickling client, and with it shutdown, past SageMaker's 30 s.
LINGERING_SECONDS = 2.0
#: Every operation of the table, by name.
OPERATIONS = {**sagemaker.OPERATIONS, **v2.OPERATIONS}
#: The request key under which an invocation records (model name, start time) for the count.
INVOCATION = web.RequestKey("mmserver.invocation", tuple)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(settings: Settings | None = None, service: HostedService | None = None,
               worker: int | None = None) -> web.Application:
    """Build the application over ``service`` (this process's models by default, whose
    ``settings.preload`` load at start-up); ``worker`` names the HTTP worker in each answer
    (:data:`WORKER_HEADER`)."""
    settings = settings or Settings.from_env()
    service = service or LocalService(settings)
    protocols: dict[object, str] = {}
    app = web.Application(middlewares=[_answer_errors(service.count_invocation,
                                                      _protocol_of(protocols))],
                          client_max_size=settings.max_payload_bytes + 1,
                          handler_args={"lingering_time": LINGERING_SECONDS})
    app[SERVICE] = service
    for route in ROUTES:
        handler = _handler(route, service)
        if route.management and settings.management_token:
            handler = _requires_token(handler, settings.management_token)
        if route.method == "GET":  # HEAD too, as aiohttp's add_get does
            added = app.router.add_get(route.path, handler)
        else:
            added = app.router.add_route(route.method, route.path, handler)
        protocols[added.resource] = route.protocol
    app.on_startup.append(_start)
    app.on_shutdown.append(_drain)
    if worker is not None:
        app.on_response_prepare.append(_named_worker(str(worker)))
    return app


def _named_worker(worker: str):
    async def name_worker(request: web.Request, response: web.StreamResponse) -> None:
        response.headers[WORKER_HEADER] = worker
    return name_worker


def _handler(route: RouteSpec, service: HostedService) -> Handler:
    """The aiohttp handler of ``route``: its operation over ``service``, counted if it
    invokes."""
    operation = OPERATIONS[route.operation]

    async def handler(request: web.Request) -> web.StreamResponse:
        return _response(await operation(service, _call(request)))

    if route.invokes is None:
        return handler

    async def counted(request: web.Request) -> web.StreamResponse:
        call = _call(request)
        request[INVOCATION] = (sagemaker.invoked_model(call), time.perf_counter())
        return _response(await operation(service, call))

    return counted


def _call(request: web.Request) -> Call:
    return Call(params=request.match_info, query=request.query, headers=request.headers,
                content_length=request.content_length,
                read_body=lambda limit: _read_body(request, limit),
                body_arrived=request.content.is_eof())


async def _read_body(request: web.Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes; a chunked body past it is 413 as it arrives."""
    if request.content_length is not None:  # the operation checked it against its limit
        return await request.read()
    return await read_chunks_within(request.content.iter_chunked(256 * 1024), limit)


def _response(reply: Reply) -> web.Response:
    return web.Response(status=reply.status, body=reply.body or None,
                        headers=reply.all_headers())


def _error_response(answer: ErrorAnswer) -> web.Response:
    return web.json_response(answer.body, status=answer.status, headers=answer.headers)


def _requires_token(handler: Handler, token: str) -> Handler:
    """``handler`` behind ``Authorization: Bearer <token>`` (401 otherwise)."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        check_bearer_token(request.headers.get(hdrs.AUTHORIZATION), token)
        return await handler(request)

    return guarded


def _answer_errors(on_invocation: Callable[[str, int, float, Unavailable | None], None],
                   protocol_of: Callable[[web.Request], str]):
    """The middleware that turns every exception into a JSON answer in the request's protocol,
    and calls ``on_invocation(model_name, status, seconds, unavailable)`` for each request
    that recorded itself under :data:`INVOCATION`, with the status it was answered and, for
    a 503, why."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        error = None
        try:
            response = await handler(request)
        except web.HTTPException as http_error:
            if http_error.status < 400:
                raise
            response = _error_response(error_answer(
                http_error.status, http_error.reason or reason(http_error.status),
                headers={k: v for k, v in http_error.headers.items() if k in (hdrs.ALLOW,)},
                protocol=protocol_of(request)))
        except MMServerError as domain_error:
            error = domain_error
            response = _error_response(domain_error_answer(domain_error, protocol_of(request)))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the server must answer, not die
            log.exception("unexpected error on %s %s", request.method, request.path)
            response = _error_response(error_answer(500, INTERNAL_ERROR_MESSAGE,
                                                    protocol=protocol_of(request)))
        invocation = request.get(INVOCATION)
        if invocation is not None:
            name, started = invocation
            unavailable = None
            if error is not None:
                _log_failed_invocation(name, response.status, error)
                if response.status == 503:
                    unavailable = error.unavailable
            on_invocation(name, response.status, time.perf_counter() - started, unavailable)
        return response

    return middleware


def _log_failed_invocation(name: str, status: int, error: MMServerError) -> None:
    """One line per failure; the full chain of a server-side error only at debug level. A 503
    names its reason; shedding load (a full queue) is routine and logged at debug level."""
    if status == 503:
        level = logging.DEBUG if error.unavailable == Unavailable.QUEUE_FULL else logging.INFO
        log.log(level, "model=%s invoke answered 503 (%s): %s", name, error.unavailable, error)
    elif status >= 500:
        log.warning("model=%s invoke answered %d: %s", name, status, error)
        log.debug("model=%s cause of the %d", name, status, exc_info=error)
    else:
        log.debug("model=%s invoke answered %d: %s", name, status, error)


def _protocol_of(protocols: dict[object, str]):
    """Which protocol a request speaks: its route's, else (no route matched) its path's."""

    def protocol_of(request: web.Request) -> str:
        protocol = protocols.get(request.match_info.route.resource)
        if protocol is not None:
            return protocol
        return V2 if is_v2_path(request.path) else SAGEMAKER
    return protocol_of


async def _start(app: web.Application) -> None:
    await app[SERVICE].start()
    heap.settle()


async def _drain(app: web.Application) -> None:
    await app[SERVICE].close()
