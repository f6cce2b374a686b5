"""How close does mmserver come to the serial limit of one core?

The server runs on core 0 and every request costs that core two things: the
HTTP work (parsing, decoding, the runner, encoding) and its share of a batched
model call. So the best one core can do is

    limit = 1 / (t_http + t_model(b) / b)   requests/s

where t_http is the server's time per request with a no-op model (measured
here, saturated, with the same body and an output of the same size) and
t_model(b) is the raw model's time for a batch of b rows (measured here, one
thread, on the same core) at the mean batch size b the server formed. The last
line is

    efficiency=<measured requests/s with the real model / limit>

The model is a small CNN (three conv layers, 32-64-64 channels, 3x32x32
inputs sent as application/x-npy), driven by closed-loop clients from core 1.

Usage: python bench/server_efficiency.py [--seconds 10] [--connections 32]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

INPUT_SHAPE = (3, 32, 32)
CLASSES = 10


class NoOpTen(torch.nn.Module):
    """No compute, but an answer the same size as the CNN's (10 numbers per row)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)[:, :CLASSES]


def npy_body() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.random.default_rng(0).random((1, *INPUT_SHAPE), dtype=np.float32))
    return buffer.getvalue()


def raw_seconds(model: torch.nn.Module, batch_size: int) -> float:
    return harness.median_call_seconds(model, torch.randn(batch_size, *INPUT_SHAPE))


def raw_table(model, batch_sizes) -> dict[int, float]:
    """Raw seconds per call for each batch size, on the server's core with one thread."""
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {int(harness.SERVER_CPU)})
    torch.set_num_threads(1)
    return {b: raw_seconds(model, b) for b in batch_sizes}


def serve_and_load(root: Path, name: str, args) -> tuple[float, float]:
    """Saturate one model; (requests/s, mean rows per batch)."""
    body = npy_body()
    with harness.mmserver(root, {name: root / name}, "--max-batch-size", str(args.max_batch_size),
                          "--max-wait-ms", "0") as base:
        result, mean_batch = harness.saturate_model(
            base, name, body, "application/x-npy", connections=args.connections,
            seconds=args.seconds, warmup_seconds=2)
    if result["non_2xx"]:
        raise SystemExit(f"{name}: {result['non_2xx']} requests failed")
    return result["rps"], mean_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--max-batch-size", type=int, default=32)
    args = parser.parse_args()

    torch.manual_seed(0)
    cnn = harness.SmallCNN().eval()
    example = torch.randn(2, *INPUT_SHAPE)
    print(f"load: {harness.generator_name()}, {args.connections} connections, "
          f"{args.seconds:g} s per run; server on core {harness.SERVER_CPU}")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        harness.save_torchscript(NoOpTen(), example, root / "noop")
        harness.save_torchscript(cnn, example, root / "cnn")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            scripted = torch.jit.load(str(root / "cnn" / "model.pt")).eval()
        # Timed before and after the HTTP runs; the faster reading of each size counts, which
        # makes the limit a conservative one on a machine whose speed drifts.
        before = raw_table(scripted, range(1, args.max_batch_size + 1))
        noop_rps, _ = serve_and_load(root, "noop", args)
        cnn_rps, mean_batch = serve_and_load(root, "cnn", args)

    low = max(1, min(int(mean_batch), args.max_batch_size - 1))
    after = raw_table(scripted, (1, low, low + 1))
    best = {b: min(before[b], after[b]) for b in after}
    t_model = best[low] + (best[low + 1] - best[low]) * (mean_batch - low)  # linear between
    t_http = 1.0 / noop_rps
    limit = 1.0 / (t_http + t_model / mean_batch)
    print(f"no-op model through HTTP: {noop_rps:8.0f} requests/s  "
          f"(t_http = {t_http * 1e6:.0f} us)")
    print(f"raw CNN: {1 / best[1]:8.0f} items/s at batch 1, "
          f"{mean_batch / t_model:8.0f} items/s at batch {mean_batch:.1f}")
    print(f"CNN through HTTP:         {cnn_rps:8.0f} requests/s at mean batch {mean_batch:.1f}")
    print(f"serial limit of one core: {limit:8.0f} requests/s")
    print(f"efficiency={cnn_rps / limit:.3f}")


if __name__ == "__main__":
    main()
