"""A real Ray cluster of several nodes on this machine, serving ``mmserver.ray:app``, for tests and notebooks.

``ray.cluster_utils.Cluster`` starts a head node and worker nodes as separate
raylets (each with its own processes, as on separate machines, only sharing the
disk); Serve's HTTP proxy listens on the head node only, on a free port of
127.0.0.1. Everything stays on loopback: the nodes advertise 127.0.0.1, the
dashboard is off, Ray's usage report is off.

    with LocalCluster(model_root, {"num_replicas": 2, "max_models": 3}) as cluster:
        cluster.client.load("a", "a")
        answer = cluster.client.invoke_answer("a", [[1.0, 2.0]])
        answer.replica, answer.loaded, answer.rows
        cluster.remove_worker()

Like ``mmserver.harness.testing``, it needs only what the ``ray`` extra installs, and
every wait has a limit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import mmserver
from mmserver.ray.replicas import LOADED_HEADER, REPLICA_HEADER
from mmserver.harness.testing import RunningServer, free_port

#: Set for the cluster's processes: no usage report, and the nodes' address is 127.0.0.1.
#: Ray reads them when it is first imported, so they must be set before that.
RAY_ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: Each node's object store; the answers that travel through it are small.
OBJECT_STORE_BYTES = 80 * 2**20
APPLICATION_NAME = "mmserver"


@dataclasses.dataclass(frozen=True)
class InvokeAnswer:
    """One invocation's answer with the replica that gave it."""

    status: int
    #: The decoded JSON answer (rows, or the error body).
    body: object
    replica: str | None
    #: The replica loaded the model for this request (a miss).
    loaded: bool
    seconds: float


class ClusterClient(RunningServer):
    """The ingress's HTTP routes, with the replica headers of each answer."""

    def invoke_answer(self, name: str, rows, timeout: float = 60) -> InvokeAnswer:
        started = time.perf_counter()
        status, headers, raw = self.request(
            "POST", f"/models/{name}/invoke", json.dumps(rows),
            {"Content-Type": "application/json"}, timeout)
        seconds = time.perf_counter() - started
        lowered = {key.lower(): value for key, value in headers.items()}
        return InvokeAnswer(status, json.loads(raw) if raw else None,
                            lowered.get(REPLICA_HEADER.lower()),
                            lowered.get(LOADED_HEADER.lower()) == "1", seconds)

    def holders(self, name: str) -> dict[str, dict]:
        """Replica id to that replica's entry in describe, for the replicas holding ``name``."""
        status, body = self.json("GET", f"/models/{name}")
        if status != 200:
            raise RuntimeError(f"describe {name} answered {status}: {body}")
        return {entry["replicaId"]: entry for entry in body["replicas"]}


class LocalCluster:
    """A head node and ``workers`` worker nodes, each with ``cpus_per_node`` Ray CPUs, and the
    application deployed with ``args`` (``mmserver.ray.settings``) over ``model_root``."""

    def __init__(self, model_root: Path | str, args: Mapping[str, object] | None = None, *,
                 workers: int = 1, cpus_per_node: float = 1, start_timeout: float = 240):
        self.model_root = Path(model_root)
        self.args = {"model_roots": str(model_root), **(args or {})}
        self.workers = workers
        self.cpus_per_node = cpus_per_node
        self.start_timeout = start_timeout
        self.port = free_port()
        self.client = ClusterClient(f"http://127.0.0.1:{self.port}")
        self._cluster = None
        self._worker_nodes: list = []
        self._saved_environment: dict[str, str | None] = {}
        self._temp_dir: str | None = None
        self._created_default_dir: Path | None = None

    def start(self) -> LocalCluster:
        # The nodes' workers import the mmserver this process imported, installed or not.
        import_root = str(Path(mmserver.__file__).resolve().parents[1])
        python_path = os.pathsep.join(p for p in (import_root, os.environ.get("PYTHONPATH"))
                                      if p)
        for key, value in {**RAY_ENVIRONMENT, "PYTHONPATH": python_path}.items():
            self._saved_environment[key] = os.environ.get(key)
            os.environ[key] = value
        logging.getLogger("ray.widgets").setLevel(logging.WARNING)  # "missing ipywidgets" in notebooks
        import ray
        from ray._common import utils as ray_utils
        from ray._private import ray_constants
        from ray import serve
        from ray.cluster_utils import Cluster

        from mmserver.ray.application import app

        if ray_constants.ENABLE_RAY_CLUSTER:
            raise RuntimeError(
                "ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set, so its "
                "nodes would advertise this machine's network address; set RAY_ENVIRONMENT "
                "before importing ray (tests/conftest.py does)")

        # Short: Ray's socket paths live under it and must fit a Unix socket's 107 bytes.
        self._temp_dir = tempfile.mkdtemp(prefix="mmray-")
        # ray.cluster_utils writes the cluster's address into Ray's default folder whatever
        # the nodes' folder (and deletes it at shutdown); that folder must exist.
        default_dir = Path(ray_utils.get_default_ray_temp_dir())
        if not default_dir.exists():
            default_dir.mkdir(parents=True)
            self._created_default_dir = default_dir
        deadline = time.monotonic() + self.start_timeout
        try:
            node = {"num_cpus": self.cpus_per_node, "object_store_memory": OBJECT_STORE_BYTES,
                    "temp_dir": self._temp_dir}
            self._cluster = Cluster(initialize_head=True,
                                    head_node_args={**node, "include_dashboard": False})
            for _ in range(self.workers):
                self._worker_nodes.append(self._cluster.add_node(**node))
            self._cluster.wait_for_nodes(timeout=max(1.0, deadline - time.monotonic()))
            ray.init(address=self._cluster.address, log_to_driver=False,
                     logging_level=logging.WARNING)
            logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the driver's start-up notices
            serve.start(http_options={"host": "127.0.0.1", "port": self.port},
                        proxy_location="HeadOnly")
            serve.run(app(self.args), name=APPLICATION_NAME, route_prefix="/",
                      blocking=False)
            self._wait_until_ready(deadline)
        except BaseException:
            self.close()
            raise
        return self

    def _wait_until_ready(self, deadline: float) -> None:
        from ray import serve

        while time.monotonic() < deadline:
            status = serve.status().applications.get(APPLICATION_NAME)
            if status is not None and status.status == "RUNNING":
                try:
                    if self.client.request("GET", "/ping", timeout=5)[0] == 200:
                        return
                except OSError:
                    pass
            elif status is not None and status.status == "DEPLOY_FAILED":
                raise RuntimeError(f"the application failed to deploy: {status.message}")
            time.sleep(0.5)
        raise TimeoutError(f"the application did not answer /ping within {self.start_timeout} s")

    def remove_worker(self) -> str:
        """Remove the last worker node (all its processes); its node id."""
        node = self._worker_nodes.pop()
        self._cluster.remove_node(node, allow_graceful=False)
        return node.node_id

    def close(self) -> None:
        """Delete the application, stop Ray and every node, restore the environment."""
        import ray
        from ray import serve

        try:
            if ray.is_initialized():
                try:
                    serve.shutdown()
                finally:
                    ray.shutdown()
        finally:
            if self._cluster is not None:
                self._cluster.shutdown()
                self._cluster = None
            for key, value in self._saved_environment.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if self._temp_dir is not None:
                shutil.rmtree(self._temp_dir, ignore_errors=True)
            if self._created_default_dir is not None:
                with contextlib.suppress(OSError):  # only if Ray left nothing else in it
                    self._created_default_dir.rmdir()

    def __enter__(self) -> LocalCluster:
        return self.start() if self._cluster is None else self

    def __exit__(self, *exc_info) -> None:
        self.close()
