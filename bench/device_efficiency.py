"""How much of a fast GPU the server keeps busy: the simulated device's busy fraction, per wire.

On a GPU host the model's call holds no CPU, so what limits throughput is the server's own
CPU cost per request. This benchmark serves the simulated device
(``mmserver.harness.simulated_device``, labelled as simulated: t(b) = 1 ms + b x 1/32 ms, a batch of
32 rows in 2 ms, no CPU held) from one mmserver pinned to one core, and drives it with 1, 8 and
32 closed-loop users from the other core, one wire at a time:

* ``npy``: ``POST /models/{name}/invoke`` with a one-row ``application/x-npy`` body;
* ``json``: the same row as JSON;
* ``v2-binary``: ``POST /v2/models/{name}/infer`` with Triton's binary tensor extension,
  when the server has the v2 routes.

For each window it prints requests/s, the mean batch the server formed (from ``/metrics``),
the **efficiency** (rows served per second ÷ the device's capacity at the batch sizes formed;
t(b) is linear, so the device time the window needed is exactly
``batches x 1 ms + rows x 1/32 ms``, and efficiency is that time ÷ the window), the
server's CPU time per request (``psutil``: user + system seconds of the server process ÷
requests answered) and the load generator's (the aiohttp loop's own, over its window;
not known for wrk).
Efficiency 1.0 means the device never waited for the server. One more window, at 32 users
with ``.npy`` rows, serves the same device with every time three times longer
(:data:`SLOW_FACTOR`), preloaded beside the first.

With ``--http-workers 1,2`` (the default) it runs once per count: one process pinned to
one core as above, then N HTTP workers over one engine (``mmserver serve --http-workers``)
on every core this machine lends (on two cores, the load generator shares one with them).
CPU per request is then the whole process tree's, and the engine's own is shown beside
it; the summary gives, per wire at 32 users, the ratio of N workers' requests/s to one
process's in the same run, the mean batches formed, and, as arithmetic from the measured
costs, how many cores of HTTP workers would keep this device fully busy, and the *CPU bound*:
what this machine's cores could serve at one process's CPU per request, server and load
generator together, the most any number of workers could serve here if the split cost
nothing.

Closed-loop users are not the same load for two servers that answer at different speeds: a
fixed population of clients spreads over every place a request can wait (an HTTP worker's loop,
the socket to the engine, the engine's queue), so fewer of them sit in the engine's queue when
the device frees. So each server also meets the same *open-loop* load, ``.npy`` rows at each
rate of :data:`OPEN_RATES_PER_SECOND` (the same seeded Poisson arrivals for every server,
``harness.open_loop``), and the summary compares the mean batches at each rate.

Usage: python bench/device_efficiency.py [--seconds 5] [--http-workers 1,2];
``MMSERVER_QUICK=1`` shrinks it.
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
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
    wait_for_http_workers,
)
from mmserver.http.app import WORKER_HEADER  # noqa: E402

QUICK = os.environ.get("MMSERVER_QUICK") == "1"
FIXED_SECONDS = 0.001
PER_ROW_SECONDS = 0.001 / 32
FEATURES = 16
MAX_BATCH_SIZE = 32
USER_COUNTS = (1, 8, 32)
NAME = "gpu"
#: The same device with every time this many times longer, served beside it: at 32 users its
#: call (t(16) = 3.5 ms) outlasts a request's round trip through an HTTP worker, which the
#: fast device's (1.5 ms) does not on two shared cores.
SLOW_FACTOR = 3
SLOW_NAME = f"gpu-x{SLOW_FACTOR}"
SLOW_WIRE = f"npy, t x{SLOW_FACTOR}"
#: The open-loop rates each server meets with ``.npy`` rows: below what two workers answer
#: beside the aiohttp generator on two cores (about 2,200 requests/s here), so neither server
#: falls behind its arrivals and both windows serve what was offered.
OPEN_RATES_PER_SECOND = (500, 1000, 1500)
OPEN_WIRE = "npy"
#: Each model served, and how many times the fast device's times its own are.
TIME_SCALE = {NAME: 1, SLOW_NAME: SLOW_FACTOR}


def wires(base: str) -> dict[str, tuple[str, str, bytes, dict[str, str]]]:
    """name -> (model, url, body, headers) for one row of FEATURES floats."""
    row = np.arange(FEATURES, dtype=np.float32)[None]
    buffer = io.BytesIO()
    np.save(buffer, row, allow_pickle=False)
    npy = {"Content-Type": "application/x-npy"}
    found = {"npy": (NAME, f"{base}/models/{NAME}/invoke", buffer.getvalue(), npy),
             "json": (NAME, f"{base}/models/{NAME}/invoke", json.dumps(row.tolist()).encode(),
                      {"Content-Type": "application/json"})}
    if http_request(base, "GET", f"/v2/models/{NAME}")[0] == 200:
        header = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, FEATURES],
                                         "datatype": "FP32",
                                         "parameters": {"binary_data_size": row.nbytes}}],
                             "parameters": {"binary_data_output": True}}).encode()
        found["v2-binary"] = (NAME, f"{base}/v2/models/{NAME}/infer", header + row.tobytes(),
                              {"Content-Type": "application/octet-stream",
                               "Inference-Header-Content-Length": str(len(header))})
    found[SLOW_WIRE] = (SLOW_NAME, f"{base}/models/{SLOW_NAME}/invoke", buffer.getvalue(), npy)
    return found


def window(server: ServerProcess, model: str, drive: Callable[[], dict[str, float]],
           engine_pid: int) -> dict[str, float]:
    """One window of ``drive`` (the load generator, run to its end) against ``server``: the
    generator's numbers and what the server reports over the same seconds."""
    tree = [psutil.Process(server.process.pid), *psutil.Process(
        server.process.pid).children(recursive=True)]
    engine = next(p for p in tree if p.pid == engine_pid)
    before, cpu_before = scrape_metrics(server.url), _cpu(tree)
    engine_before = _cpu([engine])
    started = time.perf_counter()
    result = drive()
    wall = time.perf_counter() - started
    after, cpu_after, engine_after = scrape_metrics(server.url), _cpu(tree), _cpu([engine])

    def delta(metric: str) -> float:
        return sample_value(after, metric, model=model) - sample_value(before, metric, model=model)

    batches, rows = delta("mmserver_batch_size_rows_count"), delta("mmserver_batch_size_rows_sum")
    device_seconds = TIME_SCALE[model] * (batches * FIXED_SECONDS + rows * PER_ROW_SECONDS)
    requests = max(rows, 1)
    return {"rps": result["rps"], "non_2xx": result["non_2xx"], "p50_ms": result["p50_ms"],
            "mean_batch": rows / batches if batches else 0.0,
            "efficiency": device_seconds / wall,
            "cpu_us_per_request": 1e6 * (cpu_after - cpu_before) / requests,
            "engine_us_per_request": 1e6 * (engine_after - engine_before) / requests,
            "load_us_per_request": (1e6 * result["cpu_seconds"] / result["requests"]
                                    if "cpu_seconds" in result else float("nan"))}


def _cpu(processes: list[psutil.Process]) -> float:
    """User + system seconds of ``processes`` so far."""
    return sum(t.user + t.system for t in (p.cpu_times() for p in processes))


def _engine_pid(server: ServerProcess) -> int:
    """The process that runs the models: the server itself, or its engine (``--http-workers``)."""
    match = re.search(r"over one engine \(pid (\d+)\)", server.log())
    return int(match.group(1)) if match else server.process.pid


def measure(tmp: str, folder: Path, workers: int, seconds: float) -> dict[tuple[str, int], dict]:
    """Every wire at every user count against one server with ``workers`` HTTP workers."""
    args_ = ["--model-root", tmp, "--no-access-log", "--log-level", "WARNING",
             "--max-batch-size", str(MAX_BATCH_SIZE), "--preload", f"{NAME}={folder}",
             "--preload", f"{SLOW_NAME}={folder.parent / SLOW_NAME}",
             "--http-workers", str(workers)]
    cpus = harness.SERVER_CPU if workers == 1 else ",".join(
        str(cpu) for cpu in sorted(os.sched_getaffinity(0)))
    results = {}
    with harness.serving(ServerProcess(args_, env=harness.ONE_THREAD, cpus=cpus,
                                       cwd=harness.REPO)) as server:
        if workers > 1:
            wait_for_http_workers(server.url, workers, WORKER_HEADER)
        engine_pid = _engine_pid(server)
        found = wires(server.url)
        for wire, (model, url, body, headers) in found.items():
            harness.closed_loop(url, body, headers["Content-Type"], headers=headers,
                                connections=8, seconds=0.5)
            for users in (USER_COUNTS[-1],) if wire == SLOW_WIRE else USER_COUNTS:
                r = results[wire, users] = window(server, model, functools.partial(
                    harness.closed_loop, url, body, headers["Content-Type"], headers=headers,
                    connections=users, seconds=seconds), engine_pid)
                _print_row(workers, wire, str(users), r)
        model, url, body, headers = found[OPEN_WIRE]
        for rate in OPEN_RATES_PER_SECOND:
            r = results["open", rate] = window(server, model, functools.partial(
                harness.open_loop, url, body, headers, rate, seconds), engine_pid)
            _print_row(workers, f"{OPEN_WIRE} open", f"{rate}/s", r)
    return results


def _print_row(workers: int, wire: str, load: str, r: dict[str, float]) -> None:
    if r["non_2xx"]:
        raise RuntimeError(f"{wire} at {load}: {r['non_2xx']} answers were not 2xx")
    print(f"{workers:7d} {wire:10s} {load:>6s} {r['rps']:8.0f} {r['p50_ms']:7.2f} "
          f"{r['mean_batch']:10.2f} {r['efficiency']:10.2f} "
          f"{r['cpu_us_per_request']:14.0f} {r['engine_us_per_request']:14.0f} "
          f"{r['load_us_per_request']:12.0f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2 if QUICK else 5)
    parser.add_argument("--http-workers", default="1,2",
                        help="HTTP worker counts to compare, comma-separated (1: one process)")
    args = parser.parse_args()
    counts = [int(count) for count in args.http_workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="device-efficiency-") as tmp:
        folder = write_model_folder(Path(tmp) / NAME, fixed_seconds=FIXED_SECONDS,
                                    per_row_seconds=PER_ROW_SECONDS, input_features=FEATURES)
        write_model_folder(Path(tmp) / SLOW_NAME, fixed_seconds=FIXED_SECONDS,
                           per_row_seconds=PER_ROW_SECONDS, input_features=FEATURES,
                           time_scale=SLOW_FACTOR)
        print(f"simulated device (not a real GPU): t(b) = {FIXED_SECONDS * 1e3:g} ms + "
              f"b x {PER_ROW_SECONDS * 1e3:.5f} ms; one process on core {harness.SERVER_CPU}, "
              f"N workers on every core; {harness.generator_name()} on core {harness.LOAD_CPU}, "
              f"{args.seconds:g} s per window; load: closed-loop users, or an aiohttp open loop's "
              "offered rate")
        print(f"{'workers':>7s} {'wire':10s} {'load':>6s} {'req/s':>8s} {'p50 ms':>7s} "
              f"{'mean batch':>10s} "
              f"{'efficiency':>10s} {'CPU us/req':>14s} {'engine us/req':>14s} "
              f"{'load us/req':>12s}")
        runs = {count: measure(tmp, folder, count, args.seconds) for count in counts}
    base = runs[counts[0]]
    for count in counts[1:]:
        print(f"\n{count} HTTP workers ÷ {counts[0]}, measured in this run:")
        for wire, users in base:
            one, many = base[wire, users], runs[count][wire, users]
            if wire == "open":
                print(f"  {OPEN_WIRE:10s} open loop at {users}/s: mean batch {one['mean_batch']:.2f} -> "
                      f"{many['mean_batch']:.2f} ({many['mean_batch'] / one['mean_batch']:.2f}x), "
                      f"served {one['rps']:.0f} and {many['rps']:.0f}/s, p50 {one['p50_ms']:.2f} -> "
                      f"{many['p50_ms']:.2f} ms")
                continue
            if users == 1:
                print(f"  {wire:10s} at 1 user: p50 {one['p50_ms']:.2f} ms -> "
                      f"{many['p50_ms']:.2f} ms, {many['p50_ms'] - one['p50_ms']:+.2f} ms "
                      "added by the hop to the engine")
            if wire == SLOW_WIRE:
                print(f"  {wire:10s} at {users} users: req/s {many['rps'] / one['rps']:.2f}x, "
                      f"mean batch {one['mean_batch']:.1f} -> {many['mean_batch']:.1f} "
                      f"({many['mean_batch'] / one['mean_batch']:.2f}x)")
                continue
            if users != USER_COUNTS[-1]:
                continue
            worker_us = many["cpu_us_per_request"] - many["engine_us_per_request"]
            capacity = many["mean_batch"] / (FIXED_SECONDS + many["mean_batch"] * PER_ROW_SECONDS)
            engine_ceiling = 1e6 / many["engine_us_per_request"]
            print(f"  {wire:10s} at {users} users: req/s {many['rps'] / one['rps']:.2f}x, "
                  f"mean batch {one['mean_batch']:.1f} -> {many['mean_batch']:.1f}; engine "
                  f"{many['engine_us_per_request']:.0f} us/request, workers {worker_us:.0f}. "
                  f"Arithmetic: the device busy at batch {many['mean_batch']:.1f} serves "
                  f"{capacity:,.0f} requests/s, which takes {capacity * worker_us / 1e6:.1f} "
                  f"cores of HTTP workers; one engine core at {many['engine_us_per_request']:.0f}"
                  f" us/request serves at most {engine_ceiling:,.0f} requests/s, "
                  f"{min(engine_ceiling / capacity, 1):.0%} of that")
            print(f"  {'':10s} {_cpu_bound(one, many)}")


def _cpu_bound(one: dict, many: dict) -> str:
    """What this machine's cores could serve at one process's CPU per request, server and
    load generator together: the most any number of workers could serve here if splitting
    the server cost nothing."""
    cores = len(os.sched_getaffinity(0))
    per_request = one["cpu_us_per_request"] + one["load_us_per_request"]
    bound = cores * 1e6 / per_request
    return (f"CPU bound: {cores} cores ÷ ({one['cpu_us_per_request']:.0f} us of one process + "
            f"{one['load_us_per_request']:.0f} us of the load generator) per request = "
            f"{bound:,.0f} requests/s, {bound / one['rps']:.2f}x one process's rate; "
            f"the workers reached {many['rps'] / one['rps']:.2f}x")

if __name__ == "__main__":
    main()
