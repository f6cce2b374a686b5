"""Instances: what a second instance of a model buys, and what it costs in memory, in one run.

Three measurements, each a ratio taken in the same run (no timed asserts anywhere):

1. **A model whose calls hold no CPU** (the simulated device of
   ``mmserver.harness.simulated_device``, ``stream="per_thread"``, so each instance has a
   stream of its own, as each instance has a
   CUDA stream on a GPU): one mmserver serves the same folder twice, as ``sim1`` (1 instance)
   and ``sim2`` (2 instances); 64 closed-loop users take turns on each in interleaved rounds
   (each instance needs a full batch in flight and one forming to be kept busy).
   Printed: requests/s of each and the median over rounds of sim2 / sim1.
2. **The small CNN on the CPU** (``harness.SmallCNN``, 3x32x32 ``.npy`` rows, 16-row batches):
   1 instance with 2 torch threads against 2 instances with 1 thread each, two mmservers on
   both cores (the load generator shares them; both servers see the same load), interleaved.
3. **Memory**: the resident memory a 64 MiB TorchScript model adds to the process with 1 and
   with 2 instances (weights are shared, so the two should be within a few per cent).

Usage: python bench/instances.py [--seconds 5] [--rounds 3]; ``MMSERVER_QUICK=1`` shrinks both.
The figures go to stdout; the README's benchmark section quotes a run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from mmserver.harness.simulated_device import LinearBatchTime, write_model_folder  # noqa: E402
from mmserver.harness.testing import ServerProcess  # noqa: E402

QUICK = os.environ.get("MMSERVER_QUICK") == "1"
USERS = 32
#: Closed-loop users for the simulated device: each instance needs a full batch in flight and
#: one forming, so 2 instances x 16 rows need at least 3 x 16 users to be fed.
SIM_USERS = 64
#: The simulated call: 20 ms fixed + 0.1 ms a row, holding no CPU: slow enough that the device,
#: not the server's own CPU cost (about 0.3 ms a request here), is what one instance is limited by.
SIM_FIXED_SECONDS = 0.020
SIM_PER_ROW_SECONDS = 0.0001
SIM_FEATURES = 16
CNN_MAX_BATCH_SIZE = 16
WIDE_FEATURES = 4096  # a 4096x4096 float32 linear layer: 64 MiB of weights


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array.astype(np.float32), allow_pickle=False)
    return buffer.getvalue()


def server(root: Path, preload: dict[str, Path], env: dict[str, str], cpus: str | None,
           *extra: str) -> ServerProcess:
    args = ["--model-root", str(root), "--no-access-log", "--log-level", "WARNING", *extra]
    for name, path in preload.items():
        args += ["--preload", f"{name}={path}"]
    return ServerProcess(args, env=env, cpus=cpus, cwd=harness.REPO)


def rounds_of(targets: dict[str, tuple[str, bytes]], rounds: int, seconds: float,
              users: int = USERS) -> dict:
    """Interleaved windows over ``targets`` (name -> (url, body)); req/s per round per name."""
    rps: dict[str, list[float]] = {name: [] for name in targets}
    names = list(targets)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            url, body = targets[name]
            result = harness.closed_loop(url, body, "application/x-npy", connections=users,
                                         seconds=seconds)
            if result["non_2xx"]:
                raise RuntimeError(f"{name}: {result['non_2xx']} answers were not 2xx")
            rps[name].append(result["rps"])
    return rps


def report(title: str, rps: dict[str, list[float]], ours: str, base: str) -> float:
    print(f"\n{title}")
    for name, values in rps.items():
        print(f"  {name:28s} " + " / ".join(f"{v:7.0f}" for v in values) + " req/s")
    ratios = [a / b for a, b in zip(rps[ours], rps[base])]
    ratio = statistics.median(ratios)
    print(f"  {ours} / {base}: {ratio:.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})")
    return ratio


def simulated_device(root: Path, rounds: int, seconds: float) -> float:
    folder = write_model_folder(root / "sim", fixed_seconds=SIM_FIXED_SECONDS,
                                per_row_seconds=SIM_PER_ROW_SECONDS,
                                input_features=SIM_FEATURES, stream="per_thread")
    for instances in (1, 2):
        copy = shutil.copytree(folder, root / f"sim{instances}")
        (copy / "mmserver.json").write_text(json.dumps({"instances": instances,
                                                        "thread_safe": True}))
    body = npy(np.ones((1, SIM_FEATURES)))
    t = LinearBatchTime(SIM_FIXED_SECONDS, SIM_PER_ROW_SECONDS)
    with server(root, {"sim1": root / "sim1", "sim2": root / "sim2"}, harness.ONE_THREAD,
                harness.SERVER_CPU) as s:
        targets = {f"sim{n}": (f"{s.url}/models/sim{n}/invoke", body) for n in (1, 2)}
        rounds_of(targets, 1, min(1.0, seconds), SIM_USERS)  # warm-up
        rps = rounds_of(targets, rounds, seconds, SIM_USERS)
        batches = {name: s.json("GET", f"/models/{name}")[1]["stats"]["meanBatchSize"]
                   for name in targets}
    return report(f"1. simulated device, t(b) = {t.description}, no CPU held, {SIM_USERS} users "
                  f"(mean batch: sim1 {batches['sim1']:.1f}, sim2 {batches['sim2']:.1f} rows)",
                  rps, "sim2", "sim1")


def small_cnn(root: Path, rounds: int, seconds: float) -> float:
    harness.save_torchscript(harness.SmallCNN(), torch.randn(1, 3, 32, 32), root / "cnn")
    body = npy(np.random.default_rng(0).standard_normal((1, 3, 32, 32)))
    two_threads = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    with server(root, {"cnn": root / "cnn"}, two_threads, None,
                "--max-batch-size", str(CNN_MAX_BATCH_SIZE)) as one, \
            server(root, {"cnn": root / "cnn"}, harness.ONE_THREAD, None,
                   "--max-batch-size", str(CNN_MAX_BATCH_SIZE), "--instances", "2") as two:
        targets = {"1 instance x 2 threads": (f"{one.url}/models/cnn/invoke", body),
                   "2 instances x 1 thread": (f"{two.url}/models/cnn/invoke", body)}
        rounds_of(targets, 1, min(1.0, seconds))
        rps = rounds_of(targets, rounds, seconds)
    return report(f"2. small CNN on the CPU, both cores, {USERS} users, max batch "
                  f"{CNN_MAX_BATCH_SIZE}", rps, "2 instances x 1 thread", "1 instance x 2 threads")


def memory(root: Path) -> tuple[int, int]:
    wide = torch.nn.Linear(WIDE_FEATURES, WIDE_FEATURES)
    growth = {}
    for instances in (1, 2):
        folder = harness.save_torchscript(wide, torch.ones(1, WIDE_FEATURES),
                                          root / f"wide{instances}")
        (folder / "mmserver.json").write_text(json.dumps({"instances": instances}))
    with server(root, {}, harness.ONE_THREAD, None) as s:
        process = psutil.Process(s.process.pid)
        for instances in (1, 2):
            before = process.memory_info().rss
            assert s.load(f"wide{instances}", root / f"wide{instances}")[0] == 200
            for _ in range(4):
                assert s.invoke(f"wide{instances}", [[0.0] * WIDE_FEATURES])[0] == 200
            growth[instances] = process.memory_info().rss - before
    print(f"\n3. resident memory a {WIDE_FEATURES}x{WIDE_FEATURES} float32 model adds: "
          f"1 instance {growth[1] / 2**20:.1f} MiB, 2 instances {growth[2] / 2**20:.1f} MiB "
          f"(ratio {growth[2] / growth[1]:.2f})")
    return growth[1], growth[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1 if QUICK else 5)
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 3)
    args = parser.parse_args()
    print(f"load generator: {harness.generator_name()}; {args.rounds} rounds of "
          f"{args.seconds:g} s per server")
    with tempfile.TemporaryDirectory(prefix="instances-") as tmp:
        root = Path(tmp)
        simulated_device(root, args.rounds, args.seconds)
        small_cnn(root, args.rounds, args.seconds)
        memory(root)


if __name__ == "__main__":
    main()
