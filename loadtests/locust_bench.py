"""Notebook 06's bench: one pinned server, locust runs against it, and what to read back.

The notebook tells the story; this module holds the machinery it repeats: starting locust
headless with ``--csv`` (pinned to the clients' core), reading locust's CSV files back, the
batch-size histogram the server formed between two ``/metrics`` scrapes, freezing the server
(SIGSTOP/SIGCONT) on cue, and measuring a window of the server's own counts through
``loadtests.instruments`` while locust runs. Its figures are drawn by :func:`plot_loops` and
:func:`plot_overload`.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

if not __package__:  # locust -f loadtests imports each file on its own, from anywhere
    import _repo_path  # noqa: F401

from loadtests import instruments, plots
from loadtests._names import SHED_SUFFIX

REPO = Path(__file__).resolve().parent.parent
#: The percentiles locust writes to its stats CSV, in order.
PERCENTILES = ("50%", "66%", "75%", "80%", "90%", "95%", "98%", "99%", "99.9%", "100%")
MODEL = "resnet18"


def read_csv(path) -> list[dict]:
    """Rows of a locust CSV file as dicts, numbers as floats ("N/A" as nan)."""
    def value(text):
        try:
            return float(text)
        except ValueError:
            return float("nan") if text == "N/A" else text
    with open(path, newline="") as f:
        return [{k: value(v) for k, v in r.items()} for r in csv.DictReader(f)]


def row(stats: list[dict], name: str) -> dict:
    """locust's summary row for one request name (zero counts if it never happened)."""
    return next((r for r in stats if r["Name"] == name), {"Request Count": 0.0, "Failure Count": 0.0})


def series(history: list[dict], name: str, column: str):
    """(seconds since the first row, values) of one request name in locust's history."""
    import numpy as np

    t0 = history[0]["Timestamp"]
    rows = [r for r in history if r["Name"] == name]
    return np.array([r["Timestamp"] - t0 for r in rows]), np.array([r[column] for r in rows])


def share_over(summary: dict, threshold_ms: float) -> tuple[float, float]:
    """(low, high): the share of requests slower than ``threshold_ms``, bracketed between two
    of locust's coarse percentiles (low end at least one request)."""
    over = [k for k, p in enumerate(PERCENTILES) if summary[p] >= threshold_ms]
    if not over:
        return 0.0, 0.0
    low = max(1 - float(PERCENTILES[over[0]][:-1]) / 100, 1 / summary["Request Count"])
    high = 1.0 if over[0] == 0 else 1 - float(PERCENTILES[over[0] - 1][:-1]) / 100
    return low, high


def batch_sizes_between(before: str, after: str, model: str = MODEL) -> dict[float, float]:
    """Model calls per batch-size bucket (its upper bound) between two ``/metrics`` scrapes."""
    import numpy as np
    from mmserver.harness.testing import histogram

    cumulative_after, _, _ = histogram(after, "mmserver_batch_size_rows", model=model)
    cumulative_before, _, _ = histogram(before, "mmserver_batch_size_rows", model=model)
    bounds = list(cumulative_after)
    cumulative = [cumulative_after[b] - cumulative_before.get(b, 0.0) for b in bounds]
    return dict(zip(bounds, np.diff([0.0, *cumulative])))


def largest_bucket(counts: dict[float, float]) -> float:
    """The upper bound of the histogram bin that holds the largest batch formed."""
    return max(b for b, calls in counts.items() if calls > 0)


def largest_bin(counts: dict[float, float]) -> str:
    """The histogram bin of the largest batch formed, labelled as every figure labels it
    (``plots.batch_bins``: ``3–4`` rows)."""
    return next(label for _, high, label in reversed(plots.batch_bins(counts)) if counts[high] > 0)


@dataclasses.dataclass
class LocustRun:
    """One locust run: its summary rows, its history, and the batches the server formed."""

    stats: list[dict]
    history: list[dict]
    batches: dict[float, float]

    def summary(self, name: str = f"invoke {MODEL}") -> dict:
        return row(self.stats, name)

    def loop_summary(self, stall_s: float) -> dict:
        """The numbers the closed/open-loop table prints, locust's latencies in ms (of the
        requests answered 200; ``shed``: those refused with 503, which locust counts apart)."""
        r = self.summary()
        low, high = share_over(r, 0.5 * stall_s * 1e3)
        return {"requests": int(r["Request Count"]), "rps": r["Requests/s"], "p50": r["50%"],
                "p95": r["95%"], "p99": r["99%"], "max": r["Max Response Time"],
                "shed": int(row(self.stats, f"invoke {MODEL}{SHED_SUFFIX}")["Request Count"]),
                "share": (low, high), "largest_batch": largest_bucket(self.batches),
                "largest_bin": largest_bin(self.batches)}


class Bench:
    """A started ``ServerProcess`` (on core 0), a work folder, the example models' folder, and
    the ``taskset`` prefix that puts locust on core 1. ``started`` is told of every locust
    process (the notebook's ``lesson.started``), so that none outlives the notebook."""

    def __init__(self, server, work: Path, examples: Path, pin: list[str],
                 started: Callable = lambda process: process, model: str = MODEL):
        self.server, self.work, self.examples, self.pin = server, Path(work), Path(examples), pin
        self.started, self.model = started, model

    def requests_so_far(self) -> float:
        return self.server.metric("mmserver_requests_total", model=self.model)

    def wait_for_load(self, process) -> None:
        """Return once locust's first requests have reached the server."""
        first = self.requests_so_far()
        while self.requests_so_far() == first and process.poll() is None:
            time.sleep(0.05)

    def run(self, name: str, user_classes: list[str], users: int, *options, seconds: float,
            host: str | None = None, during: Callable | None = None) -> LocustRun:
        """locust headless for ``seconds`` with ``--csv`` and full history; ``during(process)``
        runs while it runs (to disturb or watch the server on cue)."""
        prefix = self.work / name
        command = [*self.pin, sys.executable, "-m", "locust", "-f", str(REPO / "loadtests"),
                   "--headless", "-u", str(users), "-r", str(users), "-t", f"{int(seconds)}s",
                   "--host", host or self.server.url, "--csv", str(prefix), "--csv-full-history",
                   "--only-summary", "--mm-examples-dir", str(self.examples), *map(str, options),
                   *user_classes]
        before = self.server.metrics() if host is None else None
        with open(self.work / f"{name}.log", "w") as log:
            process = self.started(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log,
                                                    cwd=REPO, env=os.environ.copy()))
            try:
                if during is not None:
                    during(process)
                process.wait(timeout=600)
            finally:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        batches = batch_sizes_between(before, self.server.metrics(), self.model) if before else {}
        return LocustRun(read_csv(f"{prefix}_stats.csv"), read_csv(f"{prefix}_stats_history.csv"), batches)

    def stall(self, at_s: float, stall_s: float) -> Callable:
        """A ``during`` that freezes the server for ``stall_s`` (SIGSTOP, then SIGCONT),
        ``at_s`` after locust's first request reached it."""
        def during(process):
            self.wait_for_load(process)
            time.sleep(at_s)
            self.server.process.send_signal(signal.SIGSTOP)
            time.sleep(stall_s)
            self.server.process.send_signal(signal.SIGCONT)
        return during

    def window(self, window_s: float, *, after_s: float, users: int, driver: str, max_batch_size: int,
               body_bytes: int, into: dict, probe: dict | None = None) -> Callable:
        """A ``during`` that measures one window (``instruments.observe``) ``after_s`` after
        locust's load arrived, and stores the ``ServerRun`` in ``into["run"]`` with locust's
        CPU share (``into["locust_core"]``) and core 0's busy share as the OS saw it
        (``into["core0_busy"]``). With ``probe`` (``instruments.probe``'s keyword arguments and
        ``body``/``headers``), the probe's clients send during the window
        (``into["probe"]``)."""
        import psutil

        def during(process):
            self.wait_for_load(process)
            time.sleep(after_s)
            locust, stop = psutil.Process(process.pid), threading.Event()
            locust_cpu, core0 = sum(locust.cpu_times()[:2]), psutil.cpu_times(percpu=True)[0]
            helper = None
            if probe is not None:
                kwargs = {k: v for k, v in probe.items() if k not in ("body", "headers")}
                helper = threading.Thread(target=lambda: into.__setitem__("probe", instruments.probe(
                    self.server.url, f"/models/{self.model}/invoke", probe["body"], probe["headers"], stop,
                    **kwargs)))
                helper.start()
            began = time.perf_counter()
            into["run"] = instruments.observe(self.server, self.model, window_s, max_batch_size=max_batch_size,
                                              connections=users, body_bytes=body_bytes, driver=driver)
            seconds = time.perf_counter() - began
            stop.set()
            if helper is not None:
                helper.join()
            core0_after = psutil.cpu_times(percpu=True)[0]
            into["locust_core"] = (sum(locust.cpu_times()[:2]) - locust_cpu) / seconds
            into["core0_busy"] = 1 - (core0_after.idle - core0.idle) / (sum(core0_after) - sum(core0))
        return during


def plot_loops(runs: dict[str, LocustRun], max_rows: int, users: int, stall_s: float):
    """Left: the batch sizes each run formed (histogram bins); right: locust's percentiles."""
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    any_run = next(iter(runs.values()))
    bounds = [b for b in any_run.batches if b <= max_rows]
    labels = [label for _, _, label in plots.batch_bins(bounds)]
    x = np.arange(len(bounds))
    for k, (kind, run) in enumerate(runs.items()):
        axes[0].bar(x + (k - 1) * 0.27, [run.batches.get(b, 0.0) for b in bounds], width=0.27, label=kind)
    axes[0].set_xticks(x, labels)
    axes[0].axvline(bounds.index(users) + 0.5, color="grey", linestyle="--", linewidth=1,
                    label=f"{users} closed-loop users")
    axes[0].set_xlabel("batch size (rows per model call, histogram bin)")
    axes[0].set_ylabel("model calls (count, symlog scale)")
    axes[0].set_yscale("symlog", linthresh=10)
    axes[0].set_title("Batch sizes the server formed")
    shown = PERCENTILES[:-2]
    for kind, run in runs.items():
        r = run.summary()
        axes[1].plot([float(p[:-1]) for p in shown], [r[p] for p in shown], marker="o", label=kind)
    axes[1].axhline(stall_s * 1e3, color="grey", linestyle="--", linewidth=1, label="the stall")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("percentile of requests (%)")
    axes[1].set_ylabel("latency reported by locust (ms, log scale)")
    axes[1].set_title(f"Latency percentiles, with and without a {stall_s:g} s stall")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="upper right" if ax is axes[0] else "upper left")
    fig.tight_layout()
    return fig


def plot_overload(run: LocustRun, capacity_rps: float, probe_p50_ms: float, bounds_ms: dict[str, float],
                  server_rps: dict[str, float] | None = None):
    """Left: what locust saw answered and shed per second, beside the rates the server counted
    over its own window (``server_rps``: label -> requests/s): locust's moving average lags and
    sees only what locust saw. Right: the accepted requests' p50 over time against the probe's
    and the queue bounds (``bounds_ms``: label -> ms)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 4))
    for name, label in ((f"invoke {MODEL}", "accepted (200), locust's moving average"),
                        (f"invoke {MODEL} (shed 503)", "shed (503), locust's moving average")):
        axes[0].plot(*series(run.history, name, "Requests/s"), label=label)
    axes[0].axhline(capacity_rps, color="grey", linestyle=":", label="capacity (nothing shed)")
    for (label, rps), color in zip((server_rps or {}).items(), ("tab:blue", "tab:orange")):
        axes[0].axhline(rps, color=color, linestyle="--", linewidth=1, label=label)
    axes[0].set_ylabel("requests/s")
    axes[0].set_title("Overload: what locust saw answered and shed")
    axes[1].plot(*series(run.history, f"invoke {MODEL}", "50%"), label="p50 of accepted (locust)")
    axes[1].axhline(probe_p50_ms, color="tab:green", linestyle=":", label="p50 of accepted (probe, window)")
    for (label, ms), style in zip(bounds_ms.items(), ("--", ":", "-.")):
        axes[1].axhline(ms, color="black", linestyle=style, linewidth=1, label=label)
    axes[1].set_ylabel("latency (ms)")
    axes[1].set_title("Latency of accepted requests")
    for ax in axes:
        ax.set_xlabel("time since locust started (s)")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8, loc="center right")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
