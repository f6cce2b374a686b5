"""SageMaker's multi-model routes on a Ray cluster: the Serve ingress, part of the HTTP layer.

Serve's HTTP proxy hands each request to this deployment's ``__call__`` as a
Starlette request; the answer is a Starlette response. The routes, status
codes, error bodies and pagination are ``mmserver serve``'s (docs/design.md
section 4), built by the same functions: ``http.requests`` reads the bodies and
queries, ``http.answers`` writes the camelCase answers, ``http.errors`` turns a
domain error into its status, body and headers. What a cluster changes
(section 11):

* ``POST /models`` registers the name cluster-wide (``registrations``; 409 while
  it is taken) and loads the model once on one replica, so that a model which
  fits nowhere answers 507 at once and a bad artifact 400; the load answers
  once that replica holds it, and Serve's routers have had time to learn so
  (:data:`ROUTING_SETTLE_SECONDS`).
* ``POST /models/{name}/invoke`` goes to a replica chosen by Serve's router
  (one that holds the model if any) and carries :data:`~mmserver.ray.replicas.REPLICA_HEADER`
  and :data:`~mmserver.ray.replicas.LOADED_HEADER`. A replica that dies before answering
  is replaced by another once; a second loss answers 503 with ``Retry-After``.
* ``GET /models/{name}`` lists every replica holding the model (broadcast).
* ``DELETE /models/{name}`` unloads it on every replica (broadcast), each
  answering its accepted requests first, then frees the name.

The routes are ``http.table``'s, the same table ``mmserver serve`` answers, matched
by Starlette's router and guarded by the management token as the table says. The
operations a cluster does not serve yet (:data:`SERVED` lists those it does):
``/metrics`` (each replica's runners keep their statistics, shown per replica in
describe) and the ``/v2`` routes other than the health checks. They answer 501 in
their protocol's error shape, saying so, never a 404 that reads as a typo.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from importlib.resources import files
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.exceptions import ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match
from starlette.routing import Route as StarletteRoute

from mmserver import errors
from mmserver.config import Settings
from mmserver.http import answers
from mmserver.http.errors import (
    INTERNAL_ERROR_MESSAGE,
    ErrorAnswer,
    check_bearer_token,
    domain_error_answer,
    error_answer,
)
from mmserver.http.requests import (
    CUSTOM_ATTRIBUTES_HEADER,
    TARGET_MODEL_HEADER,
    check_json_object_size,
    invocations_target,
    load_request,
    page_limit,
    parse_json_object,
)
from mmserver.http.table import NAME_IN_PATH, ROUTES, SAGEMAKER, V2, RouteSpec, is_v2_path
from mmserver.loaded_model import NOT_LOADED
from mmserver.model_roots import ModelRoots
from mmserver.pipeline import check_payload_size, read_chunks_within, read_within
from mmserver.ray.host import Held, Invoked
from mmserver.ray.host import Request as HostRequest
from mmserver.ray.registrations import READY
from mmserver.ray.replicas import LOADED_HEADER, REPLICA_HEADER
from mmserver.ray.replies import unwrapped

log = logging.getLogger(__name__)

#: What a call to another deployment may take beyond the limit the callee keeps itself
#: (routing, a replica's start): past it the callee is taken for lost.
CALL_MARGIN_SECONDS = 10.0
#: Registrations answer from memory; a call slower than this means their replica is gone.
REGISTRY_CALL_SECONDS = 30.0
#: A load answers this long after the model is held: a replica reports the models it holds
#: to Serve's controller every 0.1 s, which passes them to the routers in its next loop, so
#: the next request finds the replica that loaded the model instead of loading it elsewhere.
ROUTING_SETTLE_SECONDS = 0.5
#: Times an invocation is sent again after its replica died before answering.
REPLICA_LOSS_RETRIES = 1
#: The errors that mean the replica never answered (it died, or cannot be reached).
REPLICA_LOST = (RayActorError, ReplicaUnavailableError)


#: The operations of ``http.table.ROUTES`` a cluster serves: each is a method of :class:`Ingress`.
SERVED = ("load_model", "list_models", "describe_model", "unload_model", "invoke", "ping",
          "openapi", "live", "ready")


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
        self.hosts = hosts
        self.registrations = registrations
        self.roots = ModelRoots(settings.model_roots)

    async def __call__(self, request: Request) -> Response:
        protocol = V2 if is_v2_path(request.url.path) else SAGEMAKER
        try:
            route, params = _match(request.scope, protocol)
            protocol = route.protocol
            if route.management and self.settings.management_token:
                check_bearer_token(request.headers.get("authorization"),
                                   self.settings.management_token)
            if route.operation not in SERVED:
                raise errors.NotServedByThisHost(
                    f"{route.method} {route.path} is not served on a Ray cluster yet; "
                    "mmserver serve answers it (see the README's Ray section)")
            return await getattr(self, route.operation)(request, route, **params)
        except _NoRoute as no_route:
            return _json(no_route.answer)
        except errors.MMServerError as error:
            return _json(domain_error_answer(error, protocol))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the server must answer, not die
            log.exception("unexpected error on %s %s", request.method, request.url.path)
            return _json(error_answer(500, INTERNAL_ERROR_MESSAGE, protocol=protocol))

    # -- model management --------------------------------------------------------

    async def load_model(self, request: Request, route: RouteSpec) -> Response:
        check_json_object_size(_content_length(request))
        body = await read_within(request.body(), self.settings.body_timeout_seconds)
        name, url = load_request(parse_json_object(body))
        self.roots.resolve(url)  # 404 or 400 before the name is taken; each host checks again
        registration = await self._registry(self.registrations.claim.remote(name, url))
        try:
            await _call(self.hosts.options(multiplexed_model_id=name).warm.remote(name),
                        self.settings.load_timeout_seconds + CALL_MARGIN_SECONDS,
                        lambda: errors.LoadTimeout(
                            f"loading model {name!r} took longer than "
                            f"{self.settings.load_timeout_seconds:g} s (MMSERVER_LOAD_TIMEOUT)"))
            registration = await self._registry(
                self.registrations.confirm.remote(name, registration.token))
            await asyncio.sleep(ROUTING_SETTLE_SECONDS)
        except BaseException:
            await asyncio.shield(self._release(name, registration.token))
            raise
        return JSONResponse(answers.loaded(registration))

    async def list_models(self, request: Request, route: RouteSpec) -> Response:
        query = request.query_params
        page, token = await self._registry(self.registrations.page.remote(
            page_limit(query.get("limit")), query.get("next_page_token")))
        return JSONResponse(answers.listed(page, token))

    async def describe_model(self, request: Request, route: RouteSpec, name: str) -> Response:
        registration = await self._registry(self.registrations.get.remote(name))
        holders: list[Held] = [held for held in await self._broadcast("holding", name)
                               if isinstance(held, Held)]
        status = registration.state
        if status == READY and not holders:
            status = NOT_LOADED
        return JSONResponse(answers.described_on_cluster(
            registration, status, [(held.replica, held.info) for held in holders]))

    async def unload_model(self, request: Request, route: RouteSpec, name: str) -> Response:
        registration = await self._registry(self.registrations.begin_unload.remote(name))
        try:
            await self._broadcast("drop", name)
        finally:
            await asyncio.shield(self._release(name, registration.token))
        return JSONResponse(answers.unloaded(name))

    # -- invocation ----------------------------------------------------------------

    async def invoke(self, request: Request, route: RouteSpec, name: str | None = None
                     ) -> Response:
        if route.invokes != NAME_IN_PATH:
            name = invocations_target(request.headers.get(TARGET_MODEL_HEADER))
        return await self._invoke(name, request)

    async def ping(self, request: Request, route: RouteSpec) -> Response:
        return JSONResponse(answers.healthy())

    async def live(self, request: Request, route: RouteSpec) -> Response:
        """``GET /v2/health/live``: 200 with no body, as on one machine."""
        return Response()

    ready = live

    async def openapi(self, request: Request, route: RouteSpec) -> Response:
        """The same OpenAPI description as ``mmserver serve``'s (the routes this cluster does
        not serve yet answer 501, saying so)."""
        return Response(files("mmserver.http").joinpath("openapi.json").read_bytes(),
                        media_type="application/json")

    async def _invoke(self, name: str, request: Request) -> Response:
        limit = self.settings.max_payload_bytes
        length = _content_length(request)
        if length is not None:
            check_payload_size(length, limit)
        body = await read_within(read_chunks_within(request.stream(), limit),
                                 self.settings.body_timeout_seconds)
        headers = request.headers
        host_request = HostRequest(body, headers.get("content-type"), headers.get("accept"),
                                   headers.get(CUSTOM_ATTRIBUTES_HEADER))
        timeout = self.settings.model_server_timeout_seconds + CALL_MARGIN_SECONDS
        for attempt in range(REPLICA_LOSS_RETRIES + 1):
            try:
                invoked: Invoked = await _call(
                    self.hosts.options(multiplexed_model_id=name).invoke.remote(
                        name, host_request),
                    timeout, lambda: errors.InvocationTimeout(
                        f"model {name!r} did not answer within "
                        f"{self.settings.model_server_timeout_seconds:g} s "
                        "(SAGEMAKER_MODEL_SERVER_TIMEOUT)"))
                break
            except errors.ReplicaUnavailable as error:
                log.warning("model=%s: %s%s", name, error,
                            "; sending it to another" if attempt < REPLICA_LOSS_RETRIES else "")
        else:
            raise errors.ReplicaUnavailable(
                f"the replicas given model {name!r}'s request died before answering; retry")
        answer = invoked.answer
        return Response(answer.body, headers={
            "content-type": answer.content_type, **(answer.headers or {}),
            REPLICA_HEADER: invoked.replica.replica_id,
            LOADED_HEADER: "1" if invoked.loaded else "0"})

    # -- calls to the other deployments ---------------------------------------------

    async def _registry(self, response: DeploymentResponse) -> Any:
        return await _call(response, REGISTRY_CALL_SECONDS, lambda: errors.ReplicaUnavailable(
            "the registrations did not answer; retry"))

    async def _release(self, name: str, token: int) -> None:
        await self._registry(self.registrations.release.remote(name, token))

    async def _broadcast(self, method: str, name: str) -> list[Any]:
        """``method(name)``'s answers from every model host; a replica that failed (it died,
        say) is logged and left out."""
        timeout = self.settings.model_server_timeout_seconds + CALL_MARGIN_SECONDS
        try:
            results = await self.hosts.broadcast(method, name).results_async(
                timeout_s=timeout, return_exceptions=True)
        except TimeoutError:
            raise errors.ReplicaUnavailable(
                f"not every replica answered {method} of model {name!r} within {timeout:g} s; "
                "retry") from None
        replies = []
        for result in results:
            try:
                if isinstance(result, BaseException):
                    raise result
                replies.append(unwrapped(result))
            except Exception as error:  # noqa: BLE001 - one replica's failure is not the answer
                log.warning("model=%s: a replica failed %s: %s", name, method, error)
        return replies


async def _call(response: DeploymentResponse, timeout_seconds: float,
                timeout_error: Callable[[], errors.MMServerError]) -> Any:
    """The callee's result, or its domain error raised (``replies``); a callee that died
    before answering is :class:`~mmserver.errors.ReplicaUnavailable`."""
    try:
        async with asyncio.timeout(timeout_seconds):
            return unwrapped(await response)
    except TimeoutError:
        response.cancel()
        raise timeout_error() from None
    except REPLICA_LOST as error:
        raise errors.ReplicaUnavailable(
            f"the replica given the request died before answering ({type(error).__name__})"
        ) from None


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


def _json(answer: ErrorAnswer) -> Response:
    return JSONResponse(answer.body, status_code=answer.status, headers=answer.headers)

