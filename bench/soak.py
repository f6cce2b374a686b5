"""Soak: steady load, churn of model names and overload bursts against one server for minutes.

Three kinds of clients run at once against ``python -m mmserver serve``:

* **steady**: a few threads invoking one model back to back, each answer checked;
* **churn**: a thread that loads a new name, invokes it, unloads it, over and over;
* **bursts**: every few seconds, far more concurrent requests than a small queue
  holds, so the server sheds with 503.

The server's resident memory, open file descriptors and threads are sampled
(psutil) throughout. It passes when every request got an answer it allows
(200, and 503 for bursts), memory grew less than 10 % after warm-up, and file
descriptors and threads are flat. It prints a summary and exits 1 when a
check fails.

    python bench/soak.py                      # 10 minutes
    MMSERVER_QUICK=1 python bench/soak.py     # about 30 s
    MMSERVER_SOAK_SECONDS=240 python bench/soak.py
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from pathlib import Path

import psutil
import torch

from mmserver.harness.testing import ServerProcess

QUICK = os.environ.get("MMSERVER_QUICK") == "1"
SECONDS = float(os.environ.get("MMSERVER_SOAK_SECONDS") or (30 if QUICK else 600))
WARMUP_SHARE = 0.25
STEADY_CLIENTS = 4
BURST_EVERY_SECONDS = 3.0 if QUICK else 10.0
BURST_SIZE = 64
QUEUE_SIZE = 16
MAX_RSS_GROWTH = 0.10
#: Slack for "flat": a few descriptors or threads come and go with in-flight requests.
FD_SLACK, THREAD_SLACK = 8, 4
SAMPLE_EVERY_SECONDS = 1.0


class Affine(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1


def write_model(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(Affine(), torch.ones(2, 3)).save(str(folder / "model.pt"))


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts: Counter = Counter()
        self.problems: list[str] = []

    def record(self, kind: str, status: int | None, allowed: set[int], detail: str = "") -> None:
        with self.lock:
            self.counts[(kind, status)] += 1
            if status not in allowed and len(self.problems) < 20:
                self.problems.append(f"{kind}: {status} {detail[:200]}")


def call(server: ServerProcess, tally: Tally, kind: str, allowed: set[int], method: str,
         path: str, payload=None, expect=None) -> int | None:
    body = None if payload is None else json.dumps(payload)
    try:
        status, _, raw = server.request(method, path, body,
                                        {"Content-Type": "application/json"}, timeout=30)
    except OSError as error:  # no answer at all: the failure a soak exists to find
        tally.record(kind, None, allowed, repr(error))
        return None
    detail = raw.decode(errors="replace")
    if status == 200 and expect is not None and json.loads(raw) != expect:
        tally.record(kind, -200, allowed, f"wrong answer {detail}")
        return -200
    tally.record(kind, status, allowed, detail)
    return status


def steady(server, tally, stop: threading.Event, seed: int) -> None:
    i = seed
    while not stop.is_set():
        x = float(i % 100)
        call(server, tally, "steady", {200}, "POST", "/models/steady/invoke", [[x, 1.0]],
             [[2 * x + 1, 3.0]])
        i += 1


def churn(server, tally, stop: threading.Event) -> None:
    i = 0
    while not stop.is_set():
        name = f"churn-{i}"
        if call(server, tally, "churn-load", {200}, "POST", "/models",
                {"model_name": name, "url": "affine"}) == 200:
            for _ in range(3):
                call(server, tally, "churn-invoke", {200}, "POST", f"/models/{name}/invoke",
                     [[1.0]], [[3.0]])
            call(server, tally, "churn-unload", {200}, "DELETE", f"/models/{name}")
        i += 1


def bursts(server, tally, stop: threading.Event) -> None:
    with concurrent.futures.ThreadPoolExecutor(BURST_SIZE) as pool:
        while not stop.wait(BURST_EVERY_SECONDS):
            futures = [pool.submit(call, server, tally, "burst", {200, 503}, "POST",
                                   "/models/burst/invoke", [[float(j)] * 64] * 8)
                       for j in range(BURST_SIZE)]
            concurrent.futures.wait(futures)


def sample(process: psutil.Process) -> dict:
    return {"t": time.monotonic(), "rss": process.memory_info().rss,
            "fds": process.num_fds(), "threads": process.num_threads()}


def main() -> int:
    models = Path(tempfile.mkdtemp(prefix="mmserver-soak-"))
    write_model(models / "affine")
    args = ["--model-root", str(models), "--no-access-log", "--max-queue-size", str(QUEUE_SIZE),
            "--log-level", "WARNING"]
    tally, samples, stop = Tally(), [], threading.Event()
    with ServerProcess(args, cpus=None) as server:
        for name in ("steady", "burst"):
            assert server.load(name, "affine")[0] == 200
        process = psutil.Process(server.process.pid)
        threads = [threading.Thread(target=steady, args=(server, tally, stop, k), daemon=True)
                   for k in range(STEADY_CLIENTS)]
        threads += [threading.Thread(target=churn, args=(server, tally, stop), daemon=True),
                    threading.Thread(target=bursts, args=(server, tally, stop), daemon=True)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        while time.monotonic() - started < SECONDS:
            samples.append(sample(process))
            time.sleep(SAMPLE_EVERY_SECONDS)
        stop.set()
        for thread in threads:
            thread.join(60)
        alive = [t.name for t in threads if t.is_alive()]
        healthy = server.request("GET", "/ping", timeout=10)[0] == 200
        exit_code = server.stop()
    return report(tally, samples, started, alive, healthy, exit_code)


def report(tally, samples, started, alive, healthy, exit_code) -> int:
    warm = [s for s in samples if s["t"] - started >= SECONDS * WARMUP_SHARE]
    head, tail = warm[:5], warm[-5:]

    def median(part, key):
        return statistics.median(s[key] for s in part)

    rss0, rss1 = median(head, "rss"), median(tail, "rss")
    growth = (rss1 - rss0) / rss0
    fds0, fds1 = median(head, "fds"), median(tail, "fds")
    th0, th1 = median(head, "threads"), median(tail, "threads")
    total = sum(tally.counts.values())
    by_kind: dict[str, Counter] = {}
    for (kind, status), n in tally.counts.items():
        by_kind.setdefault(kind, Counter())[status] += n
    checks = {
        "every request answered as allowed": not tally.problems,
        f"rss growth after warm-up < {MAX_RSS_GROWTH:.0%}": growth < MAX_RSS_GROWTH,
        "file descriptors flat": fds1 - fds0 <= FD_SLACK,
        "threads flat": th1 - th0 <= THREAD_SLACK,
        "client threads finished": not alive,
        "healthy at the end": healthy,
        "clean exit on SIGTERM": exit_code == 0,
    }
    print(f"soak: {SECONDS:g} s, {total} requests "
          f"({total / SECONDS:.0f}/s), warm-up {SECONDS * WARMUP_SHARE:g} s")
    for kind, counts in sorted(by_kind.items()):
        print(f"  {kind:13s} " + ", ".join(f"{s}: {n}" for s, n in sorted(
            counts.items(), key=lambda item: (item[0] is None, item[0] or 0))))
    print(f"  rss       {rss0 / 2**20:.1f} -> {rss1 / 2**20:.1f} MiB ({growth:+.1%}), "
          f"peak {max(s['rss'] for s in samples) / 2**20:.1f} MiB")
    print(f"  fds       {fds0:g} -> {fds1:g}; threads {th0:g} -> {th1:g}")
    for problem in tally.problems:
        print(f"  problem: {problem}")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
