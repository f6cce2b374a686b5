"""``"isolation": "process"``: a model in a process of its own, against real processes.

A model whose ``mmserver.json`` asks for it (or every model, with
``MMSERVER_ISOLATION=process``) runs in a child engine of the process that holds the
registry: the one server process by default, the engine under ``--http-workers``. A
native crash in its code (a real segfault, a SIGKILL) answers its in-flight requests 503
at once with a message naming the model, never touches the other models, and the model
serves again from a new process; one that kills its process as it loads is failed, not
loaded for ever. SIGTERM leaves no process and no socket folder behind.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import tempfile
from pathlib import Path

import pytest

from conftest import running_server, write_code, write_torchscript
from helpers import assert_error, wait_until
from test_http_workers import (
    LOAD_KILLER_CODE,
    ONE_SECOND_CODE,
    SEGFAULT_CODE,
    WORKERS,
    _alive,
    _descendants,
    _post,
)

from mmserver.engine.isolated import FOLDER_PREFIX, ISOLATED, ISOLATION_KEY
from mmserver.harness.testing import wait_for_http_workers
from mmserver.http.app import WORKER_HEADER

pytestmark = pytest.mark.slow

ISOLATED_SETTINGS = json.dumps({ISOLATION_KEY: ISOLATED})
#: Segfaults on a negative input; its second load waits for a file ``gate`` in its folder
#: (at most 60 s), so a test sees it loading again for as long as it needs.
GATED_RELOAD_CODE = """
    import ctypes, os, time

    def model_fn(model_dir):
        once = os.path.join(model_dir, "loaded-once")
        if not os.path.exists(once):
            open(once, "w").close()
            return None
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(model_dir, "gate")) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None

    def predict_fn(data, model):
        if float(data.flatten()[0]) < 0:
            ctypes.string_at(0)
        return data
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("isolated-models")
    write_torchscript(root / "affine")
    for name, code in (("segfault", SEGFAULT_CODE), ("killer", LOAD_KILLER_CODE),
                       ("fragile", LOAD_KILLER_CODE), ("slow", ONE_SECOND_CODE),
                       ("gated", GATED_RELOAD_CODE)):
        write_code(root / name, code)
        (root / name / "mmserver.json").write_text(ISOLATED_SETTINGS)
    write_code(root / "typo", SEGFAULT_CODE)
    (root / "typo" / "mmserver.json").write_text(json.dumps({ISOLATION_KEY: "processes"}))
    return root


@pytest.fixture(scope="module")
def server(root):
    with running_server(["--model-root", str(root), "--no-access-log",
                         "--max-wait-ms", "30"]) as server:
        assert server.load("affine", "affine")[0] == 200
        yield server


def _described(server, name: str) -> dict:
    status, body = server.json("GET", f"/models/{name}")
    assert status == 200, body
    return body


def _serving_process(server, name: str, restarts: int) -> int:
    """The pid of the process serving ``name`` once it serves after ``restarts`` deaths."""
    found = {}

    def serving() -> bool:
        body = _described(server, name)
        found.update(body.get("engine") or {})
        return body["status"] == "ready" and found.get("restarts") == restarts

    assert wait_until(serving, 60), server.log()
    return found["pid"]


def _metric(server, pattern: str) -> float | None:
    match = re.search(pattern, server.request("GET", "/metrics")[2].decode(), re.M)
    return float(match.group(1)) if match else None


def _affine_serves(server) -> None:
    assert _post(server, "affine", [[1.0, 2.0, 3.0]])[::2] == (200, [[3.0, 5.0, 7.0]])


def _isolation_folders() -> set[str]:
    return {path.name for path in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*")}


def test_a_segfault_in_an_isolated_model_costs_only_that_model(server):
    folders_before = _isolation_folders()
    assert server.load("segfault", "segfault")[0] == 200
    assert len(_isolation_folders() - folders_before) == 1
    described = _described(server, "segfault")
    assert described[ISOLATION_KEY] == ISOLATED and described["status"] == "ready"
    first = described["engine"]["pid"]
    assert first in _descendants(server.process.pid) and first != server.process.pid
    assert ISOLATION_KEY not in _described(server, "affine")
    assert [m["modelName"] for m in server.json("GET", "/models")[1]["models"]] == [
        "affine", "segfault"]

    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        fine = [pool.submit(_post, server, "segfault", [[float(i)]]) for i in range(1, 9)]
        assert wait_until(lambda: _described(server, "segfault")["stats"]["requestsInFlight"]
                          >= 1, 10)
        status, _, body = pool.submit(_post, server, "segfault", [[-1.0]]).result(timeout=30)
        assert (status, body["type"]) == (503, "EngineUnavailable"), body
        assert "model 'segfault'" in body["message"], body
        _affine_serves(server)  # the other model never stopped
        assert server.request("GET", "/ping")[0] == 200
        answered = [future.result(timeout=30) for future in fine]
    for i, (status, _, body) in enumerate(answered, start=1):  # each answered, once
        assert (status, body) == (200, [[float(i)]]) or (status, body["type"]) in {
            (503, "EngineUnavailable"), (503, "ModelStillLoading")}, (i, status, body)

    second = _serving_process(server, "segfault", restarts=1)
    assert second != first and not _alive(first)
    assert "killed by SIGSEGV" in server.log()
    assert _post(server, "segfault", [[5.0]])[::2] == (200, [[5.0]])
    _affine_serves(server)
    assert _metric(server, r'^mmserver_model_process_restarts_total\{model="segfault"\} (\S+)$'
                   ) == 1.0
    # The child's own series (its batches) are in the server's /metrics, once.
    assert _metric(server, r'^mmserver_batch_size_rows_count\{model="segfault"\} (\S+)$') >= 1
    assert server.request("GET", "/metrics")[2].decode().count(
        'mmserver_queue_depth{model="segfault"}') == 1
    status, metadata = server.json("GET", "/v2/models/segfault")
    assert status == 200 and metadata["name"] == "segfault", metadata
    assert server.unload("segfault")[0] == 200
    assert wait_until(lambda: not _alive(second), 10)
    assert_error(server.json("GET", "/models/segfault"), 404, "ModelNotFound")
    assert not _isolation_folders() - folders_before   # another server may come and go meanwhile


def test_a_model_loading_again_in_a_new_process_answers_503_with_that_reason(server, root):
    """The request the crash cut off: engine unavailable; one that arrives while the new
    process loads the model: still loading. Each its own type, reason in /metrics and log."""
    assert server.load("gated", "gated")[0] == 200
    status, _, body = _post(server, "gated", [[-1.0]])
    assert (status, body["type"]) == (503, "EngineUnavailable"), body
    assert wait_until(lambda: _described(server, "gated")["status"] == "loading", 30)
    status, headers, raw = server.request("POST", "/models/gated/invoke", "[[1.0]]",
                                          {"Content-Type": "application/json"})
    body = assert_error((status, raw), 503, "ModelStillLoading")
    assert "loaded again" in body["message"] and int(headers["Retry-After"]) >= 1
    reasons = {reason: server.metric("mmserver_requests_unavailable_total", model="gated",
                                     reason=reason)
               for reason in ("engine_unavailable", "loading", "queue_full")}
    assert reasons == {"engine_unavailable": 1.0, "loading": 1.0, "queue_full": 0.0}
    assert server.metric("mmserver_requests_total", model="gated", status="503") == 2.0
    assert "model=gated invoke answered 503 (loading)" in server.log()
    assert "model=gated invoke answered 503 (engine_unavailable)" in server.log()
    (root / "gated" / "gate").touch()
    _serving_process(server, "gated", restarts=1)
    assert _post(server, "gated", [[2.0]])[::2] == (200, [[2.0]])
    assert server.unload("gated")[0] == 200


def test_a_model_that_kills_its_process_as_it_loads_is_failed_not_loaded_again(server, root):
    (root / "killer" / "crash-on-load").touch()
    body = assert_error(server.load("killer", "killer"), 500, "ModelError")
    assert "killed by SIGSEGV" in body["message"] and "while it loaded" in body["message"]
    assert_error(server.json("GET", "/models/killer"), 404, "ModelNotFound")
    _affine_serves(server)

    # Loaded fine, then its process is killed and the new one dies loading it again.
    assert server.load("fragile", "fragile")[0] == 200
    pid = _serving_process(server, "fragile", restarts=0)
    (root / "fragile" / "crash-on-load").touch()
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: _described(server, "fragile")["status"] == "failed", 60), \
        server.log()
    failure = _described(server, "fragile")["failure"]
    assert "killed by SIGKILL" in failure and "killed by SIGSEGV" in failure, failure
    body = assert_error(_post(server, "fragile", [[1.0]])[::2], 404, "ModelNotFound")
    assert "did not load again" in body["message"]
    assert server.json("GET", "/models")[1]["models"] == [
        {"modelName": "affine", "modelUrl": "affine"}]
    _affine_serves(server)

    # Fixed, it loads again (failure forgotten); DELETE forgets a failed model.
    (root / "fragile" / "crash-on-load").unlink()
    assert server.load("fragile", "fragile")[0] == 200
    assert _post(server, "fragile", [[4.0]])[::2] == (200, [[4.0]])
    assert server.unload("fragile")[0] == 200
    assert server.process.poll() is None


def test_an_isolated_model_holds_its_name_and_its_place_in_the_limits(root):
    """409 while its name is taken, 507 past MMSERVER_MAX_MODELS, its memory as its process
    measured it: the registry's rules hold for a model in another process."""
    with running_server(["--model-root", str(root), "--no-access-log"],
                        env={**os.environ, "MMSERVER_MAX_MODELS": "1"}) as server:
        assert server.load("slow", "slow")[0] == 200
        assert_error(server.load("slow", "slow"), 409, "ModelAlreadyLoaded")
        assert_error(server.load("affine", "affine"), 507, "InsufficientResources")
        described = _described(server, "slow")
        assert described["memoryBytes"] > 0 and described["device"] == "cpu", described
        assert server.unload("slow")[0] == 200
        assert server.load("affine", "affine")[0] == 200


def test_an_unknown_isolation_is_refused_at_load(server):
    body = assert_error(server.load("typo", "typo"), 400, "InvalidModelArtifact")
    assert "'none', 'process'" in body["message"]


def test_sigterm_answers_an_isolated_models_requests_and_leaves_nothing_behind(root):
    folders_before = _isolation_folders()
    with running_server(["--model-root", str(root), "--no-access-log"]) as server:
        assert server.load("slow", "slow")[0] == 200
        child = _serving_process(server, "slow", restarts=0)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            pending = [pool.submit(_post, server, "slow", [[float(i)]]) for i in range(1, 5)]
            assert wait_until(lambda: _described(server, "slow")["stats"]["requestsInFlight"]
                              == 4, 10)
            server.process.send_signal(signal.SIGTERM)
            assert [future.result(timeout=30)[::2] for future in pending] == [
                (200, [[float(i)]]) for i in range(1, 5)]
            assert server.process.wait(25) == 0
    assert wait_until(lambda: not _alive(child), 10)
    assert not _isolation_folders() - folders_before   # another server may come and go meanwhile


def test_with_http_workers_an_isolated_models_crash_leaves_the_engine_serving(root):
    """``MMSERVER_ISOLATION=process``: every model in a process of its own, children of
    the engine; a killed child costs neither the engine nor the other model, and SIGTERM
    leaves nothing behind."""
    folders_before = _isolation_folders()
    with running_server(["--model-root", str(root), "--no-access-log",
                         "--http-workers", str(WORKERS)],
                        env={**os.environ, "MMSERVER_ISOLATION": "process"}) as server:
        wait_for_http_workers(server.url, WORKERS, WORKER_HEADER)
        assert server.load("affine", "affine")[0] == 200
        assert server.load("segfault", "segfault")[0] == 200
        affine = _described(server, "affine")
        assert affine[ISOLATION_KEY] == ISOLATED
        victim = _serving_process(server, "segfault", restarts=0)
        assert affine["engine"]["pid"] != victim
        assert len(_isolation_folders() - folders_before) == 2
        children = _descendants(server.process.pid)
        os.kill(victim, signal.SIGKILL)
        assert _serving_process(server, "segfault", restarts=1) != victim
        assert _described(server, "affine")["engine"] == affine["engine"]
        _affine_serves(server)
        children |= _descendants(server.process.pid)
    assert wait_until(lambda: not any(_alive(pid) for pid in children), 10)
    assert not _isolation_folders() - folders_before   # another server may come and go meanwhile
