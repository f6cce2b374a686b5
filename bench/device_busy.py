"""Does one process keep a fast GPU busy? The simulated V100's busy fraction at 64 users.

The simulated device (``mmserver.harness.simulated_device``, labelled as simulated) runs at
the V100's own speed for ResNet-50-sized calls, t(b) = 20 ms + 0.3 ms x b, with
``--max-batch-size 32``, served by one mmserver process pinned to one core and driven by
64 closed-loop users (two full batches: one is always waiting) from the other core. A call
holds no CPU, so if the server never kept the device waiting, the device would be busy the
whole window.

The **busy fraction** is computed from the batches the server reports (``/metrics``, scraped
at both ends of a window taken while every user is sending): t(b) is linear, so the device
time a window needed is exactly ``batches x 20 ms + rows x 0.3 ms``, and the fraction is that
time ÷ the window. It also prints requests/s against the ceiling
(rows/s of back-to-back full batches), the mean batch, the clients' p50 and p99 and the
server's CPU per request.

``--before PATH`` serves the same folder from another checkout of mmserver too (the server
process then imports ``mmserver`` from there), interleaved round by round with this one, so
one run prints before and after under the same load on the machine.

Usage: python bench/device_busy.py [--before PATH] [--rounds 2] [--seconds 6];
``MMSERVER_QUICK=1`` shrinks it.
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from mmserver.harness.simulated_device import write_model_folder  # noqa: E402
from mmserver.harness.testing import ServerProcess, sample_value, scrape_metrics  # noqa: E402

QUICK = os.environ.get("MMSERVER_QUICK") == "1"
FIXED_SECONDS = 0.020
PER_ROW_SECONDS = 0.0003
MAX_BATCH_SIZE = 32
USERS = 64
FEATURES = 16
NAME = "v100"
#: The generator runs this much longer than the window, which starts once it is serving.
LEAD_SECONDS = 4.0


def npy_row() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(FEATURES, dtype=np.float32)[None], allow_pickle=False)
    return buffer.getvalue()


def _until_serving(url: str, lead_seconds: float) -> None:
    """Return once the load generator's requests are being served (its process has started
    and its users connected), plus a moment to settle; at most 30 s."""
    first = sample_value(scrape_metrics(url), "mmserver_batch_size_rows_count", model=NAME)
    deadline = time.monotonic() + 30
    while sample_value(scrape_metrics(url), "mmserver_batch_size_rows_count",
                       model=NAME) == first:
        if time.monotonic() > deadline:
            raise RuntimeError("the load generator did not start within 30 s")
        time.sleep(0.05)
    time.sleep(min(0.5, lead_seconds / 4))


def window(tree: Path, folder: Path, model_root: str, seconds: float) -> dict[str, float]:
    """One server from ``tree``, warmed; USERS closed-loop users, and a window of ``seconds``
    measured on the server's own metrics while they are all sending (the generator's
    start-up is outside it)."""
    args = ["--model-root", model_root, "--no-access-log", "--log-level", "WARNING",
            "--max-batch-size", str(MAX_BATCH_SIZE), "--preload", f"{NAME}={folder}"]
    env = {**harness.ONE_THREAD, "PYTHONPATH": str(tree)}
    with harness.serving(ServerProcess(args, env=env, cpus=harness.SERVER_CPU,
                                       cwd=tree)) as server:
        url, body = f"{server.url}/models/{NAME}/invoke", npy_row()
        harness.closed_loop(url, body, "application/x-npy", connections=USERS, seconds=1.0)
        process = psutil.Process(server.process.pid)
        load = threading.Thread(target=lambda: result.update(harness.closed_loop(
            url, body, "application/x-npy", connections=USERS, seconds=seconds + LEAD_SECONDS)))
        result: dict[str, float] = {}
        load.start()
        _until_serving(server.url, LEAD_SECONDS)
        before, cpu_before, started = scrape_metrics(server.url), process.cpu_times(), \
            time.perf_counter()
        time.sleep(seconds)
        after, cpu_after, wall = scrape_metrics(server.url), process.cpu_times(), \
            time.perf_counter() - started
        if not load.is_alive():
            raise RuntimeError("the load ended inside the window; raise LEAD_SECONDS")
        load.join()

    def delta(name: str) -> float:
        return sample_value(after, name, model=NAME) - sample_value(before, name, model=NAME)

    batches, rows = delta("mmserver_batch_size_rows_count"), delta("mmserver_batch_size_rows_sum")
    cpu = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    return {"busy": (batches * FIXED_SECONDS + rows * PER_ROW_SECONDS) / wall,
            "rps": rows / wall, "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"],
            "non_2xx": result["non_2xx"],
            "mean_batch": rows / batches if batches else 0.0,
            "cpu_us_per_request": 1e6 * cpu / max(rows, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, default=None,
                        help="another checkout of mmserver to measure in the same run")
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 2)
    parser.add_argument("--seconds", type=float, default=3 if QUICK else 6)
    args = parser.parse_args()
    trees = {"this tree": harness.REPO}
    if args.before is not None:
        trees = {"before": args.before.resolve(), **trees}
    ceiling = MAX_BATCH_SIZE / (FIXED_SECONDS + MAX_BATCH_SIZE * PER_ROW_SECONDS)
    print(f"simulated device (not a real GPU): t(b) = {FIXED_SECONDS * 1e3:g} ms + "
          f"b x {PER_ROW_SECONDS * 1e3:g} ms, max batch {MAX_BATCH_SIZE}; {USERS} closed-loop "
          f"users ({harness.generator_name()}, core {harness.LOAD_CPU}); one server process on "
          f"core {harness.SERVER_CPU}; {args.seconds:g} s windows; ceiling {ceiling:,.0f} rows/s")
    print(f"{'round':>5s} {'tree':10s} {'busy':>6s} {'req/s':>7s} {'of ceiling':>10s} "
          f"{'mean batch':>10s} {'p50 ms':>7s} {'p99 ms':>7s} {'CPU us/req':>10s}")
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory(prefix="device-busy-") as tmp:
        folder = write_model_folder(Path(tmp) / NAME, fixed_seconds=FIXED_SECONDS,
                                    per_row_seconds=PER_ROW_SECONDS, input_features=FEATURES)
        for round_ in range(args.rounds):
            for label, tree in trees.items():
                r = window(tree, folder, tmp, args.seconds)
                if r["non_2xx"]:
                    raise RuntimeError(f"{label}: {r['non_2xx']} answers were not 2xx")
                runs[label].append(r)
                print(f"{round_:5d} {label:10s} {r['busy']:6.1%} {r['rps']:7.0f} "
                      f"{r['rps'] / ceiling:10.1%} {r['mean_batch']:10.1f} {r['p50_ms']:7.1f} "
                      f"{r['p99_ms']:7.1f} "
                      f"{r['cpu_us_per_request']:10.0f}", flush=True)
    print()
    medians = {label: {key: statistics.median(r[key] for r in results) for key in ("busy", "rps")}
               for label, results in runs.items()}
    for label, median in medians.items():
        print(f"{label}: device busy {median['busy']:.1%} of the window (median of "
              f"{args.rounds}), {median['rps']:,.0f} req/s = {median['rps'] / ceiling:.1%} of "
              "the ceiling")
    if "before" in medians:
        before, after = medians["before"], medians["this tree"]
        print(f"this tree ÷ before: busy {after['busy'] / before['busy']:.2f}x, "
              f"req/s {after['rps'] / before['rps']:.2f}x")

if __name__ == "__main__":
    main()
