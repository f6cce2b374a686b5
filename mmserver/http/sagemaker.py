"""SageMaker's multi-model contract: the operations of its routes, over any ModelService.

Routes (docs/design.md section 4; the table is ``http.table``)::

    POST   /models                  load {"model_name", "url"}
    GET    /models                  list, ?limit=N&next_page_token=T
    GET    /models/{name}           describe
    DELETE /models/{name}           unload after accepted requests finish
    POST   /models/{name}/invoke    run the model on the body
    POST   /invocations             single-model mode (or X-Amzn-SageMaker-Target-Model)
    GET    /ping                    health
    GET    /metrics                 Prometheus text format
    GET    /openapi.json            the OpenAPI description of every route

Each operation takes the service and the request (``http.service``) and answers a
``Reply``; errors are raised, and answered by the host in SageMaker's shape. Where
SageMaker's contract is silent we follow AWS's multi-model-server.
"""

from __future__ import annotations

from importlib.resources import files

from prometheus_client import CONTENT_TYPE_LATEST

from mmserver.http import answers
from mmserver.http.requests import (
    CUSTOM_ATTRIBUTES_HEADER,
    TARGET_MODEL_HEADER,
    invocations_target,
    load_request,
    page_limit,
    read_json_object,
)
from mmserver.http.service import JSON_TYPE, Call, ModelService, Reply
from mmserver.wires import ToolkitHeaders

#: The OpenAPI description of ``http.table``'s routes, shipped with the package.
OPENAPI = files("mmserver.http").joinpath("openapi.json")


# -- model management ---------------------------------------------------------


async def load_model(service: ModelService, call: Call) -> Reply:
    name, url = load_request(await read_json_object(call))
    return Reply.json(answers.loaded(await service.load(name, url)))


async def list_models(service: ModelService, call: Call) -> Reply:
    page, token = await service.page(page_limit(call.query.get("limit")),
                                     call.query.get("next_page_token"))
    return Reply.json(answers.listed(page, token))


async def describe_model(service: ModelService, call: Call) -> Reply:
    return Reply.json(await service.describe(call.params["name"]))


async def unload_model(service: ModelService, call: Call) -> Reply:
    name = call.params["name"]
    await service.unload(name)
    return Reply.json(answers.unloaded(name))


# -- invocation -----------------------------------------------------------------


def invoked_model(call: Call) -> str:
    """The model an invocation names (of SageMaker's routes or v2's): ``{name}`` of its path,
    else ``/invocations``' target (``http.table``'s ``invokes`` says which)."""
    return call.params.get("name") or invocations_target(call.headers.get(TARGET_MODEL_HEADER))


async def invoke(service: ModelService, call: Call) -> Reply:
    """``POST /models/{name}/invoke`` and ``POST /invocations``."""
    headers = call.headers
    wire = ToolkitHeaders(headers.get("Content-Type"), headers.get("Accept"),
                          headers.get(CUSTOM_ATTRIBUTES_HEADER))
    return Reply.of(await service.invoke(invoked_model(call), wire, call))


# -- health, metrics, the description ---------------------------------------------


async def ping(service: ModelService, call: Call) -> Reply:
    return Reply.json(answers.healthy())


async def metrics(service: ModelService, call: Call) -> Reply:
    return Reply(await service.exposition(), CONTENT_TYPE_LATEST)


async def openapi(service: ModelService, call: Call) -> Reply:
    return Reply(OPENAPI.read_bytes(), JSON_TYPE)


#: The operations of SageMaker's routes, by the name ``http.table`` gives each.
OPERATIONS = {operation.__name__: operation for operation in (
    load_model, list_models, describe_model, unload_model, invoke, ping, metrics, openapi)}
