"""The Open Inference Protocol (KServe v2): the operations of its routes, over any ModelService.

Routes, with Triton's binary tensor data, model repository, model configuration and
statistics extensions (the model's answers are read off it by :mod:`mmserver.http.triton`,
where the model is)::

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
(:class:`~mmserver.wires.V2Wire`): the request's tensors are the runner's rows
directly. Every model has one version, ``"1"``.

**Which body.** An infer body is JSON, or JSON followed by binary tensors, according
to the ``Inference-Header-Content-Length`` header alone: ``tritonclient.http`` sends
no ``Content-Type`` and ``tritonclient.http.aio`` sends ``application/octet-stream``
even for pure JSON, so the Content-Type is never read, and SageMaker's 415 never
applies. The answer carries binary outputs the same way.

The keys of the server's and the repository's answers are spelled here, those of a
model's in ``http.triton``; tensors are (de)serialised by :mod:`mmserver.v2_tensors`
and checked against the model's :mod:`~mmserver.signatures`. Errors answer
``{"error": "..."}`` (``http.errors``).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping

from mmserver import errors
from mmserver.http.requests import read_json_object
from mmserver.http.service import Call, ModelService, Reply
from mmserver.loaded_model import NOT_LOADED, ModelInfo, ModelStatus
from mmserver.wires import HEADER_LENGTH, VERSION, V2Headers

SERVER_NAME = "mmserver"
EXTENSIONS = ("binary_tensor_data", "model_repository", "model_configuration", "statistics")
#: A model's status as a repository state, and the reason given (every status has one).
STATES = {
    ModelStatus.READY: ("READY", ""),
    ModelStatus.LOADING: ("LOADING", "loading"),
    ModelStatus.UNHEALTHY: ("UNAVAILABLE", "a call into the model is stuck past its time limit"),
    ModelStatus.UNLOADING: ("UNLOADING", "unloading"),
    ModelStatus.NOT_LOADED: ("UNAVAILABLE", "not loaded"),
    ModelStatus.FAILED: ("UNAVAILABLE", "its engine died and it could not be loaded again"),
}


def server_version() -> str:
    try:
        return importlib.metadata.version(SERVER_NAME)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# -- health and metadata ------------------------------------------------------------


async def live(service: ModelService, call: Call) -> Reply:
    return Reply()


async def ready(service: ModelService, call: Call) -> Reply:
    return Reply()


async def server_metadata(service: ModelService, call: Call) -> Reply:
    return Reply.json({"name": SERVER_NAME, "version": server_version(),
                       "extensions": list(EXTENSIONS)})


async def model_metadata(service: ModelService, call: Call) -> Reply:
    return Reply.json(await service.model_metadata(_model_name(call)))


async def model_ready(service: ModelService, call: Call) -> Reply:
    name = _model_name(call)
    status = await service.status(name)
    if status == ModelStatus.LOADING:
        raise errors.ModelLoading(f"model {name!r} is still loading")
    if status == ModelStatus.UNLOADING:
        raise errors.ModelNotFound(f"model {name!r} is being unloaded")
    if status == ModelStatus.UNHEALTHY:
        raise errors.ModelUnhealthy(f"model {name!r} is unhealthy: "
                                    f"{STATES[ModelStatus.UNHEALTHY][1]}")
    return Reply()


async def model_config(service: ModelService, call: Call) -> Reply:
    return Reply.json(await service.model_config(_model_name(call)))


async def model_statistics(service: ModelService, call: Call) -> Reply:
    """One model's statistics, or every ready model's without a name (as Triton answers)."""
    name = _model_name(call) if "name" in call.params else None
    return Reply.json({"model_stats": await service.model_statistics(name)})


def _model_name(call: Call) -> str:
    """The path's model name, its version checked: every model has only :data:`VERSION`."""
    name = call.params["name"]
    version = call.params.get("version")
    if version is not None and version != VERSION:
        raise errors.InvalidRequest(f"model {name!r} has no version {version!r}; "
                                    f"its versions: [{VERSION!r}]")
    return name


# -- inference --------------------------------------------------------------------------


async def infer(service: ModelService, call: Call) -> Reply:
    """``POST /v2/models/{name}[/versions/1]/infer``."""
    name = _model_name(call)
    wire = V2Headers.parse(call.headers.get(HEADER_LENGTH), call.headers.get("Content-Type"))
    return Reply.of(await service.invoke(name, wire, call))


# -- the model repository -------------------------------------------------------------


async def repository_index(service: ModelService, call: Call) -> Reply:
    body = await read_json_object(call, empty_allowed=True)
    ready_only = body.get("ready", False)
    if not isinstance(ready_only, bool):
        raise errors.InvalidRequest(f'"ready" must be true or false, got {ready_only!r}')
    return Reply.json([_indexed(info) for info in await service.index()
                       if not ready_only or info.status == ModelStatus.READY])


def _indexed(info: ModelInfo) -> dict[str, object]:
    state, reason = STATES[info.status]
    entry: dict[str, object] = {"name": info.name}
    if info.status != NOT_LOADED:
        entry["version"] = VERSION
    entry.update({"state": state, "reason": reason})
    return entry


async def repository_load(service: ModelService, call: Call) -> Reply:
    """Load the folder named ``{name}`` under the model roots, as ``{name}``; a model already
    loaded from that folder stays as it is (200)."""
    parameters = _parameters(await read_json_object(call, empty_allowed=True))
    refused = sorted(key for key in parameters if key == "config" or key.startswith("file:"))
    if refused:
        raise errors.InvalidRequest(
            f"load parameters {refused} are not supported: a model's files and settings "
            "(mmserver.json) come from its folder under the model roots")
    await service.load_folder(call.params["name"])
    return Reply()


async def repository_unload(service: ModelService, call: Call) -> Reply:
    """Unload once accepted requests are answered; ``unload_dependents`` changes nothing, as
    mmserver's models have no dependents."""
    _parameters(await read_json_object(call, empty_allowed=True))
    await service.unload(call.params["name"])
    return Reply()


def _parameters(body: dict) -> Mapping[str, object]:
    parameters = body.get("parameters", {})
    if not isinstance(parameters, dict):
        raise errors.InvalidRequest(f'"parameters" must be an object, got {parameters!r}')
    return parameters


#: The operations of the v2 routes of ``http.table.ROUTES``, by name.
OPERATIONS = {operation.__name__: operation for operation in (
    live, ready, server_metadata, model_statistics, model_metadata, model_ready, model_config,
    infer, repository_index, repository_load, repository_unload)}
