"""Errors as HTTP answers, in one place: the status of each error class, the body, the middleware.

Two protocols share the port, and each route says which it speaks
(``http.table.RouteSpec.protocol``):

* SageMaker's routes answer ``{"code": N, "type": "...", "message": "..."}``
  (the MMS/TorchServe shape) with the status of :data:`STATUS_BY_ERROR`;
* the Open Inference Protocol's (``/v2``) answer ``{"error": "..."}``, and a
  client's mistake is 400 as in Triton: :data:`V2_STATUS_BY_ERROR` overrides
  the statuses that differ (unknown model 404 → 400, already loaded 409 → 400...).
  The rest (401, 408, 413, 500, 503 with ``Retry-After``, 504, 507) is shared.

An error takes the entry of the nearest class in its hierarchy (as Starlette
looks up exception handlers), a protocol's override first at each level, so
the order of a table never matters. :func:`answer_errors` is the one place
where an exception becomes an aiohttp response; it also counts and logs
invocations, whatever their answer. The answer itself (status, body, headers)
is plain data (:func:`error_answer`, :func:`domain_error_answer`), so another
HTTP host (the Ray Serve ingress, ``mmserver.ray.ingress``) answers errors in
exactly the same shape without aiohttp.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import math
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from aiohttp import hdrs, web

from mmserver import errors
from mmserver.http.table import SAGEMAKER, V2

log = logging.getLogger(__name__)

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
    errors.ReplicaUnavailable: 503,
    errors.NotServedByThisHost: 501,
    errors.InvocationTimeout: 504,
    errors.LoadTimeout: 504,
    errors.InsufficientResources: 507,
    errors.ModelOutOfMemory: 507,
}

#: Where the v2 protocol's status differs: Triton answers 400 for every mistake of the client.
V2_STATUS_BY_ERROR: dict[type[BaseException], int] = {
    errors.ModelNotFound: 400,
    errors.RunnerClosed: 400,
    errors.ModelUrlNotFound: 400,
    errors.ModelAlreadyLoaded: 400,
    errors.ModelLoading: 400,
    errors.NotAcceptable: 400,
    errors.UnsupportedContentType: 400,
}
_OVERRIDES = {SAGEMAKER: {}, V2: V2_STATUS_BY_ERROR}

#: What a server error tells the client; the cause goes to the log only.
INTERNAL_ERROR_MESSAGE = "internal server error; see the server log"

#: The request key under which an invocation records (model name, start time) for the count.
INVOCATION = web.RequestKey("mmserver.invocation", tuple)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def status_for(error: BaseException, protocol: str = SAGEMAKER) -> int | None:
    """The status of the nearest class of ``error`` that has one; None for a foreign error."""
    overrides = _OVERRIDES[protocol]
    for cls in type(error).__mro__:
        if cls in overrides:
            return overrides[cls]
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return None


@dataclasses.dataclass(frozen=True)
class ErrorAnswer:
    """An error as HTTP says it, before any framework: what every host sends alike."""

    status: int
    body: dict[str, object]
    headers: dict[str, str] | None = None


def error_answer(status: int, message: str, error_type: str | None = None,
                 headers: dict[str, str] | None = None,
                 protocol: str = SAGEMAKER) -> ErrorAnswer:
    """The body of an error in ``protocol``'s shape (``error_type`` defaults to the reason)."""
    if protocol == V2:
        body: dict[str, object] = {"error": message}
    else:
        body = {"code": status, "type": error_type or reason(status), "message": message}
    return ErrorAnswer(status, body, headers)


def reason(status: int) -> str:
    """The status's reason phrase without spaces (``NotFound``), MMS's error ``type``."""
    try:
        return HTTPStatus(status).phrase.replace(" ", "")
    except ValueError:
        return "Error"


def domain_error_answer(error: errors.MMServerError, protocol: str = SAGEMAKER) -> ErrorAnswer:
    """A domain error's status, body and headers (``Retry-After`` when it says when to retry)."""
    headers = None
    retry_after = getattr(error, "retry_after_seconds", None)
    if retry_after is not None:
        headers = {hdrs.RETRY_AFTER: str(math.ceil(retry_after))}
    elif isinstance(error, errors.Unauthorized):
        headers = {hdrs.WWW_AUTHENTICATE: "Bearer"}
    return error_answer(status_for(error, protocol) or 500, str(error), type(error).__name__,
                        headers, protocol)


def _json_response(answer: ErrorAnswer) -> web.Response:
    return web.json_response(answer.body, status=answer.status, headers=answer.headers)


def error_response(status: int, message: str, error_type: str | None = None,
                   headers: dict | None = None, protocol: str = SAGEMAKER) -> web.Response:
    return _json_response(error_answer(status, message, error_type, headers, protocol))


def domain_error_response(error: errors.MMServerError,
                          protocol: str = SAGEMAKER) -> web.Response:
    return _json_response(domain_error_answer(error, protocol))


def answer_errors(on_invocation: Callable[[str, int, float], None],
                  protocol_of: Callable[[web.Request], str] = lambda request: SAGEMAKER):
    """The middleware that turns every exception into a JSON answer.

    ``on_invocation(model_name, status, seconds)`` is called for each request that
    recorded itself under :data:`INVOCATION`, with the status it was answered.
    ``protocol_of(request)`` says which protocol's errors a request gets (unmatched
    paths included).
    """

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        error = None
        try:
            response = await handler(request)
        except web.HTTPException as http_error:
            if http_error.status < 400:
                raise
            response = error_response(
                http_error.status, http_error.reason or reason(http_error.status),
                headers={k: v for k, v in http_error.headers.items() if k in (hdrs.ALLOW,)},
                protocol=protocol_of(request))
        except errors.MMServerError as domain_error:
            error = domain_error
            response = domain_error_response(domain_error, protocol_of(request))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the server must answer, not die
            log.exception("unexpected error on %s %s", request.method, request.path)
            response = error_response(500, INTERNAL_ERROR_MESSAGE, protocol=protocol_of(request))
        invocation = request.get(INVOCATION)
        if invocation is not None:
            name, started = invocation
            if error is not None:
                _log_failed_invocation(name, response.status, error)
            on_invocation(name, response.status, time.perf_counter() - started)
        return response

    return middleware


def _log_failed_invocation(name: str, status: int, error: BaseException) -> None:
    """One line per failure; the full chain of a server-side error only at debug level."""
    if status >= 500 and status != 503:  # shedding load is routine
        log.warning("model=%s invoke answered %d: %s", name, status, error)
        log.debug("model=%s cause of the %d", name, status, exc_info=error)
    else:
        log.debug("model=%s invoke answered %d: %s", name, status, error)


def counted_invocation(handler: Handler, model_name: Callable[[web.Request], str]) -> Handler:
    """``handler``, each request recorded under :data:`INVOCATION` first (the model it names
    and when it arrived), so :func:`answer_errors` counts it with the status it gets."""

    async def counted(request: web.Request) -> web.StreamResponse:
        request[INVOCATION] = (model_name(request), time.perf_counter())
        return await handler(request)

    return counted


def requires_token(handler: Handler, token: str) -> Handler:
    """``handler`` behind ``Authorization: Bearer <token>`` (401 otherwise)."""

    async def guarded(request: web.Request) -> web.StreamResponse:
        check_bearer_token(request.headers.get(hdrs.AUTHORIZATION), token)
        return await handler(request)

    return guarded


def check_bearer_token(authorization: str | None, token: str) -> None:
    """Raise :class:`~mmserver.errors.Unauthorized` unless ``authorization`` is
    ``Bearer <token>`` (compared in constant time)."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                              token.encode()):
        raise errors.Unauthorized("loading and unloading models needs "
                                  "'Authorization: Bearer <MMSERVER_MANAGEMENT_TOKEN>'")
