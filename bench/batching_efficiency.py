"""How much of the raw model's batched speed does ModelRunner keep?

In-process, no HTTP. Closed-loop clients keep a resnet18 (3x64x64 inputs,
random weights) saturated through ``ModelRunner``; we record the batch sizes
the runner formed and its wall-clock time. Then we call the same model in a
tight loop at exactly those batch sizes, same thread settings, and add up what
the same batches cost raw. The last line is

    efficiency=<raw time for the same batches / time through the runner>

(the median over a few rounds, each a runner run followed at once by its raw
replay, so that drift in a shared machine's speed hits both sides alike)

1.0 means the runner adds nothing (queueing, concatenation, the thread hop,
splitting the output); the target on a 2-core CPU is 0.90 or more.

Usage: python bench/batching_efficiency.py [--clients 64] [--items 768] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import time
from pathlib import Path

import torch
import torchvision

from mmserver.batching import BatchSettings, ModelRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import median_call_seconds  # noqa: E402

INPUT_SHAPE = (3, 64, 64)


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torchvision.models.resnet18(num_classes=10).eval()


async def saturate(model, clients: int, items: int, max_batch_size: int):
    """Closed-loop clients, one row each, until ``items`` requests are answered."""
    settings = BatchSettings(max_batch_size=max_batch_size, max_wait=0.0,
                             max_queue_size=clients, policy="greedy")
    runner = ModelRunner(model, settings, name="resnet18")
    remaining = items

    async def client():
        nonlocal remaining
        x = torch.randn(1, *INPUT_SHAPE)
        while remaining > 0:
            remaining -= 1
            await runner.submit(x)

    async with runner:
        await asyncio.gather(*(client() for _ in range(clients)))  # warm-up round
        runner.stats.batch_size_counts.clear()
        remaining = items
        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    return elapsed, collections.Counter(runner.stats.batch_size_counts)


def raw_seconds_per_batch(model, batch_size: int, repeats: int) -> float:
    return median_call_seconds(model, torch.randn(batch_size, *INPUT_SHAPE), repeats)


def replay_raw(model, counts: collections.Counter) -> float:
    """Call the model in a tight loop on exactly the batches the runner formed."""
    batches = {b: torch.randn(b, *INPUT_SHAPE) for b in counts}
    with torch.inference_mode():
        for x in batches.values():
            model(x)
        started = time.perf_counter()
        for b, n in sorted(counts.items()):
            for _ in range(n):
                model(batches[b])
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--items", type=int, default=768)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=5, help="raw timings per batch size")
    parser.add_argument("--rounds", type=int, default=3,
                        help="runner run + raw replay pairs; the median ratio is reported, "
                             "since a shared machine's speed drifts between runs")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model = build_model()
    print(f"torch {torch.__version__}, {args.threads} intra-op thread(s), "
          f"resnet18 on {INPUT_SHAPE}, {args.clients} closed-loop clients")

    raw = {b: raw_seconds_per_batch(model, b, args.repeats) for b in (1, args.max_batch_size)}
    print(f"raw model: {1 / raw[1]:.1f} items/s at batch 1, "
          f"{args.max_batch_size / raw[args.max_batch_size]:.1f} items/s "
          f"at batch {args.max_batch_size}")
    ratios = []
    for round_ in range(1, args.rounds + 1):
        elapsed, counts = asyncio.run(
            saturate(model, args.clients, args.items, args.max_batch_size))
        raw_total = replay_raw(model, counts)
        rows = sum(b * n for b, n in counts.items())
        ratios.append(raw_total / elapsed)
        print(f"round {round_}: ModelRunner {rows / elapsed:.1f} items/s, raw model on the same "
              f"batches {rows / raw_total:.1f} items/s, ratio {ratios[-1]:.3f}; batch sizes "
              f"(rows: batches) " + ", ".join(f"{b}: {n}" for b, n in sorted(counts.items())))
    print(f"efficiency={statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
