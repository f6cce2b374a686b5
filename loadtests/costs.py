"""The two costs the queueing model needs, measured on this machine (notebooks 07 and 08).

``time_batches``
    median seconds of one model call per batch size, one intra-op thread, on the server's
    core, interleaving the batch sizes as notebook 01 does;
``measure_t_http``
    seconds of the server's core per request with a no-op model (the same body size, a
    10-number answer), saturated by closed-loop clients from the other core: the method of
    ``bench/server_efficiency.py``, with its helpers from ``bench/harness.py``.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
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
                 device: str = "cpu") -> list[float]:
    """Median seconds per call for each batch size (rows of ``row_shape[1:]``)."""
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
                    started = time.perf_counter()
                    model(batch)
                    sync()
                    spent_list.append(time.perf_counter() - started)
                    spent += spent_list[-1]
    return [statistics.median(t) for t in timings]


class _NoOpTen(torch.nn.Module):
    """No compute; answers 10 numbers per row, as a classifier would."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, :10]


def measure_t_http(row_shape: Sequence[int], seconds: float = 5.0, connections: int = 32,
                   max_batch_size: int = 32) -> tuple[float, float]:
    """(t_http seconds, no-op requests/s): one row of ``row_shape`` per request as .npy."""
    return measure_t_http_many([row_shape], seconds, connections, max_batch_size)[0]


def measure_t_http_many(row_shapes: Sequence[Sequence[int]], seconds: float = 5.0,
                        connections: int = 32,
                        max_batch_size: int = 32) -> list[tuple[float, float]]:
    """``measure_t_http`` for several request shapes with one server (the no-op model takes
    any shape), one after the other."""
    from loadtests._payload import npy_row

    if str(REPO_ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "bench"))
    import harness  # bench/harness.py

    out = []
    with tempfile.TemporaryDirectory(prefix="mmserver-noop-") as tmp:
        root = Path(tmp)
        harness.save_torchscript(_NoOpTen(), torch.zeros(2, 3, 8, 8), root / "noop")
        with harness.mmserver(root, {"noop": root / "noop"}, "--max-batch-size",
                              str(max_batch_size), "--max-wait-ms", "0") as base:
            for row_shape in row_shapes:
                body = npy_row(tuple(row_shape))
                result, _ = harness.saturate_model(base, "noop", body, "application/x-npy",
                                                   connections=connections, seconds=seconds,
                                                   warmup_seconds=min(2.0, seconds / 2))
                if result["non_2xx"]:
                    raise RuntimeError(f"the no-op model answered {result['non_2xx']} errors")
                out.append((1.0 / result["rps"], result["rps"]))
    return out
