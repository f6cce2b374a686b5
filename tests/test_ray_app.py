"""The Ray application without a cluster: its arguments, its config file, its registrations.

What runs on a cluster is in ``test_ray_cluster.py``; here, in a second, what can be
checked offline: ``deploy/ray_serve.yaml`` is a valid Serve config whose application
builds, every argument is read or refused with its key named, the registrations keep a
name taken exactly as ``mmserver serve`` does, and the internals of Ray's multiplexer
that ``mmserver/ray/multiplex.py`` reads are there in the pinned release.
"""

from __future__ import annotations

import asyncio
import json
from importlib.resources import files
from pathlib import Path

import pytest

pytest.importorskip("ray.serve", reason="the Ray tests need the ray extra: pip install -e '.[ray]'")

import cloudpickle  # noqa: E402 - after the skip; ray's dependency
import yaml  # noqa: E402
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary  # noqa: E402
from ray.serve._private.build_app import build_app  # noqa: E402
from ray.serve.multiplex import _ModelMultiplexWrapper  # noqa: E402
from ray.serve.schema import ServeDeploySchema  # noqa: E402

from starlette.requests import Request  # noqa: E402

from mmserver import errors  # noqa: E402
from mmserver.config import Settings  # noqa: E402
from mmserver.http.table import ROUTES, V2  # noqa: E402
from mmserver.ray.ingress import OPERATIONS, Ingress, _match  # noqa: E402
from mmserver.batching import KNOBS  # noqa: E402
from mmserver.ray.multiplex import RAY_INTERNALS  # noqa: E402
from mmserver.ray.registrations import READY, UNLOADING, Registrations  # noqa: E402
from mmserver.ray.replies import Refused, errors_returned, unwrapped  # noqa: E402
from mmserver.ray.settings import ARGUMENTS, ClusterSettings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "deploy" / "ray_serve.yaml"


def _built(import_path: str, args: dict):
    module, _, attribute = import_path.partition(":")
    builder = getattr(__import__(module, fromlist=[attribute]), attribute)
    application = call_user_app_builder_with_args_if_necessary(builder, args)
    return {d.name: d for d in build_app(application, name="mmserver").deployments}


def test_the_config_file_is_a_serve_config_whose_application_builds():
    config = ServeDeploySchema.model_validate(yaml.safe_load(CONFIG.read_text()))
    [application] = config.applications
    assert (application.import_path, application.route_prefix) == ("mmserver.ray:app", "/")
    deployments = _built(application.import_path, application.args)
    assert set(deployments) == {"mmserver-ingress", "mmserver-registrations",
                                "mmserver-model-host"}
    hosts = deployments["mmserver-model-host"]
    assert hosts.num_replicas == application.args["num_replicas"]
    assert hosts.max_ongoing_requests == application.args["max_ongoing_requests"]
    for name in ("mmserver-ingress", "mmserver-registrations"):  # pinned to the head node
        options = deployments[name].ray_actor_options
        assert options["num_cpus"] == 0 and "node:__internal_head__" in options["resources"]
    for deployment in deployments.values():  # what Serve ships to the replicas
        cloudpickle.loads(cloudpickle.dumps(deployment.func_or_class))


def test_text_arguments_as_serve_run_passes_them():
    cluster = ClusterSettings.from_args({
        "model_roots": "/a:/b", "num_replicas": "3", "max_models": "4",
        "memory_budget_mb": "40.5", "replica_cpus": "0.5", "max_ongoing_requests": "32",
        "max_replicas_per_node": "1", "max_batch_size": "8", "max_wait_ms": "2.5",
        "policy": "timer", "max_queue_size": "9", "batch_sizing": "measured",
        "instances": "2"}, environ={})
    server = cluster.server
    assert [str(p) for p in server.model_roots] == ["/a", "/b"]
    assert (server.max_models, server.memory_budget_bytes) == (4, int(40.5 * 2**20))
    assert (cluster.num_replicas, cluster.replica_cpus, cluster.max_ongoing_requests,
            cluster.max_replicas_per_node) == (3, 0.5, 32, 1)
    batch = server.batch
    assert (batch.max_batch_size, batch.max_wait, batch.policy, batch.max_queue_size,
            batch.batch_sizing, batch.instances) == (8, 0.0025, "timer", 9, "measured", 2)
    assert {knob.key for knob in KNOBS} <= set(ARGUMENTS)


def test_yaml_values_and_the_environment_underneath():
    cluster = ClusterSettings.from_args({"model_roots": ["/m"], "max_batch_size": 4},
                                        environ={"MMSERVER_MAX_WAIT_MS": "7",
                                                 "MMSERVER_MAX_BATCH_SIZE": "2"})
    assert (cluster.server.batch.max_batch_size, cluster.server.batch.max_wait) == (4, 0.007)
    defaults = ClusterSettings.from_args({}, environ={})
    assert (defaults.num_replicas, defaults.max_ongoing_requests, defaults.server.max_models) \
        == (2, 64, None)


@pytest.mark.parametrize("args, named", [
    ({"model_root": "/m"}, "unknown arguments ['model_root']"),
    ({"num_replicas": "two"}, "num_replicas='two'"),
    ({"num_replicas": 0}, "num_replicas=0"),
    ({"max_models": True}, "max_models=True"),
    ({"memory_budget_mb": "0"}, "memory_budget_mb='0'"),
    ({"model_roots": 5}, "model_roots=5"),
    ({"max_batch_size": "0"}, "max_batch_size"),
    ({"max_wait_ms": "-1"}, "max_wait_ms"),
    ({"policy": "fifo"}, "policy"),
])
def test_a_bad_argument_is_refused_with_its_key(args, named):
    with pytest.raises(ValueError, match=named.replace("[", r"\[").replace("]", r"\]")):
        ClusterSettings.from_args(args, environ={})


def test_a_name_is_taken_from_claim_until_release():
    async def scenario():
        registrations = Registrations()
        first = await registrations.claim("a", "folder-a")
        with pytest.raises(errors.ModelAlreadyLoaded):
            await registrations.claim("a", "folder-b")
        assert await registrations.serving("a") is None  # loading: invocations get 404
        assert await registrations.current("a") == first  # its first load may proceed
        with pytest.raises(errors.ModelLoading):
            await registrations.begin_unload("a")
        ready = await registrations.confirm("a", first.token)
        assert ready.state == READY and await registrations.serving("a") == ready
        assert (await registrations.page())[0] == [ready]
        unloading = await registrations.begin_unload("a")
        assert unloading.state == UNLOADING
        assert await registrations.current("a") is None  # no replica may load it again
        with pytest.raises(errors.ModelAlreadyLoaded):
            await registrations.claim("a", "folder-b")
        await registrations.release("a", first.token)
        again = await registrations.claim("a", "folder-b")
        assert again.token != first.token
        await registrations.release("a", first.token)  # a stale token frees nothing
        assert await registrations.get("a") == again
        with pytest.raises(errors.ModelNotFound):
            await registrations.confirm("b", 1)

    asyncio.run(scenario())


def test_a_deployment_returns_its_domain_errors():
    async def scenario():
        registrations = errors_returned(Registrations)()
        refused = await registrations.get("missing")
        assert isinstance(refused, Refused) and isinstance(refused.error, errors.ModelNotFound)
        with pytest.raises(errors.ModelNotFound, match="'missing' is not loaded"):
            unwrapped(refused)
        claimed = await registrations.claim("a", "a")
        assert unwrapped(claimed) == claimed  # a result passes through
        refused = await registrations.begin_unload("a")  # its own calls are not wrapped
        assert isinstance(refused.error, errors.ModelLoading)

    asyncio.run(scenario())


def test_errors_cross_processes_whole():
    full = errors.QueueFull("queue full", retry_after_seconds=2.5)
    copy = cloudpickle.loads(cloudpickle.dumps(full))
    assert (type(copy), str(copy), copy.retry_after_seconds) == (errors.QueueFull, "queue full",
                                                                 2.5)
    lost = cloudpickle.loads(cloudpickle.dumps(errors.ReplicaUnavailable("gone")))
    assert (str(lost), lost.retry_after_seconds) == ("gone", 1.0)


def test_the_multiplexer_internals_mmserver_uses_exist_in_this_ray():
    """``mmserver/ray/multiplex.py`` evicts through these; a Ray upgrade that renames one
    fails here, not on a cluster."""
    import inspect

    source = inspect.getsource(_ModelMultiplexWrapper)
    for name in RAY_INTERNALS:
        assert f"self.{name}" in source or f"def {name}(" in source, name


def _ingress_answer(ingress: Ingress, method: str, path: str, headers: dict[str, str]):
    """(status, JSON body, headers) of the ingress's answer, without a cluster."""
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    response = asyncio.run(ingress(Request(scope, receive)))
    return response.status_code, json.loads(response.body or b"null"), response.headers


def test_every_route_of_the_table_reaches_its_operation_on_the_ray_ingress():
    """Every route of the one table is matched by the ingress to its own line (Starlette's
    router, the table's order), and each route that manages answers 401 without the token;
    what each operation answers on a cluster is test_ray_cluster.py's to check."""
    ingress = Ingress(Settings(management_token="secret"), hosts=None, registrations=None)
    for route in ROUTES:
        path = route.path.replace("{name}", "m").replace("{version}", "1")
        scope = {"type": "http", "method": route.method, "path": path, "root_path": ""}
        matched, params = _match(scope, route.protocol)
        assert (matched.operation, matched.protocol) == (route.operation, route.protocol)
        assert params == {key: value for key, value in (("name", "m"), ("version", "1"))
                          if "{" + key + "}" in route.path}
        if route.management:
            status, body, _ = _ingress_answer(ingress, route.method, path, {})
            assert status == 401, (route, body)
            message = body["error"] if route.protocol == V2 else body["message"]
            assert "MMSERVER_MANAGEMENT_TOKEN" in message
    assert set(OPERATIONS) == {route.operation for route in ROUTES}
    assert _ingress_answer(ingress, "GET", "/ping", {})[:2] == (200, {"status": "Healthy"})
    status, document, _ = _ingress_answer(ingress, "GET", "/openapi.json", {})
    assert status == 200 and document["openapi"].startswith("3.")
    assert document == json.loads(files("mmserver.http").joinpath("openapi.json").read_text())
    for health in ("/v2/health/live", "/v2/health/ready"):
        assert _ingress_answer(ingress, "GET", health, {})[:2] == (200, None)
    assert _ingress_answer(ingress, "DELETE", "/models/m", {})[0] == 401
    status, body, _ = _ingress_answer(ingress, "GET", "/nowhere", {})
    assert (status, body["type"]) == (404, "NotFound")
    status, body, headers = _ingress_answer(ingress, "PUT", "/models", {})
    assert (status, headers["allow"]) == (405, "GET,HEAD,POST")  # as aiohttp answers
    assert _ingress_answer(ingress, "GET", "/v2/nowhere", {})[1] == {"error": "Not Found"}
