"""mmserver.allocator: a model call's buffers are reused from the heap, not faulted in afresh.

What we count is page faults, not time: a buffer that glibc hands back to the system after
a call must be faulted in again, page by page, by the next call. Untuned, how often that
happens depends on the heap's layout (a fresh process may or may not pay), so the checks are
on the tuned side, which must never pay after warm-up. glibc's thresholds are process-wide,
so each case runs in a fresh process.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import running_server, write_torchscript

from mmserver.allocator import keep_freed_memory_in_heap
from mmserver.config import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from harness import SmallCNN  # noqa: E402 - the CNN of bench/peers.py, a few MiB per layer at 16 rows

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

#: A model call's pattern: four 8 MiB activations alive at once, then all freed.
CALLS = """
import json, resource, sys, torch
from mmserver.allocator import keep_freed_memory_in_heap
tuned = keep_freed_memory_in_heap()
def call():
    layers = [torch.ones(2 * 2**20) for _ in range(4)]
    return sum(float(t[0]) for t in layers)
for _ in range(3):  # warm-up: the heap grows to its high-water mark
    call()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    call()
after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"tuned": tuned, "faults": after - before}))
"""
#: 4 KiB pages in one call's 32 MiB of activations.
PAGES_PER_CALL = 4 * 8 * 2**20 // 4096


def test_tuned_buffers_are_reused_instead_of_faulted_in_again():
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("MALLOC_") and k not in ("LD_PRELOAD", "MMSERVER_TUNE_MALLOC")}
    result = subprocess.run([sys.executable, "-c", CALLS], capture_output=True, text=True,
                            env=environment, timeout=120, check=True)
    tuned = json.loads(result.stdout)
    assert tuned["tuned"] is True
    assert tuned["faults"] < 20 * PAGES_PER_CALL // 16, tuned  # untuned: up to every page


@pytest.mark.parametrize("env", [{"MALLOC_ARENA_MAX": "2"}, {"LD_PRELOAD": "libjemalloc.so.2"}])
def test_a_choice_the_user_made_is_left_alone(env):
    assert keep_freed_memory_in_heap(env) is False


def test_mmserver_tune_malloc_0_turns_the_tuning_off():
    assert Settings.from_env({"MMSERVER_TUNE_MALLOC": "0"}).tune_malloc is False
    assert Settings.from_env({}).tune_malloc is True


def minor_faults(pid: int) -> int:
    """Minor page faults of the whole process, all threads (``/proc/PID/stat`` field 10)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return int(fields[7])


def test_the_server_reuses_its_model_calls_buffers(tmp_path):
    """Untuned, this server faulted in 390-1,250 pages per call in three of three runs."""
    torch.manual_seed(0)
    write_torchscript(tmp_path / "cnn", SmallCNN().eval(), torch.randn(2, 3, 32, 32))
    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(0).random((16, 3, 32, 32), dtype=np.float32))
    body, headers = buffer.getvalue(), {"Content-Type": "application/x-npy"}
    with running_server(["--model-root", str(tmp_path), "--no-access-log",
                         "--preload", f"cnn={tmp_path / 'cnn'}"],
                        env={"OMP_NUM_THREADS": "1"}) as server:
        for _ in range(10):  # warm-up: the heap grows to its high-water mark
            assert server.request("POST", "/models/cnn/invoke", body, headers)[0] == 200
        before = minor_faults(server.process.pid)
        for _ in range(20):
            assert server.request("POST", "/models/cnn/invoke", body, headers)[0] == 200
        faults = minor_faults(server.process.pid) - before
    assert faults < 20 * 32, faults
