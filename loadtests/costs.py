"""The two costs the queueing model needs, measured on this machine (notebooks 07 and 08).

``time_batches``
    median seconds of one model call per batch size, one intra-op thread, on the server's
    core, interleaving the batch sizes as notebook 01 does;
``saturate_models``
    the server's own counts while each of its models is saturated in turn (answered, shed,
    the server process's CPU seconds, the window, the mean batch): the inputs of
    ``definitions.t_http_s`` (per CPU second, with ``write_noop_model``'s model) and of
    ``definitions.capacity_rps``, measured as notebook 04 measures them.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVER_CPU = 0


@contextlib.contextmanager
def on_server_core(threads: int = 1) -> Iterator[None]:
    """Run on the server's core with ``threads`` torch threads, then restore both (so that
    processes started afterwards may still be pinned elsewhere)."""
    can_pin = hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) > 1
    before_cpus = os.sched_getaffinity(0) if can_pin else None
    before_threads = torch.get_num_threads()
    try:
        if can_pin and SERVER_CPU in before_cpus:
            os.sched_setaffinity(0, {SERVER_CPU})
        torch.set_num_threads(threads)
        yield
    finally:
        torch.set_num_threads(before_threads)
        if before_cpus is not None:
            os.sched_setaffinity(0, before_cpus)


def time_batches(model: torch.nn.Module, row_shape: Sequence[int], batch_sizes: Sequence[int],
                 rounds: int = 3, seconds_per_round: float = 0.2, warmup: int = 2,
                 device: str = "cpu", clock=time.perf_counter) -> list[float]:
    """Median seconds per call for each batch size (rows of ``row_shape[1:]``).

    ``clock`` reads the seconds: wall clock by default; ``time.thread_time`` gives the CPU
    seconds of the calling thread (one intra-op thread on a CPU), what a call costs its core
    whatever else the machine runs meanwhile, as notebook 04 times a call (on a CPU only).
    """
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(b, *row_shape[1:], generator=generator).to(device) for b in batch_sizes]
    timings: list[list[float]] = [[] for _ in batch_sizes]

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    with torch.inference_mode():
        for batch in batches:
            for _ in range(warmup):
                model(batch)
        sync()
        for _ in range(rounds):
            for batch, spent_list in zip(batches, timings):
                spent = 0.0
                while spent < seconds_per_round:
                    started = clock()
                    model(batch)
                    sync()
                    spent_list.append(clock() - started)
                    spent += spent_list[-1]
    return [statistics.median(t) for t in timings]


class _NoOpTen(torch.nn.Module):
    """No compute; answers 10 numbers per row, as a classifier would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, :10]


def _harness():
    """``bench/harness.py``, the benchmarks' server and load-generator helpers."""
    if str(REPO_ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "bench"))
    import harness

    return harness


def write_noop_model(model_dir: Path) -> Path:
    """TorchScript of the no-op model (no compute, a 10-number answer per row) in ``model_dir``."""
    harness = _harness()

    return harness.save_torchscript(_NoOpTen(), torch.zeros(2, 3, 8, 8), Path(model_dir))


def saturate_models(models: dict, body: bytes, *, max_batch_size: int, window_s: float = 3.0,
                    connections: int = 32, warmup_s: float = 1.0,
                    max_queue_size: int = 64) -> dict[str, dict]:
    """Each model of one mmserver saturated in turn; per model, the server's own view.

    ``models`` maps a name to a model folder (its ``mmserver.json``, if any, applies: e.g.
    ``{"max_batch_size": 1}`` for batching off). One server, pinned to the server core with
    one torch thread, ``--max-batch-size max_batch_size --max-wait-ms 0``. For each model,
    ``connections`` closed-loop keep-alive clients (``bench/harness.py``'s generator, a process
    on the load core) POST ``body`` (``.npy``) for ``warmup_s + window_s`` seconds plus their
    start-up; the window is taken inside that run, once answers flow: ``/metrics`` deltas
    and the server process's CPU seconds (psutil: user + system, every thread) over
    ``window_s`` wall-clock seconds. Returns, per model: ``answered`` (200s), ``shed``
    (503s of a full queue: ``reason="queue_full"``), ``server_cpu_s``, ``window_s``, ``mean_batch`` (rows per call), for
    ``definitions.t_http_s``, ``capacity_rps`` and ``core_share``. Keep ``connections`` at
    least twice the cap and at most ``max_queue_size``, as ``capacity_rps`` asks.
    """
    import threading

    import psutil

    from mmserver.harness.testing import ServerProcess, sample_value

    harness = _harness()

    args = ["--no-access-log", "--log-level", "WARNING",
            "--max-batch-size", str(max_batch_size), "--max-wait-ms", "0",
            "--max-queue-size", str(max_queue_size)]
    for root in sorted({str(Path(path).resolve().parent) for path in models.values()}):
        args += ["--model-root", root]                       # a preload lies under a model root
    for name, path in models.items():
        args += ["--preload", f"{name}={Path(path).resolve()}"]
    out = {}
    server = ServerProcess(args, env=harness.ONE_THREAD, cpus=harness.SERVER_CPU, cwd=REPO_ROOT)
    with harness.serving(server):
        process = psutil.Process(server.process.pid)
        for name in models:
            url = f"{server.url}/models/{name}/invoke"

            def answered(metrics, name=name) -> float:
                return sample_value(metrics, "mmserver_requests_total", model=name, status="200")

            start = answered(server.metrics())
            load = threading.Thread(target=harness.closed_loop, args=(url, body, "application/x-npy"),
                                    kwargs={"connections": connections,
                                            "seconds": warmup_s + window_s + 1.0})
            load.start()
            deadline = time.monotonic() + harness.GENERATOR_GRACE_SECONDS
            while answered(server.metrics()) == start:      # the generator's start-up
                if time.monotonic() > deadline or not load.is_alive():
                    raise RuntimeError(f"no answers from {name} under load")
                time.sleep(0.05)
            time.sleep(warmup_s)
            before, cpu_before, began = server.metrics(), sum(process.cpu_times()[:2]), time.monotonic()
            time.sleep(window_s)
            after, cpu_after, ended = server.metrics(), sum(process.cpu_times()[:2]), time.monotonic()
            load.join()

            def delta(sample: str, **labels) -> float:
                return (sample_value(after, sample, model=name, **labels)
                        - sample_value(before, sample, model=name, **labels))

            calls = delta("mmserver_batch_size_rows_count")
            out[name] = {"answered": delta("mmserver_requests_total", status="200"),
                         "shed": delta("mmserver_requests_unavailable_total",
                                       reason="queue_full"),
                         "server_cpu_s": cpu_after - cpu_before, "window_s": ended - began,
                         "mean_batch": delta("mmserver_batch_size_rows_sum") / calls if calls else 0.0}
    return out
