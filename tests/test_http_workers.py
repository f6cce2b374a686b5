"""``mmserver serve --http-workers 2``: two HTTP processes over one engine, as real processes.

One server for the module: each request on a fresh connection, so the kernel
(``SO_REUSEPORT``) spreads them over both workers, and every answer names its worker.
The tests check what a user relies on: a batch fills from both workers' requests, each
request runs exactly once, management answers the same through either worker, user code
runs in the one engine, ``/metrics`` counts every worker's requests, and SIGTERM leaves
no process and no socket behind. When the engine dies (SIGKILL, a segfault in a model's
code, a model that segfaults as it loads), the requests it held are answered 503 at once,
the server keeps running, and a new engine serves the models again, without the one that
killed it while loading.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from conftest import RECORDER_CODE, running_server, write_code, write_torchscript
from helpers import assert_error, wait_until

from mmserver.harness.testing import wait_for_http_workers
from mmserver.http.app import WORKER_HEADER

pytestmark = pytest.mark.slow

WORKERS = 2
#: The toolkit's input_fn/output_fn, answering which process ran them.
WHERE_CODE = """
    import json, os, torch

    def model_fn(model_dir):
        return None

    def input_fn(body, content_type):
        return torch.tensor(json.loads(body)) * 10

    def predict_fn(data, model):
        return data

    def output_fn(prediction, accept):
        return json.dumps({"rows": prediction.tolist(), "pid": os.getpid()})
"""
#: A real segfault (a read of address 0) when a request's first number is negative.
SEGFAULT_CODE = """
    import ctypes, time

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        if float(data.flatten()[0]) < 0:
            ctypes.string_at(0)
        time.sleep(0.2)
        return data
"""
#: Loads, unless its folder holds a file ``crash-on-load``: then the load segfaults.
LOAD_KILLER_CODE = """
    import ctypes, os

    def model_fn(model_dir):
        if os.path.exists(os.path.join(model_dir, "crash-on-load")):
            ctypes.string_at(0)
        return None

    def predict_fn(data, model):
        return data
"""
ONE_SECOND_CODE = """
    import time

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        time.sleep(1.0)
        return data
"""


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("worker-models")
    write_torchscript(root / "affine")
    write_code(root / "recorder", RECORDER_CODE, with_affine=True)
    write_code(root / "where", WHERE_CODE)
    write_code(root / "slow", ONE_SECOND_CODE)
    write_code(root / "segfault", SEGFAULT_CODE)
    write_code(root / "killer", LOAD_KILLER_CODE)
    write_code(root / "fragile", LOAD_KILLER_CODE)
    return root


def started_workers(root: Path, *args: str):
    """A server with :data:`WORKERS` HTTP workers, once every worker answers: ``/ping`` answers
    as soon as the first listens, and the others start (import torch) a few seconds apart."""
    server = running_server(["--model-root", str(root), "--no-access-log",
                             "--http-workers", str(WORKERS), *args])
    wait_for_http_workers(server.url, WORKERS, WORKER_HEADER)
    return server


@pytest.fixture(scope="module")
def server(root):
    with started_workers(root, "--max-wait-ms", "30") as server:
        yield server


def _post(server, name: str, rows) -> tuple[int, str | None, object]:
    status, headers, raw = server.request("POST", f"/models/{name}/invoke", json.dumps(rows),
                                          {"Content-Type": "application/json"})
    return status, headers.get(WORKER_HEADER), json.loads(raw)


def test_a_batch_fills_from_both_workers_and_each_request_runs_once(server, root):
    assert server.load("recorder", "recorder")[0] == 200
    tags = list(range(1, 49))
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda tag: _post(server, "recorder", [[float(tag), 0, 0]]),
                                tags))
    assert [(status, body) for status, _, body in answers] == [
        (200, [[2.0 * tag + 1, 1.0, 1.0]]) for tag in tags]
    worker_of = {tag: worker for tag, (_, worker, _) in zip(tags, answers)}
    assert set(worker_of.values()) == {str(i) for i in range(WORKERS)}
    batches = [json.loads(line) for line in
               (root / "recorder" / "batches.jsonl").read_text().splitlines()]
    assert sorted(int(tag) for batch in batches for tag in batch) == tags  # once each
    mixed = [batch for batch in batches if len({worker_of[int(tag)] for tag in batch}) > 1]
    print(f"{len(tags)} requests through {WORKERS} workers: {len(batches)} batches, "
          f"{len(mixed)} of them holding requests of both workers")
    assert mixed, batches
    assert server.unload("recorder")[0] == 200


def test_management_answers_the_same_through_every_worker(server):
    assert server.load("affine", "affine")[0] == 200
    seen = collections.defaultdict(set)
    for _ in range(24):  # fresh connections: both workers answer (all on one: 2**-23)
        status, headers, raw = server.request("GET", "/models/affine")
        seen[headers[WORKER_HEADER]].add((status, json.loads(raw)["status"]))
    assert seen == {str(i): {(200, "ready")} for i in range(WORKERS)}
    for _ in range(4):
        assert_error(server.load("affine", "affine"), 409, "ModelAlreadyLoaded")
        assert_error(server.json("GET", "/models/nothing"), 404, "ModelNotFound")
    assert server.json("GET", "/models")[1] == {
        "models": [{"modelName": "affine", "modelUrl": "affine"}]}
    answers = [_post(server, "affine", [[1.0, 2.0, 3.0]]) for _ in range(10)]
    assert {(status, json.dumps(body)) for status, _, body in answers} == {
        (200, "[[3.0, 5.0, 7.0]]")}
    counted = re.compile(r'^mmserver_requests_total\{model="affine",status="200"\} (\S+)$', re.M)

    def affine_count() -> float:
        match = counted.search(server.request("GET", "/metrics")[2].decode())
        return float(match.group(1)) if match else 0.0

    assert wait_until(lambda: affine_count() == 10.0, 10), affine_count()
    assert server.unload("affine")[0] == 200
    for _ in range(4):
        assert_error(server.json("GET", "/models/affine"), 404, "ModelNotFound")


def test_user_code_runs_in_the_one_engine(server):
    assert server.load("where", "where")[0] == 200
    answers = [_post(server, "where", [[1.0, 2.0]]) for _ in range(16)]
    assert {status for status, _, _ in answers} == {200}
    assert all(body["rows"] == [[10.0, 20.0]] for _, _, body in answers)
    assert len({worker for _, worker, _ in answers}) == WORKERS
    pids = {body["pid"] for _, _, body in answers}
    assert len(pids) == 1 and pids != {server.process.pid}
    assert server.unload("where")[0] == 200


def test_v2_inference_through_the_workers(server):
    triton = pytest.importorskip("tritonclient.http")
    import numpy as np

    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    client.load_model("affine")
    try:
        x = np.array([[1.0, 2.0, 3.0]], dtype=np.float32)
        for binary in (False, True):
            tensor = triton.InferInput("INPUT__0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x, binary_data=binary)
            np.testing.assert_array_equal(client.infer("affine", [tensor]).as_numpy(
                "OUTPUT__0"), [[3.0, 5.0, 7.0]])
        [stats] = client.get_inference_statistics("affine")["model_stats"]
        assert stats["inference_stats"]["success"]["count"] == 2
    finally:
        client.unload_model("affine")


# -- the processes' lives ---------------------------------------------------------------


def _descendants(pid: int) -> set[int]:
    return {child.pid for child in psutil.Process(pid).children(recursive=True)}


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _engine_folders() -> set[str]:
    return {path.name for path in Path(tempfile.gettempdir()).glob("mmserver-engine-*")}


def _shared_memory_maps(pid: int) -> int:
    """The anonymous shared-memory arenas (``engine.shared``) mapped by process ``pid``."""
    return sum(1 for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
               if "/memfd:" in line)


def _dev_shm() -> set[str]:
    return {path.name for path in Path("/dev/shm").iterdir()} if Path("/dev/shm").is_dir() \
        else set()


def test_sigterm_answers_accepted_requests_and_leaves_nothing_behind(root):
    folders_before, shm_before = _engine_folders(), _dev_shm()
    with started_workers(root) as server:
        children = _descendants(server.process.pid)
        assert len(children) >= WORKERS + 1  # the engine, the workers (and Python's tracker)
        assert len(_engine_folders() - folders_before) == 1
        # Rows cross in shared memory: two arenas per worker, both mapped by the engine.
        assert _shared_memory_maps(_engine_pid(server)) == 2 * WORKERS
        assert server.load("slow", "slow")[0] == 200
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            pending = [pool.submit(_post, server, "slow", [[float(i)]]) for i in range(4)]
            assert wait_until(lambda: _in_flight(server, "slow") == 4, 10)
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            assert [future.result(timeout=30)[::2] for future in pending] == [
                (200, [[float(i)]]) for i in range(4)]
            assert server.process.wait(25) == 0
            print(f"SIGTERM to exit with 4 requests in flight: {time.monotonic() - started:.1f} s")
    assert wait_until(lambda: not any(_alive(pid) for pid in children), 10)
    # Only what this server made: another server on the machine may come and go meanwhile.
    assert not _engine_folders() - folders_before
    assert not _dev_shm() - shm_before  # the arenas had no name there, and nothing else was made


# -- the engine's death ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def crashing(root):
    """A server whose engine the tests kill, with a model that stays loaded throughout."""
    with started_workers(root) as server:
        assert server.load("affine", "affine")[0] == 200
        yield server


def _engine(server) -> dict[str, int]:
    """The engine serving ``affine`` (its pid, the engines that died before it), once every
    HTTP worker reaches the same one. Each request is a fresh connection, which the kernel
    gives to either worker, and each worker reconnects to a new engine on its own: one
    worker's answer says nothing of the other's."""
    by_worker: dict[str | None, dict[str, int]] = {}

    def serving() -> bool:
        status, headers, raw = server.request("GET", "/models/affine")
        worker = headers.get(WORKER_HEADER)
        if status == 200:
            by_worker[worker] = json.loads(raw)["engine"]
        else:
            by_worker.pop(worker, None)
        engines = {tuple(sorted(engine.items())) for engine in by_worker.values()}
        return len(by_worker.keys() - {None}) == WORKERS and len(engines) == 1

    assert wait_until(serving, 60), server.log()
    return next(iter(by_worker.values()))


def _restarts_metric(server) -> float:
    raw = server.request("GET", "/metrics")[2].decode()
    return float(re.search(r"^mmserver_engine_restarts_total (\S+)$", raw, re.M).group(1))


def _in_flight(server, name: str) -> int:
    return server.json("GET", f"/models/{name}")[1]["stats"]["requestsInFlight"]


def _affine_serves(server) -> None:
    assert _post(server, "affine", [[1.0, 2.0, 3.0]])[::2] == (200, [[3.0, 5.0, 7.0]])


def test_a_killed_engine_fails_its_requests_at_once_and_a_new_one_serves_the_same_models(
        crashing):
    server = crashing
    before = _engine(server)
    assert server.load("slow", "slow")[0] == 200
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pending = pool.submit(server.request, "POST", "/models/slow/invoke", "[[1.0]]",
                              {"Content-Type": "application/json"})
        assert wait_until(lambda: _in_flight(server, "slow") == 1, 10)
        started = time.monotonic()
        os.kill(before["pid"], signal.SIGKILL)
        answer = pending.result(timeout=10)
        body = assert_error(answer, 503, "EngineUnavailable")
        assert "ended while it ran this request" in body["message"]
        assert answer[1]["Retry-After"] == "1"
        assert time.monotonic() - started < 5
    after = _engine(server)
    assert after["pid"] != before["pid"] and after["restarts"] == before["restarts"] + 1
    assert server.process.poll() is None
    assert server.json("GET", "/models")[1] == {"models": [
        {"modelName": "affine", "modelUrl": "affine"}, {"modelName": "slow", "modelUrl": "slow"}]}
    _affine_serves(server)
    assert _post(server, "slow", [[2.0]])[::2] == (200, [[2.0]])
    assert _restarts_metric(server) == after["restarts"]
    # The 503 the lost engine could not count is counted by the next one, with its reason.
    assert wait_until(lambda: server.metric("mmserver_requests_unavailable_total", model="slow",
                                            reason="engine_unavailable") == 1, 10)
    assert server.unload("slow")[0] == 200


def test_a_segfault_in_a_models_code_answers_every_request_once_and_the_server_recovers(
        crashing):
    server = crashing
    before = _engine(server)
    assert server.load("segfault", "segfault")[0] == 200
    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        fine = [pool.submit(_post, server, "segfault", [[float(i)]]) for i in range(1, 9)]
        assert wait_until(lambda: _in_flight(server, "segfault") >= 1, 10)
        crash = pool.submit(_post, server, "segfault", [[-1.0]])
        status, _, body = crash.result(timeout=30)
        assert (status, body["type"]) == (503, "EngineUnavailable"), body
        answered = [future.result(timeout=30) for future in fine]
    for i, (status, _, body) in enumerate(answered, start=1):  # each answered, once
        assert (status, body) == (200, [[float(i)]]) or \
            (status, body["type"]) == (503, "EngineUnavailable"), (i, status, body)
    after = _engine(server)
    assert after["restarts"] == before["restarts"] + 1
    assert "killed by SIGSEGV" in server.log()
    assert _post(server, "segfault", [[5.0]])[::2] == (200, [[5.0]])
    _affine_serves(server)
    assert server.unload("segfault")[0] == 200


def test_a_model_that_kills_the_engine_as_it_loads_is_marked_failed_not_loaded_again(
        crashing, root):
    server = crashing
    before = _engine(server)
    (root / "killer" / "crash-on-load").touch()
    assert_error(server.load("killer", "killer"), 503, "EngineUnavailable")
    after = _engine(server)
    assert after["restarts"] == before["restarts"] + 1
    status, described = server.json("GET", "/models/killer")
    assert (status, described["status"]) == (200, "failed"), described
    assert "killed by SIGSEGV" in described["failure"] and "while it was loading" in \
        described["failure"]
    body = assert_error(_post(server, "killer", [[1.0]])[::2], 404, "ModelNotFound")
    assert "killed by SIGSEGV" in body["message"]
    assert server.json("GET", "/models")[1]["models"] == [
        {"modelName": "affine", "modelUrl": "affine"}]
    _affine_serves(server)

    # A model that loaded, then kills the new engine as it is loaded again: marked failed
    # too, and the engine after that one serves the rest.
    assert server.load("fragile", "fragile")[0] == 200
    (root / "fragile" / "crash-on-load").touch()
    os.kill(after["pid"], signal.SIGKILL)
    assert wait_until(lambda: server.json("GET", "/models/fragile")[1].get("status")
                      == "failed", 60), server.log()
    last = _engine(server)
    assert last["restarts"] == after["restarts"] + 2  # the killed engine, and the one that
    assert "killed by SIGSEGV" in server.json("GET", "/models/fragile")[1]["failure"]  # reloaded
    _affine_serves(server)
    assert _restarts_metric(server) == last["restarts"]

    # Fixed, a failed model loads again; DELETE forgets a failed one.
    (root / "killer" / "crash-on-load").unlink()
    assert server.load("killer", "killer")[0] == 200
    assert _post(server, "killer", [[4.0]])[::2] == (200, [[4.0]])
    assert server.unload("fragile")[0] == 200
    assert_error(server.json("GET", "/models/fragile"), 404, "ModelNotFound")
    assert server.process.poll() is None


def test_an_engine_that_cannot_start_again_ends_the_server(root):
    """No load was under way when the new engine died, so nothing is to blame and another
    would most likely die the same way: the server ends (exit 1), leaving nothing behind.
    Here the engine's folder is gone, so the new engine cannot write its journal."""
    folders_before = _engine_folders()
    with started_workers(root) as server:
        [folder] = _engine_folders() - folders_before
        engine = _engine_pid(server)
        children = _descendants(server.process.pid)
        shutil.rmtree(Path(tempfile.gettempdir()) / folder)
        os.kill(engine, signal.SIGKILL)
        assert server.process.wait(60) == 1
        assert "died before it served" in server.log()
    assert wait_until(lambda: not any(_alive(pid) for pid in children), 10)


def _engine_pid(server) -> int:
    match = re.search(r"over one engine \(pid (\d+)\)", server.log())
    assert match, server.log()
    return int(match.group(1))
