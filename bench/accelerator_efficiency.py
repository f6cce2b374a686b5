"""How much of the raw model's batched throughput does mmserver keep, on the device it runs on?

On a GPU the server's job is to keep the device fed: if it forms batches of b rows, the best
it could do is the raw model's rate at batch b, *including* the copy of the batch from host
memory and of the answer back (a server cannot avoid those). So

    efficiency = served requests/s / (b / t_raw(b))

where b is the mean batch size the server formed while saturated (from its /metrics) and
t_raw(b) is the raw model's time for a batch of b rows fed from pinned host memory,
interpolated between the two measured integer sizes around b. The target on a GPU is 0.9 or
more: the event loop decodes requests while the device computes, so HTTP should hide behind
the model. On a CPU the same code runs and prints the CPU's ratio, which is lower, because the
HTTP work and the model take turns on one core (bench/server_efficiency.py accounts for that).

The last line is ``efficiency=<ratio>``.

Usage: python bench/accelerator_efficiency.py [--model resnet50-224] [--seconds 10]
       (default model: resnet50-224 on CUDA, the resnet18 example, 3x64x64, on a CPU)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import harness

from loadtests._payload import payload
from loadtests.costs import on_server_core
from loadtests.models import build, row_shape, write_model
from mmserver.harness.testing import histogram, scrape_metrics


def raw_seconds(model, name: str, device: torch.device, batch_size: int, repeats: int) -> float:
    """Median seconds of: pinned host batch -> device, model, answer -> host."""
    host = torch.randn(batch_size, *row_shape(name)[1:])
    if device.type == "cuda":
        host = host.pin_memory()

    def call():
        model(host.to(device, non_blocking=True)).to("cpu")
        if device.type == "cuda":
            torch.cuda.synchronize()

    import statistics
    import time

    with torch.inference_mode():
        for _ in range(3):
            call()
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50-224" if cuda else "resnet18",
                        choices=("resnet18", "resnet18-224", "resnet50-224", "standin"))
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=32)
    args = parser.parse_args()
    device = torch.device("cuda" if cuda else "cpu")
    body, headers = payload(args.model)
    name = args.model

    torch.manual_seed(0)
    model = build(name).to(device)
    repeats = 30 if cuda else 10
    pinning = on_server_core(threads=1) if not cuda else _nothing()
    # Timed before and after the HTTP run; the faster reading of each size counts (a
    # conservative ratio on a machine whose speed drifts), as bench/server_efficiency.py does.
    with pinning:
        before_raw = {b: raw_seconds(model, name, device, b, repeats)
                      for b in (args.max_batch_size - 1, args.max_batch_size) if b >= 1}

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_model(name, root / name)
        with harness.mmserver(root, {name: root / name}, "--max-batch-size",
                              str(args.max_batch_size), "--max-wait-ms", "0",
                              "--max-queue-size", str(max(256, 2 * args.connections))) as base:
            url = f"{base}/models/{name}/invoke"
            harness.closed_loop(url, body, headers["Content-Type"], connections=args.connections,
                                seconds=min(3.0, args.seconds))  # warm-up
            before = scrape_metrics(base)
            result = harness.closed_loop(url, body, headers["Content-Type"],
                                         connections=args.connections, seconds=args.seconds)
            after = scrape_metrics(base)
    if result["non_2xx"]:
        raise SystemExit(f"{result['non_2xx']} requests failed")
    _, rows_after, batches_after = histogram(after, "mmserver_batch_size_rows", model=name)
    _, rows_before, batches_before = histogram(before, "mmserver_batch_size_rows", model=name)
    mean_batch = (rows_after - rows_before) / max(1.0, batches_after - batches_before)

    low = max(1, min(int(mean_batch), args.max_batch_size - 1))
    with on_server_core(threads=1) if not cuda else _nothing():
        t_low, t_high = (min(raw_seconds(model, name, device, b, repeats),
                             before_raw.get(b, float("inf"))) for b in (low, low + 1))
    t_raw = t_low + (t_high - t_low) * (mean_batch - low)
    raw_rate = mean_batch / t_raw
    print(f"{name} on {device.type}"
          + (f" ({torch.cuda.get_device_name()})" if cuda else " (server and raw model on core 0, one thread)")
          + f"; load: {harness.generator_name()}, {args.connections} connections, {args.seconds:g} s")
    print(f"mmserver:  {result['rps']:8.1f} requests/s, mean batch {mean_batch:.1f} rows")
    print(f"raw model: {raw_rate:8.1f} rows/s at batch {mean_batch:.1f} "
          f"(t_raw = {t_raw * 1e3:.2f} ms per batch, host->device->host included)")
    print(f"efficiency={result['rps'] / raw_rate:.3f}")


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
