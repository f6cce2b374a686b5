"""Errors as HTTP answers, in one place: the status of each error class, and the body.

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
the order of a table never matters. The answer (status, body, headers) is plain
data (:func:`error_answer`, :func:`domain_error_answer`), and each host turns it
into its framework's response: ``http.app`` (aiohttp) and the Ray Serve ingress
(``mmserver.ray.ingress``) answer every error in exactly the same shape. Nothing
here imports a web framework.
"""

from __future__ import annotations

import dataclasses
import hmac
import math
from http import HTTPStatus

from mmserver import errors
from mmserver.http.table import SAGEMAKER, V2

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
    errors.EngineUnavailable: 503,
    errors.ShuttingDown: 503,
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
        headers = {"Retry-After": str(math.ceil(retry_after))}
    elif isinstance(error, errors.Unauthorized):
        headers = {"WWW-Authenticate": "Bearer"}
    return error_answer(status_for(error, protocol) or 500, str(error), type(error).__name__,
                        headers, protocol)


def check_bearer_token(authorization: str | None, token: str) -> None:
    """Raise :class:`~mmserver.errors.Unauthorized` unless ``authorization`` is
    ``Bearer <token>`` (compared in constant time)."""
    scheme, _, given = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                              token.encode()):
        raise errors.Unauthorized("loading and unloading models needs "
                                  "'Authorization: Bearer <MMSERVER_MANAGEMENT_TOKEN>'")
