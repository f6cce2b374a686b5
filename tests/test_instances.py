"""Instances: N batches of one model at once, one copy of its weights, against a real server.

Concurrency is observed, not assumed: the script models count how many of their
calls are inside ``predict_fn`` at the same moment and answer with that peak.
"""

from __future__ import annotations

import io
import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from conftest import running_server, write_code, write_torchscript

#: How long one call of the counting models takes: long enough that concurrent requests overlap.
CALL_SECONDS = 0.3

COUNTING_CODE = """
    import threading, time, torch

    MMSERVER_ROW_WISE = True
    {thread_safe}
    _lock = threading.Lock()
    _state = {{"inside": 0, "peak": 0}}

    def model_fn(model_dir):
        return None

    def predict_fn(data, model):
        with _lock:
            _state["inside"] += 1
            _state["peak"] = max(_state["peak"], _state["inside"])
        try:
            time.sleep({seconds})
            if torch.isnan(data).any():
                raise ValueError("NaN in the input")
            return torch.cat([data * 2 + 1, torch.full((data.shape[0], 1), float(_state["peak"]))],
                             dim=1)
        finally:
            with _lock:
                _state["inside"] -= 1
"""


def write_counting(model_dir: Path, *, thread_safe: bool | None, settings: dict) -> Path:
    declaration = "" if thread_safe is None else f"MMSERVER_THREAD_SAFE = {thread_safe}"
    write_code(model_dir, COUNTING_CODE.format(thread_safe=declaration, seconds=CALL_SECONDS))
    (model_dir / "mmserver.json").write_text(json.dumps(settings))
    return model_dir


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("instances")
    one_row = {"max_batch_size": 1, "max_wait_ms": 0}
    write_counting(root / "safe2", thread_safe=True, settings={**one_row, "instances": 2})
    write_counting(root / "safe3", thread_safe=True, settings={**one_row, "instances": 3})
    write_counting(root / "undeclared2", thread_safe=None, settings={**one_row, "instances": 2})
    write_counting(root / "json_says_no", thread_safe=True,
                   settings={**one_row, "instances": 2, "thread_safe": False})
    write_torchscript(root / "affine1")
    write_torchscript(root / "affine2")
    (root / "affine2" / "mmserver.json").write_text(json.dumps({"instances": 2}))
    return root


@pytest.fixture(scope="module")
def server(root):
    with running_server(["--model-root", str(root), "--no-access-log"]) as s:
        for name in ("safe2", "safe3", "undeclared2", "json_says_no", "affine1", "affine2"):
            assert s.load(name, root / name)[0] == 200
        yield s


def concurrent_invokes(server, name: str, rows_list: list) -> list[tuple[int, object]]:
    with ThreadPoolExecutor(len(rows_list)) as pool:
        return list(pool.map(lambda rows: server.invoke(name, rows), rows_list))


@pytest.mark.parametrize("name, instances", [("safe2", 2), ("safe3", 3), ("undeclared2", 1),
                                             ("json_says_no", 1)])
def test_concurrency_per_model_equals_its_instances(server, name, instances):
    answers = concurrent_invokes(server, name, [[[float(k), 0.0]] for k in range(8)])
    assert [status for status, _ in answers] == [200] * 8
    for k, (_, body) in enumerate(answers):
        assert body[0][:2] == [2.0 * k + 1, 1.0]  # each request got its own row back
    assert max(body[0][2] for _, body in answers) == instances
    described = server.json("GET", f"/models/{name}")[1]
    assert described["batching"]["instances"] == instances
    assert len(described["stats"]["instanceBusySeconds"]) == instances
    assert all(s > 0 for s in described["stats"]["instanceBusySeconds"])


def test_a_script_not_declared_thread_safe_says_why_it_runs_one_instance(server):
    described = server.json("GET", "/models/undeclared2")[1]
    assert described["batching"]["instances"] == 1
    assert "MMSERVER_THREAD_SAFE" in described["notes"][0]
    assert "not 2" in described["notes"][0]
    assert "notes" not in server.json("GET", "/models/safe2")[1]
    assert "model=undeclared2 runs on 1 instance, not 2" in server.log()


def test_torchscript_runs_on_its_instances(server):
    answers = concurrent_invokes(server, "affine2", [[[float(k)] * 3] for k in range(64)])
    assert [body for _, body in answers] == [[[2.0 * k + 1] * 3] for k in range(64)]
    one, two = (server.json("GET", f"/models/{name}")[1] for name in ("affine1", "affine2"))
    assert two["batching"]["instances"] == 2 and one["batching"]["instances"] == 1
    assert server.metric("mmserver_model_instances", model="affine2") == 2
    busy = [server.metric("mmserver_instance_busy_seconds", model="affine2", instance=str(i))
            for i in range(2)]
    assert all(math.isfinite(b) and b > 0 for b in busy)


def test_a_failing_batch_on_one_instance_fails_only_its_own_requests(server):
    def invoke_npy(row: list[float]) -> tuple[int, object]:
        buffer = io.BytesIO()
        np.save(buffer, np.array([row], dtype=np.float32))
        status, _, raw = server.request("POST", "/models/safe2/invoke", buffer.getvalue(),
                                        {"Content-Type": "application/x-npy"})
        return status, json.loads(raw)

    rows = [[float(k), 0.0] for k in range(6)] + [[math.nan, 0.0]] * 2
    with ThreadPoolExecutor(len(rows)) as pool:
        answers = list(pool.map(invoke_npy, rows))
    assert [status for status, _ in answers] == [200] * 6 + [500] * 2
    for k in range(6):
        assert answers[k][1][0][:2] == [2.0 * k + 1, 1.0]
    assert "NaN in the input" in answers[6][1]["message"]
    assert server.json("GET", "/ping")[0] == 200


def test_unload_drains_every_instance(root):
    with running_server(["--model-root", str(root), "--no-access-log"]) as s:
        assert s.load("safe3", root / "safe3")[0] == 200
        with ThreadPoolExecutor(7) as pool:
            invokes = [pool.submit(s.invoke, "safe3", [[float(k), 0.0]]) for k in range(6)]
            peak_reached = pool.submit(s.invoke, "safe3", [[0.0, 0.0]])
            time.sleep(CALL_SECONDS / 2)  # the first three are inside the model
            unloaded = s.unload("safe3")
            answers = [f.result() for f in invokes]
        assert unloaded[0] == 200
        assert [status for status, _ in answers] == [200] * 6
        assert [body[0][:2] for _, body in answers] == [[2.0 * k + 1, 1.0] for k in range(6)]
        assert peak_reached.result()[0] == 200
        assert s.invoke("safe3", [[1.0, 0.0]])[0] == 404


class Wide(torch.nn.Module):
    """About 64 MiB of float32 weights: a copy per instance would show in the process's memory."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4096, 4096)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


def test_two_instances_share_one_copy_of_the_weights(tmp_path):
    for name, instances in (("wide1", 1), ("wide2", 2)):
        write_torchscript(tmp_path / name, Wide(), torch.ones(1, 4096))
        (tmp_path / name / "mmserver.json").write_text(json.dumps({"instances": instances}))
    with running_server(["--model-root", str(tmp_path), "--no-access-log"]) as s:
        process = psutil.Process(s.process.pid)
        growth = {}
        for name in ("wide1", "wide2"):
            before = process.memory_info().rss
            assert s.load(name, tmp_path / name)[0] == 200
            answers = concurrent_invokes(s, name, [[[0.0] * 4096]] * 8)
            assert {status for status, _ in answers} == {200}
            growth[name] = process.memory_info().rss - before
    weights = 4096 * 4097 * 4
    assert growth["wide1"] >= weights * 0.9
    assert growth["wide2"] <= growth["wide1"] * 1.1, growth
