"""Every HTTP route mmserver serves, in one table that both hosts read.

Each line says the method and path (``{name}`` is a path parameter, as aiohttp and
Starlette both spell it), the operation that answers it, whether it needs the
management token (``MMSERVER_MANAGEMENT_TOKEN``), which protocol's error shape it
answers in, and, for a route that invokes a model, where the model's name is. A host
maps operations to its own handlers: ``http.app`` serves every one with aiohttp; the
Ray ingress (``mmserver.ray.ingress``) serves the operations a cluster supports and
answers the others 501, never 404. ``openapi.json`` describes exactly these routes
(``tests/test_app_inprocess.py`` checks it), so adding a route is a line here, its
handler, and its entry there.

This module imports nothing beyond the standard library: the Ray head node reads it
without aiohttp or torch.
"""

from __future__ import annotations

import dataclasses

#: SageMaker's routes answer ``{"code", "type", "message"}`` (the MMS/TorchServe shape).
SAGEMAKER = "sagemaker"
#: The Open Inference Protocol's routes (``/v2``) answer ``{"error": "..."}``, as Triton does.
V2 = "v2"
V2_PREFIX = "/v2"

#: Where an invoking route finds the model's name: the ``{name}`` of its path ...
NAME_IN_PATH = "path"
#: ... or SageMaker's ``X-Amzn-SageMaker-Target-Model`` header (``POST /invocations``).
NAME_IN_TARGET_HEADER = "target header"


@dataclasses.dataclass(frozen=True)
class RouteSpec:
    method: str
    path: str
    #: The operation that answers the route: the name of ``http.app``'s handler.
    operation: str
    #: Needs ``Authorization: Bearer <token>`` when ``MMSERVER_MANAGEMENT_TOKEN`` is set.
    #: Invocations, health and metrics stay open: SageMaker authenticates callers in front
    #: of the container, and only it manages models.
    management: bool = False
    protocol: str = SAGEMAKER
    #: For a route that invokes a model, where its name is (:data:`NAME_IN_PATH` or
    #: :data:`NAME_IN_TARGET_HEADER`): each such request is counted in the request metrics.
    invokes: str | None = None


def _v2(method: str, path: str, operation: str, *, management: bool = False,
        invokes: str | None = None) -> RouteSpec:
    return RouteSpec(method, V2_PREFIX + path, operation, management, V2, invokes)


ROUTES = (
    RouteSpec("POST", "/models", "load_model", management=True),
    RouteSpec("GET", "/models", "list_models"),
    RouteSpec("GET", "/models/{name}", "describe_model"),
    RouteSpec("DELETE", "/models/{name}", "unload_model", management=True),
    RouteSpec("POST", "/models/{name}/invoke", "invoke", invokes=NAME_IN_PATH),
    RouteSpec("POST", "/invocations", "invoke", invokes=NAME_IN_TARGET_HEADER),
    RouteSpec("GET", "/ping", "ping"),
    RouteSpec("GET", "/metrics", "metrics"),
    RouteSpec("GET", "/openapi.json", "openapi"),
    _v2("GET", "/health/live", "live"),
    _v2("GET", "/health/ready", "ready"),
    _v2("GET", "", "server_metadata"),
    # Before /models/{name}, which would take "stats" for a model's name (Triton's path too).
    _v2("GET", "/models/stats", "model_statistics"),
    _v2("GET", "/models/{name}", "model_metadata"),
    _v2("GET", "/models/{name}/versions/{version}", "model_metadata"),
    _v2("GET", "/models/{name}/ready", "model_ready"),
    _v2("GET", "/models/{name}/versions/{version}/ready", "model_ready"),
    _v2("GET", "/models/{name}/config", "model_config"),
    _v2("GET", "/models/{name}/versions/{version}/config", "model_config"),
    _v2("GET", "/models/{name}/stats", "model_statistics"),
    _v2("GET", "/models/{name}/versions/{version}/stats", "model_statistics"),
    _v2("POST", "/models/{name}/infer", "infer", invokes=NAME_IN_PATH),
    _v2("POST", "/models/{name}/versions/{version}/infer", "infer", invokes=NAME_IN_PATH),
    _v2("POST", "/repository/index", "repository_index"),
    _v2("POST", "/repository/models/{name}/load", "repository_load", management=True),
    _v2("POST", "/repository/models/{name}/unload", "repository_unload", management=True),
)


def is_v2_path(path: str) -> bool:
    """Whether a path is in the v2 protocol's tree (for errors of paths no route matched)."""
    return path == V2_PREFIX or path.startswith(V2_PREFIX + "/")
