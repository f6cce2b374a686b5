"""The server under concurrency, churn, overload, unloads and shutdown: nothing hangs, nothing is lost."""

from __future__ import annotations

import concurrent.futures
import random
import signal
import socket
import threading
import time

import psutil
import pytest
from conftest import running_server, write_torchscript
from helpers import assert_error, wait_for_in_flight, wait_until


def test_concurrent_invokes_across_models_get_exact_answers(server, model_root):
    names = ["c-affine", "c-affine2"]
    for name, url in zip(names, ("affine", "affine2")):
        assert server.load(name, model_root / url)[0] == 200
    try:
        def call(i):
            name = names[i % 2]
            rows = [[float(i), float(i + 1)]] * (1 + i % 3)
            return i, rows, server.invoke(name, rows)

        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            results = list(pool.map(call, range(400)))
        for i, rows, (status, body) in results:
            assert status == 200
            assert body == [[2 * v + 1 for v in row] for row in rows], i
        batched = sum(server.metric("mmserver_batch_size_rows_count", model=n) for n in names)
        assert batched < 400  # some requests shared a model call
    finally:
        for name in names:
            server.request("DELETE", f"/models/{name}")


def test_concurrent_loads_of_one_name_give_one_200(server, model_root):
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(lambda _: server.load("racy", model_root / "affine")[0],
                                 range(8)))
    try:
        assert sorted(statuses) == [200] + [409] * 7
    finally:
        server.request("DELETE", "/models/racy")


def test_a_model_still_loading_is_described_but_not_served_or_unloaded(server, model_root):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        loading = pool.submit(server.load, "loading", model_root / "slow_load")
        assert wait_until(lambda: server.json("GET", "/models/loading")[0] == 200, 30)
        status, body = server.json("GET", "/models/loading")
        assert status == 200 and body["status"] == "loading"
        assert_error(server.json("DELETE", "/models/loading"), 409, "ModelLoading")
        assert server.invoke("loading", [[1.0]])[0] == 404
        assert server.load("loading", model_root / "affine")[0] == 409
        assert loading.result(timeout=30)[0] == 200
    assert server.json("GET", "/models/loading")[1]["status"] == "ready"
    assert server.invoke("loading", [[1.0]]) == (200, [[3.0]])
    assert server.json("DELETE", "/models/loading")[0] == 200


def test_a_full_queue_answers_503_with_retry_after(model_root):
    with running_server(["--model-root", str(model_root), "--no-access-log",
                         "--max-queue-size", "2", "--max-batch-size", "1"]) as server:
        assert server.load("slow", model_root / "slow")[0] == 200
        with concurrent.futures.ThreadPoolExecutor(10) as pool:
            futures = [pool.submit(server.request, "POST", "/models/slow/invoke", b"[[0.5]]",
                                   {"Content-Type": "application/json"}) for _ in range(10)]
            results = [f.result() for f in futures]
        statuses = sorted(status for status, _, _ in results)
        assert statuses.count(200) >= 3
        assert statuses.count(503) >= 1
        assert set(statuses) == {200, 503}
        for status, headers, raw in results:
            if status == 503:
                assert_error((status, raw), 503, "QueueFull")
                assert int(headers["Retry-After"]) >= 1
        assert server.invoke("slow", [[0.015625]]) == (200, [[1.03125]])
        shed = statuses.count(503)  # each counted as shed, under its reason, beside its status
        assert server.metric("mmserver_requests_unavailable_total", model="slow",
                             reason="queue_full") == shed
        assert server.metric("mmserver_requests_total", model="slow", status="503") == shed


def test_out_of_memory_batches_are_retried_smaller_then_507(server, model_root):
    assert server.load("oom", model_root / "oom")[0] == 200
    try:
        # 3 rows alone: OOM
        assert_error(server.invoke("oom", [[1.0], [2.0], [3.0]]), 507, "ModelOutOfMemory")
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            results = list(pool.map(lambda i: server.invoke("oom", [[float(i)]]), range(24)))
        assert all(r == (200, [[2.0 * i + 1]]) for i, r in enumerate(results))
        assert server.invoke("oom", [[1.0]]) == (200, [[3.0]])
    finally:
        server.request("DELETE", "/models/oom")


def test_unload_lets_accepted_requests_finish(server, model_root):
    assert server.load("draining", model_root / "slow")[0] == 200
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(server.invoke, "draining", [[0.25]]) for _ in range(6)]
        wait_for_in_flight(server, "draining", 6)
        status, _ = server.json("DELETE", "/models/draining")
        assert status == 200
        results = [f.result(timeout=30) for f in futures]
    assert all(r == (200, [[1.5]]) for r in results), results
    assert server.invoke("draining", [[0.0]])[0] == 404


def test_unload_waits_for_answers_to_be_encoded_by_the_models_own_output_fn(server, model_root):
    for round_ in range(3):
        assert server.load("custom-out", model_root / "slow_custom_output")[0] == 200
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(server.invoke, "custom-out", [[float(i)]]) for i in range(6)]
            wait_for_in_flight(server, "custom-out", 6)
            assert server.json("DELETE", "/models/custom-out")[0] == 200
            results = [f.result(timeout=30) for f in futures]
        assert results == [(200, {"answer": [[2.0 * i + 1]]}) for i in range(6)], round_


def test_listing_under_churn_shows_each_stable_model_exactly_once(server, model_root):
    stable = [f"m{i:02d}" for i in range(0, 12, 2)]
    churning = [f"m{i:02d}" for i in range(1, 12, 2)]
    for name in stable:
        assert server.load(name, model_root / name)[0] == 200
    rng = random.Random(7)
    try:
        for _ in range(5):
            seen, token = [], None
            while True:
                query = "/models?limit=2" + (f"&next_page_token={token}" if token else "")
                status, body = server.json("GET", query)
                assert status == 200
                seen += [m["modelName"] for m in body["models"]]
                name = rng.choice(churning)  # churn between pages
                if server.json("GET", f"/models/{name}")[0] == 200:
                    server.request("DELETE", f"/models/{name}")
                else:
                    server.load(name, model_root / name)
                token = body.get("nextPageToken")
                if token is None:
                    break
            for name in stable:
                assert seen.count(name) == 1, (name, seen)
            assert len(seen) == len(set(seen))
    finally:
        for name in stable + churning:
            server.request("DELETE", f"/models/{name}")


def test_memory_budget_and_model_cap_answer_507(model_root):
    with running_server(["--model-root", str(model_root), "--no-access-log"],
                        env={"MMSERVER_MEMORY_BUDGET_MB": "32", "MMSERVER_MAX_MODELS": "2"}
                        ) as server:
        body = assert_error(server.load("big", model_root / "big"), 507, "InsufficientResources")
        assert "MMSERVER_MEMORY_BUDGET_MB" in body["message"]
        assert server.load("a", model_root / "affine")[0] == 200
        assert server.load("b", model_root / "affine2")[0] == 200
        body = assert_error(server.load("c", model_root / "m00"), 507)
        assert "MMSERVER_MAX_MODELS" in body["message"]
        assert server.json("DELETE", "/models/a")[0] == 200
        assert server.load("c", model_root / "m00")[0] == 200
        assert server.json("GET", "/ping")[0] == 200


def test_repeated_load_unload_does_not_grow_memory(server, model_root, tmp_path):
    process = psutil.Process(server.process.pid)

    def cycle(n):
        for _ in range(n):
            assert server.load("cycled", model_root / "affine")[0] == 200
            assert server.invoke("cycled", [[1.0]]) == (200, [[3.0]])
            assert server.json("DELETE", "/models/cycled")[0] == 200

    cycle(20)  # warm up allocator and caches
    before = process.memory_info().rss
    cycle(100)
    growth = process.memory_info().rss - before
    assert growth < 50 * 2**20, f"resident memory grew {growth / 2**20:.1f} MiB over 100 cycles"


@pytest.mark.parametrize("http_workers", [1, 2])
def test_a_client_that_goes_away_is_not_computed(model_root, http_workers):
    """With HTTP workers too: the worker tells the engine, which drops the request."""
    with running_server(["--model-root", str(model_root), "--no-access-log",
                         "--max-batch-size", "1", "--http-workers", str(http_workers)]) as server:
        assert server.load("slow", model_root / "slow")[0] == 200
        blocker = threading.Thread(target=server.invoke, args=("slow", [[1.0]]))
        blocker.start()
        wait_for_in_flight(server, "slow", 1)   # the model is busy for 1 s
        body = b"[[0.0625]]"
        abandoned = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(5)]
        for s in abandoned:  # queue requests, then hang up before they run
            s.sendall(b"POST /models/slow/invoke HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_for_in_flight(server, "slow", 1 + len(abandoned))
        for s in abandoned:
            s.close()
        blocker.join(timeout=30)
        wait_for_in_flight(server, "slow", 0)
        assert server.invoke("slow", [[0.015625]]) == (200, [[1.03125]])
        rows = server.metric("mmserver_batch_size_rows_sum", model="slow")
        assert rows == 2, f"the model computed {rows} rows; the 5 abandoned ones must not count"


def test_single_model_mode_serves_invocations(tmp_path):
    model_dir = write_torchscript(tmp_path / "opt-ml-model")
    with running_server(["--no-access-log"],
                        env={"SAGEMAKER_MULTI_MODEL": "false",
                             "MMSERVER_SINGLE_MODEL_DIR": str(model_dir)}) as server:
        assert server.json("POST", "/invocations", [[1, 2]]) == (200, [[3.0, 5.0]])


def test_sigterm_answers_requests_in_flight_and_exits(model_root):
    server_cm = running_server(["--model-root", str(model_root), "--no-access-log"])
    server = server_cm.__enter__()
    try:
        assert server.load("slow", model_root / "slow")[0] == 200
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(server.invoke, "slow", [[0.5]]) for _ in range(4)]
            wait_for_in_flight(server, "slow", 4)
            started = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            results = [f.result(timeout=30) for f in futures]
            code = server.process.wait(timeout=30)
        assert all(r == (200, [[2.0]]) for r in results), results
        assert time.monotonic() - started < 30
        assert code == 0, server.log()
    finally:
        server_cm.__exit__(None, None, None)


def test_the_server_refuses_bad_settings_clearly(model_root):
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-m", "mmserver", "serve", "--port", "1",
                             "--preload", "x=missing", "--model-root", str(model_root)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "does not exist" in result.stderr
