"""Hostile models, slow clients and open doors, each against a real server process.

Every test here reproduces one defect of issue 14 the way it was first seen
(``python -m mmserver serve`` in a subprocess, real sockets) and asserts the
exact answer the server must now give, and that the server is healthy
afterwards. Time limits are shortened through the environment so that nothing
takes long and nothing can hang: every request has a client timeout, every
test a pytest timeout, and every server is stopped by its ``with`` block.
"""

from __future__ import annotations

import concurrent.futures
import io
import json
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch
from conftest import SLOW_CODE, running_server, write_code, write_torchscript
from helpers import assert_error, model_stats, wait_for_in_flight, wait_until

from mmserver.harness.testing import http_request

#: The short limits every server of this module runs under.
SHORT_LIMITS = {
    "SAGEMAKER_MODEL_SERVER_TIMEOUT": "2",
    "MMSERVER_BODY_TIMEOUT": "1",
    "MMSERVER_LOAD_TIMEOUT": "2",
}
JSON_HEADERS = {"Content-Type": "application/json"}
#: SageMaker kills the container 30 s after SIGTERM; the server promises 25 s.
SIGTERM_DEADLINE_SECONDS = 25

pytestmark = pytest.mark.timeout(120)


class Mean(torch.nn.Module):
    """One number per row whatever the row's shape: images go in, a small answer comes out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1).mean(1, keepdim=True)


# -- the model folders ------------------------------------------------------------------

NEVER_RETURNS = "threading.Event().wait()"


@pytest.fixture(scope="module")
def outside(tmp_path_factory) -> Path:
    """A folder outside every model root, with code that leaves a mark if it ever runs."""
    folder = tmp_path_factory.mktemp("outside")
    marker = folder / "code-ran"
    write_code(folder / "evil", f"""
        from pathlib import Path
        Path({str(marker)!r}).write_text("ran")

        def model_fn(model_dir):
            return lambda x: x
    """)
    write_torchscript(folder / "weights")
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory, outside) -> Path:
    root = tmp_path_factory.mktemp("reliability-models")
    write_torchscript(root / "affine")
    write_torchscript(root / "mean", Mean(), torch.ones(2, 3, 4, 4))
    write_torchscript(root / "wide", torch.nn.Linear(16, 4), torch.ones(2, 16))
    write_code(root / "slow", SLOW_CODE)
    write_code(root / "predict_exit", """
        def model_fn(model_dir):
            return None

        def predict_fn(data, model):
            raise SystemExit(3)
    """)
    write_code(root / "predict_interrupt", """
        def model_fn(model_dir):
            return None

        def predict_fn(data, model):
            raise KeyboardInterrupt
    """)
    write_code(root / "argparse_at_import", """
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, required=True)
        args = parser.parse_args()   # a training script: exits with 2 when imported

        def model_fn(model_dir):
            return None
    """)
    write_code(root / "model_fn_exit", """
        import sys

        def model_fn(model_dir):
            sys.exit()
    """)
    write_code(root / "hang_predict", f"""
        import threading

        def model_fn(model_dir):
            return None

        def predict_fn(data, model):
            {NEVER_RETURNS}
    """)
    write_code(root / "hang_load", f"""
        import threading

        def model_fn(model_dir):
            {NEVER_RETURNS}
    """)
    write_code(root / "slow_input", """
        import json, time, torch

        def model_fn(model_dir):
            return None

        def input_fn(body, content_type):
            time.sleep(1.2)
            return torch.tensor(json.loads(body), dtype=torch.float32)

        def predict_fn(data, model):
            return data * 2 + 1
    """)
    write_code(root / "keyerror_input", """
        import json

        def model_fn(model_dir):
            return None

        def input_fn(body, content_type):
            return json.loads(body)["instances"]   # KeyError for {"rows": ...}

        def predict_fn(data, model):
            return data
    """)
    write_code(root / "big_alloc", """
        import torch

        def model_fn(model_dir):
            held = torch.ones(300 * 2**20 // 4)   # 300 MiB, in no weight file
            return lambda x: x * 2 + 1 + 0 * held[0]
    """)
    write_code(root / "small_alloc", """
        def model_fn(model_dir):
            return lambda x: x * 2 + 1
    """)
    # Symlinks inside model folders: out of every root (refused) and within one (fine).
    (root / "linked_code").mkdir()
    (root / "linked_code" / "code").symlink_to(outside / "evil" / "code")
    (root / "linked_weights").mkdir()
    (root / "linked_weights" / "model.pt").symlink_to(outside / "weights" / "model.pt")
    (root / "linked_inside").mkdir()
    (root / "linked_inside" / "model.pt").symlink_to(root / "affine" / "model.pt")
    return root


@pytest.fixture(scope="module")
def srv(root):
    """The server most tests share: short limits, quiet access log."""
    with running_server(["--model-root", str(root), "--no-access-log"], SHORT_LIMITS) as s:
        yield s


# -- helpers ------------------------------------------------------------------------------


def assert_healthy(server, affine_name: str = "affine-ok") -> None:
    """/ping answers at once and a known model still answers exactly."""
    status, _, _ = server.request("GET", "/ping", timeout=5)
    assert status == 200
    if server.json("GET", f"/models/{affine_name}", timeout=10)[0] == 404:
        assert server.load(affine_name, "affine")[0] == 200
    assert server.invoke(affine_name, [[1.0, 2.0]], timeout=10) == (200, [[3.0, 5.0]])


def raw_request_start(port: int, method: str, path: str, headers: dict[str, str],
                      body_prefix: bytes = b"") -> socket.socket:
    """A socket that has sent a request's head and the first bytes of its body, no more."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    sock.sendall(head.encode() + body_prefix)
    return sock


def read_status(sock: socket.socket, timeout: float) -> int | None:
    """The status of the response on ``sock``, or None when the server closes without one."""
    sock.settimeout(timeout)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except (TimeoutError, ConnectionResetError):
        return None
    finally:
        sock.close()
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else None


def trickle(port: int, model: str) -> socket.socket:
    """A client that promises 100 bytes of body and sends one."""
    return raw_request_start(port, "POST", f"/models/{model}/invoke",
                             {"Content-Type": "application/json", "Content-Length": "100"}, b"[")


def ping_seconds(server) -> float:
    started = time.perf_counter()
    assert server.request("GET", "/ping", timeout=10)[0] == 200
    return time.perf_counter() - started


def sigterm_seconds(server) -> tuple[float, int]:
    """Send SIGTERM; (seconds until the process exited, its exit status)."""
    started = time.perf_counter()
    server.process.send_signal(signal.SIGTERM)
    try:
        code = server.process.wait(SIGTERM_DEADLINE_SECONDS + 10)
    except Exception:  # noqa: BLE001 - killed below by the with block's stop()
        return float("inf"), -1
    return time.perf_counter() - started, code


# -- 1. user code cannot end the server -------------------------------------------------


def test_system_exit_and_keyboard_interrupt_in_predict_fn_fail_the_request_only(srv):
    for name in ("predict_exit", "predict_interrupt"):
        assert srv.load(name, name)[0] == 200
        body = assert_error(srv.invoke(name, [[1.0]], timeout=10), 500, "ModelError")
        assert ("SystemExit" if name == "predict_exit" else "KeyboardInterrupt") in body["message"]
        assert srv.process.poll() is None
        assert srv.invoke(name, [[1.0]], timeout=10)[0] == 500  # and again: the thread lives
        assert srv.unload(name)[0] == 200
    assert_healthy(srv)


@pytest.mark.parametrize("name, cause", [("argparse_at_import", "SystemExit"),
                                         ("model_fn_exit", "SystemExit")])
def test_exiting_at_import_or_in_model_fn_fails_the_load_with_400(srv, name, cause):
    body = assert_error(srv.load(name, name), 400)
    assert cause in body["message"], body
    assert srv.process.poll() is None
    assert srv.json("GET", f"/models/{name}")[0] == 404  # the name is free again
    assert_healthy(srv)


# -- 2. time limits -----------------------------------------------------------------------


def test_trickling_bodies_get_408_and_hold_no_queue_slot(root):
    with running_server(["--model-root", str(root), "--no-access-log",
                         "--max-queue-size", "4"], SHORT_LIMITS) as server:
        assert server.load("affine", "affine")[0] == 200
        socks = [trickle(server.port, "affine") for _ in range(32)]
        time.sleep(0.2)
        # The queue holds 4; 32 trickling clients must not take any of it.
        for i in range(6):
            assert server.invoke("affine", [[float(i)]], timeout=5) == (200, [[2.0 * i + 1]])
        statuses = [read_status(s, timeout=10) for s in socks]
        assert statuses == [408] * len(socks)
        assert server.metric("mmserver_requests_total", model="affine", status="408") == 32
        assert server.invoke("affine", [[1.0]], timeout=5) == (200, [[3.0]])


def test_a_trickling_client_neither_blocks_delete_nor_sigterm(root):
    """Default body timeout (15 s): DELETE drains within the model timeout; SIGTERM within 25 s."""
    env = {"SAGEMAKER_MODEL_SERVER_TIMEOUT": "2"}
    with running_server(["--model-root", str(root), "--no-access-log"], env) as server:
        assert server.load("affine", "affine")[0] == 200
        sock = trickle(server.port, "affine")
        time.sleep(0.2)
        started = time.perf_counter()
        assert server.unload("affine")[0] == 200
        assert time.perf_counter() - started < 5
        sock.close()
        assert server.load("affine", "affine")[0] == 200
        socks = [trickle(server.port, "affine") for _ in range(4)]
        time.sleep(0.2)
        seconds, code = sigterm_seconds(server)
        for s in socks:
            s.close()
        assert seconds < SIGTERM_DEADLINE_SECONDS and code == 0, (seconds, code)


def test_a_predict_fn_that_never_returns(srv):
    assert srv.load("hang", "hang_predict")[0] == 200
    started = time.perf_counter()
    assert_error(srv.invoke("hang", [[1.0]], timeout=15), 504, "InvocationTimeout")
    assert time.perf_counter() - started < 6
    assert wait_until(lambda: srv.json("GET", "/models/hang")[1]["status"] == "unhealthy", 5)
    described = srv.json("GET", "/models/hang")[1]
    assert "SAGEMAKER_MODEL_SERVER_TIMEOUT" in described["health"], described
    assert_error(srv.invoke("hang", [[1.0]], timeout=10), 503, "ModelUnhealthy")
    assert_healthy(srv)
    started = time.perf_counter()
    assert srv.unload("hang")[0] == 200
    assert time.perf_counter() - started < 5
    assert srv.json("GET", "/models/hang")[0] == 404
    assert_healthy(srv)


def test_sigterm_exits_promptly_with_a_stuck_predict_fn(root):
    with running_server(["--model-root", str(root), "--no-access-log"], SHORT_LIMITS) as server:
        assert server.load("hang", "hang_predict")[0] == 200
        assert server.load("affine", "affine")[0] == 200
        assert server.invoke("hang", [[1.0]], timeout=15)[0] == 504
        seconds, code = sigterm_seconds(server)
        assert seconds < SIGTERM_DEADLINE_SECONDS and code == 0, (seconds, code)


#: A load that is still inside torch's C++ when the server stops: it says so in a file, then
#: multiplies matrices for up to a minute.
NATIVE_LOAD_CODE = """
    import os, time, torch

    def model_fn(model_dir):
        open(os.environ["NATIVE_LOAD_MARKER"], "w").close()
        a, stop = torch.ones(300, 300), time.monotonic() + 60
        while time.monotonic() < stop:
            a = torch.tanh(a @ a / 300)
        return lambda x: x
"""


def test_sigterm_under_load_with_a_load_inside_native_code_exits_0(tmp_path):
    """Finalization must never meet a worker thread inside torch's C++: the C++ runtime then
    aborts the process (exit -6, "terminate called without an active exception")."""
    root = tmp_path / "models"
    write_torchscript(root / "affine")
    write_code(root / "native_load", NATIVE_LOAD_CODE)
    marker = tmp_path / "load-started"
    env = {"NATIVE_LOAD_MARKER": str(marker), "MMSERVER_LOAD_TIMEOUT": "120",
           "MMSERVER_SHUTDOWN_TIMEOUT": "3"}
    with running_server(["--model-root", str(root), "--no-access-log", "--preload",
                         "affine=affine"], env) as server:
        statuses, stop = [], threading.Event()

        def client():
            while not stop.is_set():
                try:
                    statuses.append(server.invoke("affine", [[1.0, 2.0, 3.0]], timeout=10)[0])
                except OSError:  # refused or reset once the server has stopped listening
                    return

        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            clients = [pool.submit(client) for _ in range(4)]
            loading = pool.submit(server.load, "native_load", "native_load")
            assert wait_until(marker.exists, 60)
            assert wait_until(lambda: len(statuses) >= 20, 30)
            seconds, code = sigterm_seconds(server)
            stop.set()
            for future in [*clients, loading]:
                future.exception(timeout=30)  # every client returns: nothing hangs
        log = server.log()
        assert "terminate called" not in log, log[-2000:]
        assert seconds < SIGTERM_DEADLINE_SECONDS and code == 0, (seconds, code, log[-2000:])
        assert "call(s) still running in worker threads after the drain" in log
        assert set(statuses) <= {200, 503} and statuses.count(200) >= 20, statuses


def test_model_fns_that_never_return_time_out_and_block_nothing(srv):
    big_rows = [[float(i % 7), 1.0] for i in range(8000)]  # ~80 KB: decoded in a thread
    with concurrent.futures.ThreadPoolExecutor(9) as pool:
        hung = [pool.submit(srv.load, f"hung{i}", "hang_load") for i in range(7)]
        assert wait_until(lambda: all(srv.json("GET", f"/models/hung{i}")[0] == 200 for i in range(7)), 30)
        started = time.perf_counter()
        assert srv.load("good-while-hung", "affine")[0] == 200
        status, rows = srv.invoke("good-while-hung", big_rows, timeout=10)
        assert status == 200 and rows == [[2 * a + 1, 3.0] for a, _ in big_rows]
        assert time.perf_counter() - started < 5
        for future in hung:
            assert_error(future.result(timeout=15), 504, "LoadTimeout")
    for i in range(7):
        assert srv.json("GET", f"/models/hung{i}")[0] == 404
    assert srv.unload("good-while-hung")[0] == 200
    assert_healthy(srv)


# -- 3. a client hanging up on DELETE -----------------------------------------------------


def test_a_disconnecting_delete_still_answers_every_accepted_request(srv):
    assert srv.load("slowdel", "slow")[0] == 200
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(srv.invoke, "slowdel", [[0.5]], None, 15) for _ in range(4)]
        wait_for_in_flight(srv, "slowdel", 4)
        sock = raw_request_start(srv.port, "DELETE", "/models/slowdel", {})
        assert wait_until(lambda: srv.json("GET", "/models/slowdel")[1].get("status") == "unloading", 10)
        sock.close()  # hang up on the DELETE
        results = [f.result(timeout=15) for f in futures]
    assert results == [(200, [[2.0]])] * 4
    assert wait_until(lambda: srv.json("GET", "/models/slowdel")[0] == 404, 5)
    assert_healthy(srv)


# -- 4. the event loop stays free ---------------------------------------------------------


def test_a_slow_input_fn_does_not_stall_ping(srv):
    assert srv.load("slow-input", "slow_input")[0] == 200
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answer = pool.submit(srv.invoke, "slow-input", [[1.0]], None, 15)
        # Its slot is taken before input_fn runs: queued (reserved) while input_fn sleeps.
        assert wait_until(lambda: model_stats(srv, "slow-input").get("queueDepth") == 1, 10)
        assert ping_seconds(srv) < 0.5
        assert answer.result(timeout=15) == (200, [[3.0]])
    assert srv.unload("slow-input")[0] == 200


def test_decoding_large_compressed_images_does_not_stall_ping(root):
    side = 4990
    buffer = io.BytesIO()
    PIL.Image.new("RGB", (side, side), (255, 0, 0)).save(buffer, "PNG", optimize=True)
    png = buffer.getvalue()
    assert len(png) < 100_000  # small on the wire, 25 MP once decoded
    with running_server(["--model-root", str(root), "--no-access-log"]) as server:
        assert server.load("mean", "mean")[0] == 200
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(server.request, "POST", "/models/mean/invoke", png,
                                   {"Content-Type": "image/png"}, 60) for _ in range(2)]
            # Ping from the start to the last answer, so the pings span both decodes
            # whichever process decodes them (an HTTP worker holds no engine queue slot yet).
            pings = []
            while not all(f.done() for f in futures):
                pings.append(ping_seconds(server))
                time.sleep(0.05)
            results = [f.result() for f in futures]
        for status, _, raw in results:
            assert status == 200, raw
            assert json.loads(raw) == [[pytest.approx(1 / 3, abs=1e-5)]]
        assert len(pings) >= 3, pings  # decoding 25 MP twice takes seconds
        assert max(pings) < 1.0, pings
        assert_healthy(server)


# -- 5. anonymous 500s become named answers -------------------------------------------------


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _npy_with_header_shape(shape: tuple[int, ...]) -> bytes:
    """A valid .npy header that claims ``shape``, followed by a few bytes of data."""
    header = repr({"descr": "<f4", "fortran_order": False, "shape": shape}).encode()
    header += b" " * (-(10 + len(header) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header + b"\0" * 64


def _counted(server, model: str, status: int) -> float:
    return server.metric("mmserver_requests_total", model=model, status=str(status))


def test_a_url_component_over_255_bytes_is_400(srv):
    for url in ("a" * 300, "affine/" + "b" * 300, "/" + "c" * 300 + "/model"):
        assert_error(srv.load("longurl", url), 400, "InvalidRequest")
    assert_healthy(srv)


@pytest.mark.parametrize("what, body", [
    ("float128", _npy(np.zeros((1, 3), dtype=np.longdouble))),
    ("huge header shape", _npy_with_header_shape((10**11, 16))),
])
def test_hostile_npy_bodies_are_4xx_and_counted(srv, what, body):
    if srv.json("GET", "/models/npy-target")[0] == 404:
        assert srv.load("npy-target", "affine")[0] == 200
    before = {s: _counted(srv, "npy-target", s) for s in (400, 413, 415, 500)}
    log_size = len(srv.log())
    status, _, raw = srv.request("POST", "/models/npy-target/invoke", body,
                                 {"Content-Type": "application/x-npy"}, timeout=15)
    assert status in (400, 413), (what, status, raw)
    assert_error((status, raw), status)
    assert _counted(srv, "npy-target", status) == before.get(status, 0) + 1
    assert "Traceback" not in srv.log()[log_size:]
    assert_healthy(srv)


def test_a_key_error_in_input_fn_is_answered_and_counted(srv):
    assert srv.load("keyerror", "keyerror_input")[0] == 200
    before = {s: _counted(srv, "keyerror", s) for s in (400, 500)}
    log_size = len(srv.log())
    status, body = srv.invoke("keyerror", {"rows": [[1.0]]}, timeout=10)
    assert status in (400, 500), body
    assert_error((status, body), status)
    assert "KeyError" in body["message"] and "instances" in body["message"], body
    assert _counted(srv, "keyerror", status) == before[status] + 1
    assert "Traceback" not in srv.log()[log_size:]
    assert srv.unload("keyerror")[0] == 200
    assert_healthy(srv)


def test_a_wrong_width_request_logs_one_line_without_a_trace(srv):
    assert srv.load("wide", "wide")[0] == 200
    for _ in range(3):  # the first call may log its own warm-up lines
        log_size = len(srv.log())
        body = assert_error(srv.invoke("wide", [[1.0, 2.0, 3.0]], timeout=10), 500, "ModelError")
        assert "wide" in body["message"]
        assert wait_until(lambda: "wide" in srv.log()[log_size:], 10), "the failure was not logged"
        logged = srv.log()[log_size:]
    assert "Traceback" not in logged
    assert len(logged.strip().splitlines()) <= 1 and len(logged) < 800, logged
    assert srv.metric("mmserver_requests_total", model="wide", status="500") == 3
    assert srv.invoke("wide", [[1.0] * 16], timeout=10)[0] == 200
    assert srv.unload("wide")[0] == 200


# -- 6. the memory budget counts what model_fn allocates --------------------------------


def test_memory_allocated_by_model_fn_counts_against_the_budget(root):
    env = {**SHORT_LIMITS, "MMSERVER_LOAD_TIMEOUT": "30", "MMSERVER_MEMORY_BUDGET_MB": "200"}
    with running_server(["--model-root", str(root), "--no-access-log"], env) as server:
        body = assert_error(server.load("big", "big_alloc"), 507, "InsufficientResources")
        assert "measured" in body["message"], body
        assert server.json("GET", "/models/big")[0] == 404
        assert server.load("small", "small_alloc")[0] == 200
        assert server.invoke("small", [[1.0]], timeout=10) == (200, [[3.0]])


# -- 7. /metrics does not grow with the names ever loaded -----------------------------------


def test_metrics_of_unloaded_models_are_removed(srv):
    def cycle(name: str, every_status: bool = False) -> None:
        assert srv.load(name, "affine")[0] == 200
        assert srv.invoke(name, [[1.0]], timeout=10) == (200, [[3.0]])
        if every_status:
            assert srv.invoke(name, "not rows", timeout=10)[0] == 400
        assert srv.unload(name)[0] == 200
        if every_status:
            assert srv.invoke(name, [[1.0]], timeout=10)[0] == 404  # counted as "(not loaded)"

    cycle("churn-warmup", every_status=True)
    start = len(srv.request("GET", "/metrics")[2])
    for i in range(100):
        cycle(f"churn-{i:03d}", every_status=i % 10 == 0)
    text = srv.request("GET", "/metrics")[2].decode()
    assert "churn-0" not in text
    assert len(text) <= start + 200, (start, len(text))
    assert srv.metric("mmserver_requests_total", model="(not loaded)", status="404") >= 11


# -- 8. open doors --------------------------------------------------------------------------


@pytest.mark.parametrize("folder", ["linked_code", "linked_weights"])
def test_symlinks_out_of_the_model_roots_are_refused_before_any_code_runs(srv, outside,
                                                                          folder):
    body = assert_error(srv.load(folder, folder), 400, "UrlOutsideModelRoots")
    assert "model roots" in body["message"]
    assert not (outside / "code-ran").exists()
    assert srv.json("GET", f"/models/{folder}")[0] == 404
    assert_healthy(srv)


def test_a_symlink_within_the_model_roots_is_fine(srv):
    assert srv.load("linked-inside", "linked_inside")[0] == 200
    assert srv.invoke("linked-inside", [[1.0]], timeout=10) == (200, [[3.0]])
    assert srv.unload("linked-inside")[0] == 200


def test_the_management_token_guards_load_and_unload_only(root):
    env = {**SHORT_LIMITS, "MMSERVER_MANAGEMENT_TOKEN": "s3cret-token"}
    good = {"Authorization": "Bearer s3cret-token"}
    load = {"model_name": "affine", "url": "affine"}
    with running_server(["--model-root", str(root), "--no-access-log"], env) as server:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"},
                        {"Authorization": "Basic czNjcmV0LXRva2Vu"}):
            status, answer_headers, raw = server.request(
                "POST", "/models", json.dumps(load), {**JSON_HEADERS, **headers}, timeout=10)
            assert_error((status, raw), 401, "Unauthorized")
            assert answer_headers["WWW-Authenticate"] == "Bearer", raw
        assert server.json("POST", "/models", load, good)[0] == 200
        # Invocations, health, metrics and listing stay open.
        assert server.invoke("affine", [[1.0]], timeout=10) == (200, [[3.0]])
        assert server.json("POST", "/invocations", [[1.0]],
                           {"X-Amzn-SageMaker-Target-Model": "affine"}) == (200, [[3.0]])
        assert server.request("GET", "/ping")[0] == 200
        assert server.request("GET", "/metrics")[0] == 200
        assert server.json("GET", "/models")[0] == 200
        assert server.json("GET", "/models/affine")[0] == 200
        status, answer_headers, raw = server.request("DELETE", "/models/affine", timeout=10)
        assert_error((status, raw), 401, "Unauthorized")
        assert answer_headers["WWW-Authenticate"] == "Bearer"
        assert server.invoke("affine", [[1.0]], timeout=10) == (200, [[3.0]])
        assert server.json("DELETE", "/models/affine", None, good)[0] == 200


def test_without_a_token_management_needs_no_header(srv):
    assert srv.load("no-token", "affine")[0] == 200
    assert srv.unload("no-token")[0] == 200
    _, headers, _ = http_request(srv.url, "GET", "/ping")
    assert "WWW-Authenticate" not in headers
