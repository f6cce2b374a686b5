"""Everything notebook 08 measures on a CUDA machine, in one command; writes ``results/cuda/``.

    python -m loadtests.accelerator                 # on a GPU host: ~10 min, steps 1, 2 and 3
    python -m loadtests.accelerator --sweep         # and step 4, the full sweep: ~30-40 min more
    python -m loadtests.accelerator --quick         # a smoke test (~3 min): fewer sizes, short runs
    python -m loadtests.accelerator --allow-cpu --quick --out build/accel   # the script itself, on a CPU

1. **In-process**, for resnet18 and resnet50 at 224x224 (random weights, fp32), every batch
   size: the model alone on a batch already on the device (``compute_ms``), and the same call
   fed from host memory the way a server feeds it, with the copy from *pinned* (page-locked)
   memory, ``non_blocking``, (``pinned_ms``) and from ordinary pageable memory
   (``pageable_ms``), the answer copied back in both. -> ``inprocess.csv``
2. **Through mmserver**: ``bench/accelerator_efficiency.py`` for each model (mmserver's
   throughput / the raw model's at the batch sizes the server formed). -> ``efficiency.txt``
3. **HTTP workers**: ``bench/device_efficiency.py --http-workers 1,2,4,8`` (the simulated device
   of that script, so the GPU is not used: the host's cores are what is measured), one process
   against 1, 2, 4 and 8 HTTP workers over one engine, with each side's CPU per request: the
   inputs of docs/design.md section 12's scaling model. -> ``workers.txt``
4. **The sweep**, with ``--sweep`` only (``python -m loadtests.sweep --model resnet50-224`` and ``resnet18-224``, the
   GPU grid of ``loadtests.sweep.GPU_FULL``), the server on a few cores and locust on the rest
   in multi-process mode. -> ``resnet50-224/`` and ``resnet18-224/`` (``sweep.csv`` and plots)

Nothing is overwritten that is already there: the sweeps resume, and the other steps are
skipped if their file exists (``--force`` redoes them).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from loadtests.models import build, row_shape

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS = ("resnet18-224", "resnet50-224")
BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
QUICK_BATCH_SIZES = (1, 8, 32)
COLUMNS = ["model", "device", "device_name", "batch_size", "compute_ms", "pinned_ms",
           "pageable_ms", "compute_items_per_s", "pinned_items_per_s", "torch_version"]


def _median_ms(call, repeats: int, sync) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        sync()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def measure_inprocess(name: str, device: torch.device, batch_sizes, repeats: int) -> list[dict]:
    model = build(name).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    with torch.inference_mode():
        for b in batch_sizes:
            host = torch.randn(b, *row_shape(name)[1:])
            pinned = host.pin_memory() if device.type == "cuda" else host
            on_device = host.to(device)

            def compute(on_device=on_device):
                model(on_device)

            def from_pinned(pinned=pinned):
                model(pinned.to(device, non_blocking=True)).to("cpu")

            def from_pageable(host=host):
                model(host.to(device)).to("cpu")

            for call in (compute, from_pinned, from_pageable):  # warm-up: cuDNN picks algorithms
                for _ in range(3):
                    call()
            sync()
            row = {"model": name, "device": device.type,
                   "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                                   else "cpu"),
                   "batch_size": b, "torch_version": torch.__version__,
                   "compute_ms": round(_median_ms(compute, repeats, sync), 3),
                   "pinned_ms": round(_median_ms(from_pinned, repeats, sync), 3),
                   "pageable_ms": round(_median_ms(from_pageable, repeats, sync), 3)}
            row["compute_items_per_s"] = round(b / row["compute_ms"] * 1e3, 1)
            row["pinned_items_per_s"] = round(b / row["pinned_ms"] * 1e3, 1)
            rows.append(row)
            print(f"{name:<13} batch {b:>4}: compute {row['compute_ms']:8.2f} ms, from pinned "
                  f"{row['pinned_ms']:8.2f} ms, from pageable {row['pageable_ms']:8.2f} ms "
                  f"({row['pinned_items_per_s']:.0f} items/s)", flush=True)
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def _bench(into: Path, script: str, *arguments: str) -> bool:
    """Run ``bench/<script> arguments``, appending each line it prints to ``into`` (and echoing
    it) as it comes, so a run stopped part-way keeps what it measured. False if it failed (its
    error output echoed)."""
    command = [sys.executable, str(REPO_ROOT / "bench" / script), *arguments]
    with open(into, "a") as out:
        out.write(f"$ python bench/{script} {' '.join(arguments)} ({os.cpu_count()} CPUs)\n")
        with subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as process:
            for line in process.stdout:
                print(line, end="", flush=True)
                out.write(line)
                out.flush()
            errors = process.stderr.read()
    if process.returncode:
        print(errors[-3000:], file=sys.stderr)
    return process.returncode == 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.accelerator",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "cuda")
    p.add_argument("--quick", action="store_true", help="few batch sizes, short runs, no full sweep")
    p.add_argument("--allow-cpu", action="store_true", help="run without CUDA (to try the script)")
    p.add_argument("--sweep", action="store_true", help="also run the full sweep (step 4)")
    p.add_argument("--force", action="store_true", help="redo steps whose files exist")
    args = p.parse_args(argv)

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("no CUDA device: nothing measured (use --allow-cpu to try the script on a CPU)")
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    quick = args.quick or device.type == "cpu"
    sizes = QUICK_BATCH_SIZES if quick else BATCH_SIZES
    if device.type == "cpu":  # a try of the script: 224x224 resnets are slow on a CPU core
        sizes = (1, 2)

    inprocess = out / "inprocess.csv"
    if args.force or not inprocess.exists():
        rows = []
        for name in MODELS:
            rows += measure_inprocess(name, device, sizes,
                                      repeats=2 if device.type == "cpu" else 5 if quick else 30)
        write_csv(inprocess, rows)
        print(f"wrote {inprocess.relative_to(out.parent)}")

    efficiency = out / "efficiency.txt"
    if args.force or not efficiency.exists():
        efficiency.unlink(missing_ok=True)
        for name in (MODELS if device.type == "cuda" else ("resnet18",)):
            if not _bench(efficiency, "accelerator_efficiency.py", "--model", name,
                          "--seconds", "3" if quick else "10"):
                return 1

    workers = out / "workers.txt"
    if args.force or not workers.exists():
        workers.unlink(missing_ok=True)
        if not _bench(workers, "device_efficiency.py", "--http-workers",
                      "1,2" if device.type == "cpu" else "1,2,4,8",
                      "--seconds", "2" if quick else "4"):
            return 1

    if not args.sweep:
        return 0
    cpus = os.cpu_count() or 2
    server_cpus = "0-3" if cpus >= 8 else "0"
    locust_cpus = f"4-{cpus - 1}" if cpus >= 8 else ("1" if cpus > 1 else "")
    processes = max(0, min(8, cpus - 4)) if cpus >= 8 else 0
    for name in ("resnet50-224", "resnet18-224"):
        command = [sys.executable, "-m", "loadtests.sweep", "--model", name,
                   "--out", str(out / name), "--server-cpus", server_cpus,
                   "--locust-cpus", locust_cpus, "--max-queue-size", "256"]
        if processes:
            command += ["--locust-processes", str(processes)]
        if quick:
            command += ["--quick"]
        print("$ " + " ".join(command[1:]), flush=True)
        result = subprocess.run(command, cwd=REPO_ROOT, check=False)
        if result.returncode:
            return result.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
