"""How much of a fast GPU the server keeps busy: the simulated device's busy fraction, per wire.

On a GPU host the model's call holds no CPU, so what limits throughput is the server's own
CPU cost per request. This benchmark serves the simulated device
(``mmserver.harness.simulated_device``, labelled as simulated: t(b) = 1 ms + b x 1/32 ms, a batch of
32 rows in 2 ms, no CPU held) from one mmserver pinned to one core, and drives it with 8 and
32 closed-loop users from the other core, one wire at a time:

* ``npy``: ``POST /models/{name}/invoke`` with a one-row ``application/x-npy`` body;
* ``json``: the same row as JSON;
* ``v2-binary``: ``POST /v2/models/{name}/infer`` with Triton's binary tensor extension,
  when the server has the v2 routes.

For each window it prints requests/s, the mean batch the server formed (from ``/metrics``),
the **efficiency** (rows served per second ÷ the device's capacity at the batch sizes formed;
t(b) is linear, so the device time the window needed is exactly
``batches x 1 ms + rows x 1/32 ms``, and efficiency is that time ÷ the window), and the
server's CPU time per request (``psutil``: user + system seconds of the server process ÷
requests answered). Efficiency 1.0 means the device never waited for the server.

Usage: python bench/device_efficiency.py [--seconds 5]; ``MMSERVER_QUICK=1`` shrinks it.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from mmserver.harness.simulated_device import write_model_folder  # noqa: E402
from mmserver.harness.testing import (  # noqa: E402
    ServerProcess,
    http_request,
    sample_value,
    scrape_metrics,
)

QUICK = os.environ.get("MMSERVER_QUICK") == "1"
FIXED_SECONDS = 0.001
PER_ROW_SECONDS = 0.001 / 32
FEATURES = 16
MAX_BATCH_SIZE = 32
USER_COUNTS = (8, 32)
NAME = "gpu"


def wires(base: str) -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """name -> (url, body, headers) for one row of FEATURES floats."""
    row = np.arange(FEATURES, dtype=np.float32)[None]
    buffer = io.BytesIO()
    np.save(buffer, row, allow_pickle=False)
    found = {"npy": (f"{base}/models/{NAME}/invoke", buffer.getvalue(),
                     {"Content-Type": "application/x-npy"}),
             "json": (f"{base}/models/{NAME}/invoke", json.dumps(row.tolist()).encode(),
                      {"Content-Type": "application/json"})}
    if http_request(base, "GET", f"/v2/models/{NAME}")[0] == 200:
        header = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, FEATURES],
                                         "datatype": "FP32",
                                         "parameters": {"binary_data_size": row.nbytes}}],
                             "parameters": {"binary_data_output": True}}).encode()
        found["v2-binary"] = (f"{base}/v2/models/{NAME}/infer", header + row.tobytes(),
                              {"Content-Type": "application/octet-stream",
                               "Inference-Header-Content-Length": str(len(header))})
    return found


def window(server: ServerProcess, url: str, body: bytes, headers: dict[str, str], users: int,
           seconds: float) -> dict[str, float]:
    process = psutil.Process(server.process.pid)
    before, cpu_before = scrape_metrics(server.url), process.cpu_times()
    started = time.perf_counter()
    result = harness.closed_loop(url, body, headers["Content-Type"], headers=headers,
                                 connections=users, seconds=seconds)
    wall = time.perf_counter() - started
    after, cpu_after = scrape_metrics(server.url), process.cpu_times()

    def delta(name: str) -> float:
        return sample_value(after, name, model=NAME) - sample_value(before, name, model=NAME)

    batches, rows = delta("mmserver_batch_size_rows_count"), delta("mmserver_batch_size_rows_sum")
    device_seconds = batches * FIXED_SECONDS + rows * PER_ROW_SECONDS
    cpu = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
    return {"rps": result["rps"], "non_2xx": result["non_2xx"],
            "mean_batch": rows / batches if batches else 0.0,
            "efficiency": device_seconds / wall, "cpu_us_per_request": 1e6 * cpu / max(rows, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2 if QUICK else 5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="device-efficiency-") as tmp:
        folder = write_model_folder(Path(tmp) / NAME, fixed_seconds=FIXED_SECONDS,
                                    per_row_seconds=PER_ROW_SECONDS, input_features=FEATURES)
        args_ = ["--model-root", tmp, "--no-access-log", "--log-level", "WARNING",
                 "--max-batch-size", str(MAX_BATCH_SIZE), "--preload", f"{NAME}={folder}"]
        with harness.serving(ServerProcess(args_, env=harness.ONE_THREAD, cpus=harness.SERVER_CPU,
                                           cwd=harness.REPO)) as server:
            found = wires(server.url)
            print(f"simulated device (not a real GPU): t(b) = {FIXED_SECONDS * 1e3:g} ms + "
                  f"b x {PER_ROW_SECONDS * 1e3:.5f} ms; server on core {harness.SERVER_CPU}, "
                  f"{harness.generator_name()} on core {harness.LOAD_CPU}, {args.seconds:g} s "
                  "per window")
            print(f"{'wire':10s} {'users':>5s} {'req/s':>8s} {'mean batch':>10s} "
                  f"{'efficiency':>10s} {'server CPU us/request':>22s}")
            for wire, (url, body, headers) in found.items():
                harness.closed_loop(url, body, headers["Content-Type"], headers=headers,
                                    connections=8, seconds=0.5)
                for users in USER_COUNTS:
                    r = window(server, url, body, headers, users, args.seconds)
                    if r["non_2xx"]:
                        raise RuntimeError(f"{wire}: {r['non_2xx']} answers were not 2xx")
                    print(f"{wire:10s} {users:5d} {r['rps']:8.0f} {r['mean_batch']:10.1f} "
                          f"{r['efficiency']:10.2f} {r['cpu_us_per_request']:22.0f}")


if __name__ == "__main__":
    main()
