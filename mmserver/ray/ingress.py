"""The Ray Serve ingress: ``http.table``'s routes on a cluster, a thin adapter like ``http.app``.

Serve's HTTP proxy hands each request to this deployment's ``__call__`` as a
Starlette request. The ingress matches it against the one route table with
Starlette's own router (``starlette.routing.Route``, which Ray ships), checks the
management token where the route's line says so, turns it into a
:class:`~mmserver.http.service.Call` for the route's operation (the same
``http.sagemaker`` and ``http.v2`` functions ``mmserver serve`` runs), over the
cluster's :class:`~mmserver.ray.service.ClusterService`, and answers the
:class:`~mmserver.http.service.Reply`, or the error in the route's protocol
(``http.errors``). A path no route matches is 404, and a method the path lacks 405
with ``Allow``, as aiohttp answers. Invocations are counted by the model hosts that
run them (``service``).

**"503 before the body" on a cluster.** Serve's proxy streams the body to this
replica; the ingress reads it (within the payload limit, 413 as it arrives, and
``MMSERVER_BODY_TIMEOUT``, 408) before any model host sees the request, because a
host is chosen by Serve's router and takes the body as an argument. So a full queue's
503 comes from the host after the body crossed the cluster once; only the checks on
headers (the token, ``Content-Length`` over the limit, an unknown route) answer
before a byte of the body is read.
"""

from __future__ import annotations

import asyncio
import logging

from ray.serve.handle import DeploymentHandle
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match
from starlette.routing import Route as StarletteRoute

from mmserver import errors
from mmserver.config import Settings
from mmserver.http import sagemaker, v2
from mmserver.http.errors import (
    INTERNAL_ERROR_MESSAGE,
    ErrorAnswer,
    check_bearer_token,
    domain_error_answer,
    error_answer,
)
from mmserver.http.service import Call, Reply
from mmserver.http.table import ROUTES, SAGEMAKER, V2, RouteSpec, is_v2_path
from mmserver.pipeline import read_chunks_within, read_within
from mmserver.ray.service import ClusterService

log = logging.getLogger(__name__)

#: Every operation of the table, by name: the same functions ``mmserver serve`` runs.
OPERATIONS = {**sagemaker.OPERATIONS, **v2.OPERATIONS}


def _unrouted(request: Request) -> Response:  # pragma: no cover - matching only
    raise AssertionError("the ingress dispatches itself")


#: The table's routes as Starlette's, for their path matching (``{name}`` as aiohttp spells it).
_MATCHERS = tuple((spec, StarletteRoute(spec.path, _unrouted, methods=[spec.method]))
                  for spec in ROUTES)


class Ingress:
    """The ingress deployment's replica: each HTTP request through ``http.table.ROUTES``."""

    def __init__(self, settings: Settings, hosts: DeploymentHandle,
                 registrations: DeploymentHandle):
        self.settings = settings
        self.service = ClusterService(settings, hosts, registrations)

    async def __call__(self, request: Request) -> Response:
        protocol = V2 if is_v2_path(request.url.path) else SAGEMAKER
        try:
            route, params = _match(request.scope, protocol)
            protocol = route.protocol
            if route.management and self.settings.management_token:
                check_bearer_token(request.headers.get("authorization"),
                                   self.settings.management_token)
            reply = await OPERATIONS[route.operation](self.service, self._call(request, params))
            return _response(reply)
        except _NoRoute as no_route:
            return _json(no_route.answer)
        except errors.MMServerError as error:
            return _json(domain_error_answer(error, protocol))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the server must answer, not die
            log.exception("unexpected error on %s %s", request.method, request.url.path)
            return _json(error_answer(500, INTERNAL_ERROR_MESSAGE, protocol=protocol))

    def _call(self, request: Request, params: dict[str, str]) -> Call:
        body_timeout = self.settings.body_timeout_seconds

        async def read_body(limit: int) -> bytes:
            return await read_within(read_chunks_within(request.stream(), limit), body_timeout)

        return Call(params=params, query=request.query_params, headers=request.headers,
                    content_length=_content_length(request), read_body=read_body)


def _match(scope: dict, protocol: str) -> tuple[RouteSpec, dict[str, str]]:
    """The table's first route for the request, and its path parameters; 405 with ``Allow``
    when only the method differs, else 404, as aiohttp answers."""
    allowed = []
    for spec, matcher in _MATCHERS:
        matched, child = matcher.matches(scope)
        if matched is Match.FULL:
            return spec, child["path_params"]
        if matched is Match.PARTIAL:
            allowed.extend(matcher.methods)
    if allowed:
        raise _NoRoute(error_answer(405, "Method Not Allowed", protocol=protocol,
                                    headers={"Allow": ",".join(sorted(set(allowed)))}))
    raise _NoRoute(error_answer(404, "Not Found", protocol=protocol))


class _NoRoute(Exception):
    """No route for the request: 404, or 405 with ``Allow``, as aiohttp answers."""

    def __init__(self, answer: ErrorAnswer):
        super().__init__(answer.status)
        self.answer = answer


def _content_length(request: Request) -> int | None:
    raw = request.headers.get("content-length")
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        raise errors.InvalidRequest(f"Content-Length must be an integer, got {raw!r}") from None


def _response(reply: Reply) -> Response:
    return Response(reply.body, status_code=reply.status, headers=reply.all_headers())


def _json(answer: ErrorAnswer) -> Response:
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)
