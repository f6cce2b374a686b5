"""The Open Inference Protocol (KServe v2) over HTTP, beside SageMaker's routes on the same port.

Routes, with Triton's binary tensor data, model repository, model configuration and
statistics extensions (the last two read off the model by :mod:`mmserver.http.triton`)::

    GET  /v2/health/live                          200 while the server runs
    GET  /v2/health/ready                         200 while it serves
    GET  /v2                                      server metadata
    GET  /v2/models/{name}[/versions/1]           model metadata: platform, inputs, outputs
    GET  /v2/models/{name}[/versions/1]/ready     200 when the model serves
    POST /v2/models/{name}[/versions/1]/infer     tensors in, tensors out
    GET  /v2/models/{name}[/versions/1]/config    Triton's model configuration
    GET  /v2/models[/{name}[/versions/1]]/stats   Triton's statistics, from the runner's totals
    POST /v2/repository/index                     the model roots' folders and their state
    POST /v2/repository/models/{name}/load        load the folder {name} (management)
    POST /v2/repository/models/{name}/unload      unload {name} (management)

**One model, one queue.** A model loaded through either protocol is the same
:class:`~mmserver.loaded_model.LoadedModel`, and an infer request goes through the
same :class:`~mmserver.pipeline.InvocationPipeline` as an invoke: payload limit,
admission (503), body timeout, a slot in the model's runner queue, the deadline, and
``model.invocation()``, so unloading drains both. Only the wire differs
(:class:`V2Wire`): the request's tensors are the runner's rows directly, one tensor
for one input, a dict name → tensor for several (``input_fn``/``output_fn`` are not
called: the protocol decodes and encodes); a ``transform_fn`` model takes whole
bodies and answers 400 here. Every model has one version, ``"1"``.

**Which body.** An infer body is JSON, or JSON followed by binary tensors, according
to the ``Inference-Header-Content-Length`` header alone: ``tritonclient.http`` sends
no ``Content-Type`` and ``tritonclient.http.aio`` sends ``application/octet-stream``
even for pure JSON, so the Content-Type is never read, and SageMaker's 415 never
applies. The answer carries binary outputs the same way.

The keys of the answers are spelled here and nowhere else; tensors are
(de)serialised by :mod:`mmserver.v2_tensors` and checked against the model's
:mod:`~mmserver.signatures`. Errors answer ``{"error": "..."}`` (``http.errors``).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from aiohttp import hdrs, web

from mmserver import errors, v2_tensors
from mmserver.batching.rows import leaves, rows_of
from mmserver.handler.folder import EXPORTED, SCRIPT, TORCHSCRIPT
from mmserver.handler.toolkit import RequestContext
from mmserver.http import triton
from mmserver.http.routes import PIPELINE, REGISTRY, read_body, read_json_object
from mmserver.loaded_model import NOT_LOADED, LoadedModel, ModelInfo, ModelStatus
from mmserver.pipeline import ENCODE_IN_THREAD_VALUES, Answer, Invocation, Wire
from mmserver.signatures import Signature, TensorSpec

HEADER_LENGTH = "Inference-Header-Content-Length"
SERVER_NAME = "mmserver"
EXTENSIONS = ("binary_tensor_data", "model_repository", "model_configuration", "statistics")
#: Every model has this one version.
VERSION = "1"
PLATFORMS = {SCRIPT: "python", TORCHSCRIPT: "pytorch_torchscript", EXPORTED: "pytorch_export"}
#: A model's status as a repository state, and the reason given (every status has one).
STATES = {
    ModelStatus.READY: ("READY", ""),
    ModelStatus.LOADING: ("LOADING", "loading"),
    ModelStatus.UNHEALTHY: ("UNAVAILABLE", "a call into the model is stuck past its time limit"),
    ModelStatus.UNLOADING: ("UNLOADING", "unloading"),
    ModelStatus.NOT_LOADED: ("UNAVAILABLE", "not loaded"),
}
JSON_TYPE = "application/json"
BINARY_TYPE = "application/octet-stream"


def server_version() -> str:
    try:
        return importlib.metadata.version(SERVER_NAME)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# -- health and metadata ------------------------------------------------------------


async def live(request: web.Request) -> web.Response:
    return web.Response()


async def ready(request: web.Request) -> web.Response:
    return web.Response()


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response({"name": SERVER_NAME, "version": server_version(),
                              "extensions": list(EXTENSIONS)})


async def model_metadata(request: web.Request) -> web.Response:
    model = _model(request)
    handler = model.handler
    signature = handler.signature
    return web.json_response({
        "name": model.name,
        "versions": [VERSION],
        "platform": PLATFORMS[handler.kind],
        "inputs": [_spec(spec) for spec in signature.inputs],
        "outputs": [_spec(spec) for spec in signature.outputs],
    })


async def model_ready(request: web.Request) -> web.Response:
    info = request.app[REGISTRY].info(request.match_info["name"])
    _check_version(info.name, request)
    if info.status == ModelStatus.LOADING:
        raise errors.ModelLoading(f"model {info.name!r} is still loading")
    if info.status == ModelStatus.UNLOADING:
        raise errors.ModelNotFound(f"model {info.name!r} is being unloaded")
    if info.status == ModelStatus.UNHEALTHY:
        raise errors.ModelUnhealthy(f"model {info.name!r} is unhealthy: "
                                    f"{STATES[ModelStatus.UNHEALTHY][1]}")
    return web.Response()


async def model_config(request: web.Request) -> web.Response:
    model = _model(request)
    return web.json_response(
        triton.model_config(model, PLATFORMS[model.handler.kind]))


async def model_statistics(request: web.Request) -> web.Response:
    """One model's statistics, or every ready model's without a name (as Triton answers)."""
    models = [_model(request)] if "name" in request.match_info else [
        model for model in request.app[REGISTRY].ready() if model.status == ModelStatus.READY]
    return web.json_response({"model_stats": [
        triton.model_stats(model, VERSION) for model in models]})


def _model(request: web.Request) -> LoadedModel:
    model = request.app[REGISTRY].get(request.match_info["name"])
    _check_version(model.name, request)
    return model


def _check_version(name: str, request: web.Request) -> None:
    version = request.match_info.get("version")
    if version is not None and version != VERSION:
        raise errors.InvalidRequest(f"model {name!r} has no version {version!r}; "
                                    f"its versions: [{VERSION!r}]")


def _spec(spec: TensorSpec) -> dict[str, object]:
    return {"name": spec.name, "datatype": spec.datatype, "shape": list(spec.shape)}


# -- inference --------------------------------------------------------------------------


async def infer(request: web.Request) -> web.Response:
    """``POST /v2/models/{name}[/versions/1]/infer``: errors are ``http.errors``'s to answer."""
    model = _model(request)
    wire = V2Wire(model, _header_length(request), request.headers.get(hdrs.CONTENT_TYPE))
    answer = await request.app[PIPELINE].run(model, Invocation(
        wire=wire, content_length=request.content_length,
        read_body=lambda limit: read_body(request, limit),
        body_arrived=request.content.is_eof()))
    return web.Response(body=answer.body, content_type=answer.content_type,
                        headers=answer.headers)


def _header_length(request: web.Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise errors.InvalidRequest(f"{HEADER_LENGTH} must be a number of bytes, "
                                    f"got {raw[:40]!r}") from None


class V2Wire(Wire):
    """An infer request's tensors as the runner's rows, and the output as a v2 answer."""

    def __init__(self, model: LoadedModel, header_length: int | None,
                 content_type: str | None):
        handler = model.handler
        if not handler.takes_tensors:
            raise errors.InvalidRequest(
                f"model {model.name!r} is not available over v2: its code defines "
                "transform_fn, which takes the request body itself, not tensors; invoke it "
                f"with POST /models/{model.name}/invoke")
        self.model_name = model.name
        self.handler = handler
        self.signature: Signature = handler.signature
        self.header_length = header_length
        self.context = RequestContext(model.name, content_type, JSON_TYPE)
        self.request: v2_tensors.InferRequest | None = None

    def decode(self, body: bytes) -> Any:
        request = v2_tensors.parse_infer_request(body, self.header_length)
        inputs = self.signature.matched_inputs(request.inputs)
        if request.outputs is not None:
            self.signature.check_requested_outputs([output.name for output in request.outputs])
        data = next(iter(inputs.values())) if len(inputs) == 1 else inputs
        if self.handler.row_wise:
            _check_rows(data)
        self.request = request
        return self.handler.from_tensors(data, self.context)

    def encode(self, rows: Any) -> Answer:
        request = self.request
        produced = _named_outputs(rows, self.signature)
        if request.outputs is None:
            chosen = [(name, tensor, None) for name, tensor in produced.items()]
        else:
            missing = [o.name for o in request.outputs if o.name not in produced]
            if missing:
                raise errors.InvalidRequest(f"the model returned no output {missing[0]!r}; "
                                            f"it returned {list(produced)}")
            chosen = [(o.name, produced[o.name], o) for o in request.outputs]
        outputs, binaries = [], []
        for name, tensor, asked in chosen:
            entry: dict[str, object] = {"name": name, "datatype": _datatype(tensor, name),
                                        "shape": list(tensor.shape)}
            if request.binary(asked):
                raw = v2_tensors.tensor_bytes(tensor)
                entry["parameters"] = {"binary_data_size": len(raw)}
                binaries.append(raw)
            else:
                entry["data"] = v2_tensors.tensor_data(tensor, name)
            outputs.append(entry)
        header: dict[str, object] = {"model_name": self.model_name, "model_version": VERSION}
        if request.id is not None:
            header["id"] = request.id
        header["outputs"] = outputs
        body, header_length = v2_tensors.joined_body(header, binaries)
        if header_length is None:
            return Answer(body, JSON_TYPE)
        return Answer(body, BINARY_TYPE, {HEADER_LENGTH: str(header_length)})

    def heavy_output(self, rows: Any) -> bool:
        try:
            return sum(leaf.numel() for leaf in leaves(rows)) >= ENCODE_IN_THREAD_VALUES
        except TypeError:
            return False


def _check_rows(data: Any) -> None:
    """A batched model's inputs share dimension 0, the rows, of which there is at least one."""
    try:
        rows = rows_of(data)
    except (TypeError, ValueError) as error:
        raise errors.InvalidInput(f"this model batches requests along dimension 0, so every "
                                  f"input needs it, with the same size: {error}") from None
    if rows == 0:
        raise errors.InvalidInput("the inputs hold no rows (dimension 0 is 0)")


def _named_outputs(rows: Any, signature: Signature) -> dict[str, torch.Tensor]:
    """The model's output as named tensors: a dict by its keys, else by position."""
    if isinstance(rows, Mapping):
        return {str(name): _as_tensor(value, str(name)) for name, value in rows.items()}
    if isinstance(rows, (tuple, list)) and rows and all(
            isinstance(value, (torch.Tensor, np.ndarray)) for value in rows):
        names = signature.output_names(len(rows))
        return {name: _as_tensor(value, name) for name, value in zip(names, rows)}
    name = signature.output_names(1)[0]
    return {name: _as_tensor(rows, name)}


def _as_tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    try:
        tensor = torch.as_tensor(np.ascontiguousarray(value) if isinstance(value, np.ndarray)
                                 else value)
    except (TypeError, ValueError, RuntimeError):
        raise errors.ModelError(f"output {name!r} is {type(value).__name__}, which the v2 "
                                "protocol cannot carry as a numeric tensor") from None
    return tensor


def _datatype(tensor: torch.Tensor, name: str) -> str:
    datatype = v2_tensors.datatype_name(tensor.dtype)
    if datatype is None:
        raise errors.ModelError(f"output {name!r} is {tensor.dtype}, which has no datatype "
                                "in the v2 protocol")
    return datatype


# -- the model repository -------------------------------------------------------------


async def repository_index(request: web.Request) -> web.Response:
    body = await read_json_object(request, empty_allowed=True)
    ready_only = body.get("ready", False)
    if not isinstance(ready_only, bool):
        raise errors.InvalidRequest(f'"ready" must be true or false, got {ready_only!r}')
    entries = [_indexed(info) for info in request.app[REGISTRY].index()
               if not ready_only or info.status == ModelStatus.READY]
    return web.json_response(entries)


def _indexed(info: ModelInfo) -> dict[str, object]:
    state, reason = STATES[info.status]
    entry: dict[str, object] = {"name": info.name}
    if info.status != NOT_LOADED:
        entry["version"] = VERSION
    entry.update({"state": state, "reason": reason})
    return entry


async def repository_load(request: web.Request) -> web.Response:
    """Load the folder named ``{name}`` under the model roots, as ``{name}``; a model already
    loaded from that folder stays as it is (200)."""
    parameters = _parameters(await read_json_object(request, empty_allowed=True))
    refused = sorted(key for key in parameters if key == "config" or key.startswith("file:"))
    if refused:
        raise errors.InvalidRequest(
            f"load parameters {refused} are not supported: a model's files and settings "
            "(mmserver.json) come from its folder under the model roots")
    await request.app[REGISTRY].load_folder(request.match_info["name"])
    return web.Response()


async def repository_unload(request: web.Request) -> web.Response:
    """Unload once accepted requests are answered; ``unload_dependents`` changes nothing, as
    mmserver's models have no dependents."""
    _parameters(await read_json_object(request, empty_allowed=True))
    await request.app[REGISTRY].unload(request.match_info["name"])
    return web.Response()


def _parameters(body: dict) -> Mapping[str, object]:
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise errors.InvalidRequest(f'"parameters" must be an object, got {parameters!r}')
    return parameters


#: The handlers of the v2 routes of ``http.table.ROUTES``, by operation name.
HANDLERS = {handler.__name__: handler for handler in (
    live, ready, server_metadata, model_statistics, model_metadata, model_ready, model_config,
    infer, repository_index, repository_load, repository_unload)}
