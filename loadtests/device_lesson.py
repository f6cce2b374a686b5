"""Notebook 08's harness: the simulated-GPU servers it starts, the runs it drives, the tables
and figures it prints.

The notebook shows each step; the machinery lives here. What is measured goes through
``loadtests.instruments`` (each call returns ``Measurement`` records), what is concluded
through ``loadtests.verdicts``. Every model folder here is a ``SimulatedDevice``
(``mmserver.harness.simulated_device``): the timings in this process load the folder the
server loads (the folder's ``model_fn`` builds ``SimulatedDevice.from_file``), never a copy built another way.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

if not __package__:  # locust -f loadtests imports each file on its own, from anywhere
    import _repo_path  # noqa: F401

from loadtests import definitions, instruments, plots
from loadtests.shared_device import MODEL_A, MODEL_B, Batching
from loadtests.shared_device import measure as measure_shared
from loadtests.sweep import SIMULATED

FEATURES = 16          #: numbers per row: the simulated model's input
ROW = (FEATURES,)


# -- model folders and servers --------------------------------------------------------------------


def write_copy(root: Path, name: str, batching: Batching, time_scale: float) -> Path:
    """A simulated V100 at ``time_scale`` with ``batching`` in its ``mmserver.json``; each copy
    on a device (stream) of its own."""
    from mmserver.harness.simulated_device import write_model_folder

    folder = write_model_folder(root / name, time_scale=time_scale, input_features=FEATURES, stream=name)
    (folder / "mmserver.json").write_text(json.dumps(batching.as_json()))
    return folder


def server(root: Path, names: Sequence[str], log_name: str, *, cpus: str | None = "0", http_workers: int = 1):
    """A ``ServerProcess`` (not started) preloading the copies ``names`` under ``root``: one
    process on core 0, or ``http_workers`` workers over one engine on every core."""
    from mmserver.harness.testing import ServerProcess

    args = ["--model-root", root, "--no-access-log", "--log-level", "WARNING"]
    if http_workers > 1:
        args += ["--http-workers", str(http_workers)]
    for name in names:
        args += ["--preload", f"{name}={root / name}"]
    return ServerProcess(args, cpus=cpus if http_workers == 1 else None, cwd=root, log_path=root / log_name)


def engine_and_workers(server, model: str) -> dict[str, int]:
    """label -> pid of every process of a ``--http-workers`` server: its engine (as the
    server reports it for ``model``) and the rest (the parent and its HTTP workers)."""
    import psutil

    engine = server.json("GET", f"/models/{model}")[1]["engine"]["pid"]
    pids = [server.process.pid] + [p.pid for p in psutil.Process(server.process.pid).children(recursive=True)]
    others = [pid for pid in pids if pid != engine]
    return {"engine": engine, **{f"process {i}": pid for i, pid in enumerate(others, 1)}}


def saturated(server, settings: Mapping[str, Batching], body: bytes, content_type: str, *,
              http_workers: int = 1, **saturate) -> dict[str, instruments.ServerRun]:
    """Start ``server``, check it runs each copy with its ``settings``, put this process (the
    clients) on core 1, ``instruments.saturate`` every copy, stop the server. With HTTP
    workers, every process's CPU is counted, each on its own."""
    from mmserver.harness.testing import wait_for_http_workers
    from mmserver.http.app import WORKER_HEADER

    all_cpus = os.sched_getaffinity(0)
    try:
        server.start()
        processes = None
        if http_workers > 1:
            wait_for_http_workers(server.url, http_workers, WORKER_HEADER)
            processes = engine_and_workers(server, next(iter(settings)))
        for name, batching in settings.items():
            reported = server.json("GET", f"/models/{name}")[1]["batching"]
            assert (reported["policy"], reported["maxBatchSize"], reported["maxWaitMs"]) == (
                batching.policy, batching.max_batch_size, batching.max_wait_ms), reported
        if 1 in all_cpus:
            os.sched_setaffinity(0, {1})
        return instruments.saturate(server, {n: s.max_batch_size for n, s in settings.items()}, body,
                                    content_type, processes=processes, **saturate)
    finally:
        os.sched_setaffinity(0, all_cpus)
        server.stop()


def time_copy(folder: Path, max_batch_size: int, *, rounds: int, seconds_per_round: float,
              name: str | None = None) -> instruments.CallTimes:
    """``instruments.time_calls`` on the device the server builds from ``folder`` (wall clock:
    the simulated device holds no CPU), at every size up to ``max_batch_size``."""
    from mmserver.harness.simulated_device import SETTINGS_FILE, SimulatedDevice

    device = SimulatedDevice.from_file(folder / SETTINGS_FILE)   # what the folder's model_fn builds
    return instruments.time_calls(device, ROW, max_batch_size, clock="wall", rounds=rounds,
                                  seconds_per_round=seconds_per_round, name=name or folder.name)


# -- step 2: python -m loadtests.sweep --------------------------------------------------------------


def sweep(out: Path, repo: Path, *, time_scale: float, policies: Sequence[str], waits_ms: Sequence[float],
          loads: Sequence[float], max_batch_size: int, queue: int, duration_s: float, warmup_s: float) -> list[dict]:
    """``python -m loadtests.sweep`` on the simulated device, one repeat per point, into ``out``:
    its rows (``sweep.csv``)."""
    command = [sys.executable, "-m", "loadtests.sweep", "--model", SIMULATED,
               "--time-scale", f"{time_scale:g}", "--policies", ",".join(policies),
               "--batch-sizes", str(max_batch_size), "--waits-ms", ",".join(f"{w:g}" for w in waits_ms),
               "--loads", ",".join(f"{x:g}" for x in loads), "--repeats", "1",
               "--duration", f"{duration_s:g}", "--warmup", f"{warmup_s:g}",
               "--max-queue-size", str(queue), "--users-per-rps", "2", "--max-users", "1200",
               "--out", str(out), "--no-plots"]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    rows = plots.load_rows(out / "sweep.csv")
    print(f"{out.name}: {len(rows)} points in {time.perf_counter() - started:.0f} s")
    return rows


def by_load(rows: Sequence[dict]) -> dict[float, list[dict[str, instruments.Measurement]]]:
    """offered load -> each point's records (``instruments.sweep_point``), by MAX_WAIT."""
    points: dict[float, list] = {}
    for row in sorted(rows, key=lambda r: (r["offered_rps"], r["effective_max_wait_ms"])):
        points.setdefault(row["offered_rps"], []).append(instruments.sweep_point(row))
    return points


def print_wait_table(points: Mapping[float, list], max_batch_size: int) -> None:
    print(f"simulated device, MAX_BATCH_SIZE {max_batch_size}; the server's window (served, calls, batch, queue, "
          "device, busy) and locust's (p50, p99, n)")
    print(f"{'offered':>7} {'served':>6} {'policy':>6} {'wait':>5} {'calls':>5} {'batch':>6} {'queue':>6} {'device/req':>10} "
          f"{'busy':>5} {'p50':>5} {'p99':>5} {'n':>5}")
    print(f"{'req/s':>7} {'req/s':>6} {'':>6} {'ms':>5} {'':>5} {'rows':>6} {'ms':>6} {'ms':>10} {'':>5} {'ms':>5} {'ms':>5}")
    for load, line in points.items():
        for p in line:
            where, seen = p["mean batch"].where, p["mean batch"].observed
            print(f"{load:>7g} {seen['served_rps']:>6.0f} {where['policy']:>6} {where['max_wait_ms']:>5g} "
                  f"{seen.get('batches', 0):>5} {p['mean batch'].value:>6.2f} {p['queue wait'].value * 1e3:>6.1f} "
                  f"{p['device time per request'].value * 1e3:>10.2f} {p['busy fraction'].value:>5.0%} "
                  f"{p['p50'].value * 1e3:>5.0f} {p['p99'].value * 1e3:>5.0f} {seen['requests']:>5}")
    if any(p["busy fraction"].value > 0.995 for line in points.values() for p in line):
        print("A busy share of 100% means the device never idled in the window, not that the load passed its "
              "capacity: greedy starts a call whenever anything waits. The share is the device time of the calls "
              "the window counted over its length, and a call that straddles the window's edge counts whole, so "
              "it can read a little above 100%.")


def plot_waits(points: Mapping[float, list], shares: Sequence[float], title: str) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.9))
    for (load, line), share in zip(points.items(), shares):
        waits = [p["p50"].where["max_wait_ms"] for p in line]
        label = f"{load:g} req/s ({share:.0%} of capacity)"
        axes[0].plot(waits, [p["mean batch"].value for p in line], "o-", label=label)
        axes[1].plot(waits, [p["device time per request"].value * 1e3 for p in line], "o-", label=label)
        axes[2].plot(waits, [p["p50"].value * 1e3 for p in line], "o-", label=f"p50, {label}")
        axes[2].plot(waits, [p["p99"].value * 1e3 for p in line], "x:", color=axes[2].lines[-1].get_color(),
                     label=f"p99, {label}")
    for ax, ylabel, what in zip(axes, ("mean batch (rows)", "device time per request (ms)",
                                       "latency at the client (ms)"),
                                ("Batches grow with MAX_WAIT", "What a request costs the device",
                                 "What the wait costs in latency")):
        ax.set_ylabel(ylabel)
        ax.set_title(what)
        ax.set_xlabel("MAX_WAIT (ms; 0 = greedy, else timer)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small", loc="upper right" if ax is axes[1] else "upper left")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    plt.show()


# -- step 3: two models on one device --------------------------------------------------------------


def shared_device(a_settings: Mapping[str, Batching], b: Batching, load_a: float, load_b: float, *,
                  repeats: int, duration_s: float, out: Path) -> dict[str, dict[str, dict]]:
    """``loadtests.shared_device`` for each of A's settings, ``repeats`` times (settings in
    turn): A's label -> model -> quantity -> the record over repeats (``instruments.over_repeats``)."""
    runs: dict[str, list] = {label: [] for label in a_settings}
    started = time.perf_counter()
    for repeat in range(repeats):
        for label, a in a_settings.items():
            runs[label].append(measure_shared(a, b, load_a, load_b, duration_s=duration_s,
                                              out=out / f"shared-{repeat}-{a.policy}", warmup_s=1.0))
    print(f"shared device: {repeats} repeat{'s' * (repeats != 1)} of each setting in {time.perf_counter() - started:.0f} s")
    result = {}
    for label, repeated in runs.items():
        result[label] = {}
        for model in (MODEL_A, MODEL_B):
            points = [instruments.sweep_point(run[model]) for run in repeated]
            result[label][model] = {q: instruments.over_repeats([p[q] for p in points]) for q in points[0]}
            result[label][model]["shed"] = sum(run[model]["shed_503"] for run in repeated)
            result[label][model]["served"] = sorted(run[model]["achieved_rps"] for run in repeated)[len(repeated) // 2]
    return result


def print_shared_table(shared: Mapping[str, dict], load_a: float, load_b: float, max_batch_size: int) -> None:
    print(f"simulated device; A offered {load_a:g} req/s, B offered {load_b:g} req/s (greedy, {max_batch_size}); "
          "medians over repeats, B shed: summed")
    print(f"{'A runs':>14} | {'A batch':>7} {'A p50':>6} | {'B served':>8} {'B batch':>7} {'B queue':>7} "
          f"{'B p50':>6} {'B p99':>6} {'B shed':>6}")
    print(f"{'':>14} | {'rows':>7} {'ms':>6} | {'req/s':>8} {'rows':>7} {'ms':>7} {'ms':>6} {'ms':>6}")
    for label, models in shared.items():
        a, b = models[MODEL_A], models[MODEL_B]
        print(f"{label:>14} | {a['mean batch'].value:>7.2f} {a['p50'].value * 1e3:>6.0f} | {b['served']:>8.0f} "
              f"{b['mean batch'].value:>7.2f} {b['queue wait'].value * 1e3:>7.1f} "
              f"{b['p50'].value * 1e3:>6.0f} {b['p99'].value * 1e3:>6.0f} {b['shed']:>6}")


# -- Q(d): the cost curves side by side ---------------------------------------------------------


def print_curves(curves: Mapping[str, instruments.CallTimes]) -> None:
    """t(b) and t(b)/t(1) of each timed model at every size it was timed at."""
    names = list(curves)
    sizes = curves[names[0]].batch_sizes
    print(f"{'batch b':>8} " + " ".join(f"{n + ': t(b) ms':>34} {'t(b)/t(1)':>9}" for n in names))
    for b in sizes:
        print(f"{b:>8} " + " ".join(f"{curves[n].seconds(b) * 1e3:>34.2f} "
                                    f"{curves[n].seconds(b) / curves[n].seconds(1):>9.2f}" for n in names))


def real_gpu(max_batch_size: int, repo: Path) -> str:
    """What ``python -m loadtests.accelerator`` measured, if its results are in ``results/cuda/``:
    per model, the fixed share and the per-row speedup at ``max_batch_size`` from its
    in-process times; else a line saying no real GPU was measured."""
    path = repo / "results" / "cuda" / "inprocess.csv"
    if not path.exists():
        return ("No real GPU was measured: results/cuda/ holds no measurements. Everything above ran on the "
                "simulated device. On a CUDA host run `python -m loadtests.accelerator`, then this notebook again.")
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["device"] == "cuda"]
    sizes = instruments.profile_sizes(max_batch_size)
    lines = []
    for name in sorted({r["model"] for r in rows}):
        by_size = {int(float(r["batch_size"])): float(r["compute_ms"]) / 1e3 for r in rows if r["model"] == name}
        if all(b in by_size for b in sizes):
            seconds = [by_size[b] for b in sizes]
            fixed_s, per_row_s = definitions.fit_cost_line(sizes, seconds)
            share = (f"fixed share {definitions.fixed_share(fixed_s, per_row_s):.0%}" if per_row_s > 0
                     else "fixed share 100% (the cost line through " + ", ".join(
                         f"t({b}) {by_size[b] * 1e3:.2f} ms" for b in definitions.FIT_BATCH_SIZES)
                     + " does not rise: a call there is all fixed cost)")
            first = next(r for r in rows if r["model"] == name)
            lines.append(f"real GPU, {first['device_name']} (results/cuda/inprocess.csv, measured elsewhere with "
                         f"torch {first['torch_version']}), {name}: {share}, speedup at "
                         f"{max_batch_size} {definitions.speedup(sizes, seconds, max_batch_size):.2f}×")
    if not lines:
        lines.append("results/cuda/inprocess.csv holds no model timed at every size up to B.")
    return "\n".join(lines + _served_on_gpu(path.with_name("efficiency.txt")))


def _served_on_gpu(path: Path) -> list[str]:
    """The lines of ``bench/accelerator_efficiency.py``'s runs in ``efficiency.txt``: per model, what
    one mmserver process served and its share of the raw model's rate at the batches it formed."""
    if not path.exists():
        return []
    found = re.findall(r"--model (\S+).*?\nmmserver:\s+([\d.]+) requests/s, mean batch ([\d.]+) rows"
                       r".*?efficiency=([\d.]+)", path.read_text(), flags=re.S)
    return [f"through one mmserver process (results/cuda/efficiency.txt), {name}: {float(rps):.0f} requests/s at "
            f"a mean batch of {batch} rows, {float(ratio):.2f} of the raw model's rate at that batch"
            for name, rps, batch, ratio in found]


# -- step 4: who feeds the device ------------------------------------------------------------------


def print_feeding(label: str, run: instruments.ServerRun, times: instruments.CallTimes) -> None:
    """One line: what one server served of a simulated device, how long its calls took as the
    server times them against the device's own t(b), and what the server's core spent."""
    served = instruments.served(run)
    per_request, core = instruments.device_time_per_request(run), instruments.core_share(run)
    t_http, ceiling = instruments.t_http(run), instruments.offline_ceiling(times, run.max_batch_size)
    b = run.max_batch_size
    print(f"{label:>18}: ceiling {ceiling.value:6.0f} requests/s | served {served.value:6.0f} requests/s, "
          f"batches of {run.mean_batch:4.1f} rows; calls as the server times them "
          f"{per_request.value * run.mean_batch * 1e3:.1f} ms (device t({b // 2}) {times.seconds(b // 2) * 1e3:.1f}, "
          f"t({b}) {times.seconds(b) * 1e3:.1f} ms) | server core "
          f"{core.value:4.0%} | t_http {t_http.value * 1e6:4.0f} µs → cores_to_feed "
          f"{definitions.cores_to_feed(ceiling.value, t_http.value):.2f}")
