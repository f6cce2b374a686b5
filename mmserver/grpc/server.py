"""``inference.GRPCInferenceService`` on the HTTP server's own event loop (``grpc.aio``).

Every method goes through the operation its HTTP v2 route runs (``mmserver.http.v2``) over
the same :class:`~mmserver.http.service.ModelService`, with the message made into that
route's :class:`~mmserver.http.service.Call` (``messages``): one invoke path, so a gRPC
request and an HTTP request to one model join the same queue and can share a model call,
in one process or, with ``--http-workers N``, through the engine from any worker (each
worker serves gRPC on the shared port, ``grpc.so_reuseport``, as it serves HTTP).

Errors are answered with the status codes Triton's gRPC front end uses
(:data:`CODE_BY_ERROR`): an unknown model NOT_FOUND, a client's mistake
INVALID_ARGUMENT, a full queue UNAVAILABLE with ``retry-after`` (seconds) in the trailing
metadata, the deadline DEADLINE_EXCEEDED, the management token (``authorization: Bearer
<token>`` metadata, on load and unload) UNAUTHENTICATED. A message over
``SAGEMAKER_MAX_PAYLOAD_IN_MB`` is refused by grpc before it is parsed
(``grpc.max_receive_message_length``, RESOURCE_EXHAUSTED).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Mapping

import grpc
from aiohttp import web
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from mmserver import errors
from mmserver.config import Settings
from mmserver.grpc.messages import infer_body, infer_response, load_parameters, parsed
from mmserver.http import v2
from mmserver.http.errors import check_bearer_token, status_for
from mmserver.http.service import Call
from mmserver.http.table import V2
from mmserver.wires import HEADER_LENGTH

log = logging.getLogger(__name__)

#: gRPC's status for each domain error, as Triton's gRPC front end maps its own errors; the
#: nearest class in an error's hierarchy wins, as for HTTP (``http.errors``).
CODE_BY_ERROR: dict[type[BaseException], grpc.StatusCode] = {
    errors.InvalidRequest: grpc.StatusCode.INVALID_ARGUMENT,
    errors.InvalidInput: grpc.StatusCode.INVALID_ARGUMENT,
    errors.InvalidModelArtifact: grpc.StatusCode.INVALID_ARGUMENT,
    errors.NotAcceptable: grpc.StatusCode.INVALID_ARGUMENT,
    errors.Unauthorized: grpc.StatusCode.UNAUTHENTICATED,
    errors.ModelUrlNotFound: grpc.StatusCode.NOT_FOUND,
    errors.ModelNotFound: grpc.StatusCode.NOT_FOUND,
    errors.RunnerClosed: grpc.StatusCode.NOT_FOUND,
    errors.ModelAlreadyLoaded: grpc.StatusCode.ALREADY_EXISTS,
    errors.ModelLoading: grpc.StatusCode.UNAVAILABLE,
    errors.PayloadTooLarge: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.BodyTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.RetryLater: grpc.StatusCode.UNAVAILABLE,
    errors.ModelUnhealthy: grpc.StatusCode.UNAVAILABLE,
    errors.InvocationTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.LoadTimeout: grpc.StatusCode.DEADLINE_EXCEEDED,
    errors.InsufficientResources: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ModelOutOfMemory: grpc.StatusCode.RESOURCE_EXHAUSTED,
    errors.ModelError: grpc.StatusCode.INTERNAL,
}
#: The trailing metadata key of a refusal's retry hint, in whole seconds (HTTP's Retry-After).
RETRY_AFTER = "retry-after"


def code_for(error: BaseException) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in CODE_BY_ERROR:
            return CODE_BY_ERROR[cls]
    return grpc.StatusCode.INTERNAL


def _call(params: Mapping[str, str], body: bytes = b"",
          headers: Mapping[str, str] | None = None) -> Call:
    """A message as the HTTP operation's request; grpc already bounded its size."""

    async def read_body(limit: int) -> bytes:
        return body

    return Call(params=params, query={}, headers=headers or {}, content_length=None,
                read_body=read_body, body_arrived=True)


def _model(name: str, version: str) -> dict[str, str]:
    return {"name": name, "version": version} if version else {"name": name}


def _json_body(value: object) -> bytes:
    return json.dumps(value).encode()


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Each method: the HTTP v2 operation over ``service``, its answer as the message."""

    def __init__(self, service, settings: Settings):
        self.service = service
        self.token = settings.management_token

    async def _answer(self, context: grpc.aio.ServicerContext, operation, call: Call):
        try:
            return await operation(self.service, call)
        except errors.MMServerError as error:
            await _abort(context, error)

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context):
        try:
            await v2.model_ready(self.service, _call(_model(request.name, request.version)))
        except errors.MMServerError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request, context):
        reply = await self._answer(context, v2.server_metadata, _call({}))
        return parsed(json.loads(reply.body), pb.ServerMetadataResponse())

    async def ModelMetadata(self, request, context):
        reply = await self._answer(context, v2.model_metadata,
                                   _call(_model(request.name, request.version)))
        return parsed(json.loads(reply.body), pb.ModelMetadataResponse())

    async def ModelConfig(self, request, context):
        reply = await self._answer(context, v2.model_config,
                                   _call(_model(request.name, request.version)))
        return parsed({"config": json.loads(reply.body)}, pb.ModelConfigResponse())

    async def ModelStatistics(self, request, context):
        params = _model(request.name, request.version) if request.name else {}
        reply = await self._answer(context, v2.model_statistics, _call(params))
        return parsed(json.loads(reply.body), pb.ModelStatisticsResponse())

    async def RepositoryIndex(self, request, context):
        reply = await self._answer(context, v2.repository_index,
                                   _call({}, _json_body({"ready": request.ready})))
        return parsed({"models": json.loads(reply.body)}, pb.RepositoryIndexResponse())

    async def RepositoryModelLoad(self, request, context):
        await self._authorized(context)
        await self._answer(context, v2.repository_load, _call(
            {"name": request.model_name}, _json_body(load_parameters(request.parameters))))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        await self._authorized(context)
        await self._answer(context, v2.repository_unload, _call(
            {"name": request.model_name}, _json_body(load_parameters(request.parameters))))
        return pb.RepositoryModelUnloadResponse()

    async def _authorized(self, context: grpc.aio.ServicerContext) -> None:
        if self.token is None:
            return
        metadata = dict(context.invocation_metadata() or ())
        try:
            check_bearer_token(metadata.get("authorization"), self.token)
        except errors.Unauthorized as error:
            await _abort(context, error)

    async def ModelInfer(self, request, context):
        """The v2 infer operation on the request as a binary-tensor body; counted in the
        request metrics with the HTTP status the same answer has over v2."""
        started = time.perf_counter()
        status = 500
        try:
            body, header_length = infer_body(request)
            reply = await v2.infer(self.service, _call(
                _model(request.model_name, request.model_version), body,
                {HEADER_LENGTH: str(header_length)}))
            response = infer_response(reply.body, _header_length(reply.headers))
            status = 200
            return response
        except errors.MMServerError as error:
            status = status_for(error, V2) or 500
            await _abort(context, error)
        except asyncio.CancelledError:  # the client went away or its deadline passed
            status = None
            raise
        finally:
            if status is not None:
                self.service.count_invocation(request.model_name, status,
                                              time.perf_counter() - started)

    # Streaming and shared memory are not served: grpc answers UNIMPLEMENTED (the base class).


def _header_length(headers: Mapping[str, str] | None) -> int | None:
    value = (headers or {}).get(HEADER_LENGTH)
    return None if value is None else int(value)


async def _abort(context: grpc.aio.ServicerContext, error: errors.MMServerError) -> None:
    """End the call with ``error``'s status; a refusal's retry hint goes in the trailers."""
    retry_after = getattr(error, "retry_after_seconds", None)
    trailers = () if retry_after is None else ((RETRY_AFTER, str(math.ceil(retry_after))),)
    await context.abort(code_for(error), str(error), trailing_metadata=trailers)


def listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def attach(app: web.Application, service, settings: Settings, *, reuse_port: bool) -> None:
    """Serve gRPC on ``settings.grpc_port`` while ``app`` runs, on its loop: started after
    the app's start-up (the preloaded models), stopped before its drain, within a share of
    the shutdown timeout. ``reuse_port``: HTTP workers share the port (SO_REUSEPORT); one
    process does not, so a port already taken is an error, not a silent split."""
    address = listen_address(settings.host, settings.grpc_port)
    running: list[grpc.aio.Server] = []

    async def start(app: web.Application) -> None:
        server = grpc.aio.server(options=[
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            ("grpc.max_receive_message_length", settings.max_payload_bytes),
            ("grpc.max_send_message_length", -1),
        ])
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            InferenceServicer(service, settings), server)
        try:
            server.add_insecure_port(address)
        except RuntimeError:
            raise errors.MMServerError(
                f"cannot listen for gRPC on {address}: the port is taken (MMSERVER_GRPC_PORT, "
                "--grpc-port; 0 turns gRPC off)") from None
        await server.start()
        running.append(server)

    async def stop(app: web.Application) -> None:
        for server in running:
            await server.stop(settings.shutdown_timeout_seconds / 2)

    app.on_startup.append(start)
    app.on_shutdown.insert(0, stop)
