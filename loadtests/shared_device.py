"""Two models on one (simulated) GPU: how model A's batching changes model B's service.

    python -m loadtests.shared_device --a-policy timer --a-wait-ms 120 --out build/shared

One ``mmserver serve`` (core 0) serves two models, ``simulated-v100-a`` and
``simulated-v100-b``, each a :class:`mmserver.harness.simulated_device.SimulatedDevice`
naming the same ``stream``: one simulated GPU that runs one call at a time, as
two models on one CUDA stream do. Each model has its own ``mmserver.json``
(its own queue and batching settings). Two locust processes (core 1) offer
open-loop Poisson traffic to each at once, and each model's view is measured
exactly as a ``loadtests.sweep`` point (``run_point``): locust's latencies,
the server's mean batch and queue wait.

What a model's compute time means here: the runner times the whole call, and
on a shared stream that includes waiting for the other model's call to finish.
So the rows carry ``stream_seconds_per_request`` (device time plus waiting for
the stream), not device time alone. What B sees (served, p50, p99, shed) is the
measurement; A's own device time per request is measured alone, in a sweep.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import threading
from pathlib import Path

from mmserver.harness.simulated_device import write_model_folder
from mmserver.harness.testing import ServerProcess

# loadtests.* is imported inside functions: locust reads every module of this folder as a
# locustfile, from wherever it runs, where the package may not be importable.

MODEL_A, MODEL_B = "simulated-v100-a", "simulated-v100-b"
#: loadtests.sweep.SIMULATED_TIME_SCALE (checked by the tests)
TIME_SCALE = 3.0
STREAM = "one-gpu"


@dataclasses.dataclass(frozen=True)
class Batching:
    """One model's batching settings, as its ``mmserver.json`` holds them."""

    policy: str = "greedy"
    max_batch_size: int = 32
    max_wait_ms: float = 0.0
    max_queue_size: int = 64

    def as_json(self) -> dict:
        return dataclasses.asdict(self)


def write_models(root: Path, a: Batching, b: Batching, time_scale: float) -> dict[str, Path]:
    """The two model folders, one simulated stream between them."""
    folders = {}
    for name, batching in ((MODEL_A, a), (MODEL_B, b)):
        folder = write_model_folder(root / name / "model", time_scale=time_scale,
                                    input_features=16, stream=STREAM)
        (folder / "mmserver.json").write_text(json.dumps(batching.as_json()) + "\n")
        folders[name] = folder
    return folders


def _point_args(model: str, duration_s: float, locust_cpus: str) -> argparse.Namespace:
    return argparse.Namespace(model=model, duration=duration_s, min_users=8, max_users=600,
                              users_per_rps=1.0, locust_processes=0, locust_cpus=locust_cpus)


def measure(a: Batching, b: Batching, load_a: float, load_b: float, *, duration_s: float,
            out: Path, time_scale: float = TIME_SCALE, warmup_s: float = 2.0,
            server_cpus: str = "0", locust_cpus: str = "1") -> dict[str, dict]:
    """Offer ``load_a`` and ``load_b`` requests/s at once; {model: its sweep-style row}."""
    from loadtests._payload import payload
    from loadtests.sweep import SIMULATED, run_point, warm_up

    out.mkdir(parents=True, exist_ok=True)
    body, headers = payload(SIMULATED)
    rows: dict[str, dict] = {}
    errors: list[BaseException] = []
    with tempfile.TemporaryDirectory(prefix="mmserver-shared-") as tmp:
        root = Path(tmp)
        folders = write_models(root, a, b, time_scale)
        preload = [arg for name, folder in folders.items() for arg in ("--preload", f"{name}={folder}")]
        server = ServerProcess(["--model-root", str(root), *preload, "--no-access-log",
                                "--log-level", "WARNING"], cpus=server_cpus,
                               log_path=out / "server.log").start()
        try:
            for name in folders:
                warm_up(server, name, body, warmup_s / 2, concurrency=8,
                        content_type=headers["Content-Type"])

            def drive(name: str, load: float) -> None:
                try:
                    row = run_point(_point_args(name, duration_s, locust_cpus), server, root,
                                    load, out / f"{name}-r{load:g}")
                    row.update(model=name, offered_rps=load)
                    rows[name] = row
                except BaseException as error:  # surfaced below, in the caller's thread
                    errors.append(error)

            threads = [threading.Thread(target=drive, args=(name, load))
                       for name, load in ((MODEL_A, load_a), (MODEL_B, load_b))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(duration_s + 300)
        finally:
            server.stop()
    if errors:
        raise errors[0]
    for name, batching in ((MODEL_A, a), (MODEL_B, b)):
        row = rows[name]
        row.update(batching.as_json())
        row["stream_seconds_per_request"] = row.pop("device_seconds_per_request", float("nan"))
        row.pop("device_busy_fraction", None)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.shared_device",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--a-policy", default="greedy")
    p.add_argument("--a-wait-ms", type=float, default=0.0)
    p.add_argument("--a-load", type=float, default=30.0, help="requests/s offered to A")
    p.add_argument("--b-load", type=float, default=250.0, help="requests/s offered to B")
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--out", type=Path, default=Path("build") / "shared")
    args = p.parse_args(argv)
    rows = measure(Batching(args.a_policy, 32, args.a_wait_ms), Batching(), args.a_load,
                   args.b_load, duration_s=args.duration, out=args.out)
    for name, row in rows.items():
        print(f"{name}: {row['policy']} wait {row['max_wait_ms']:g} ms, offered "
              f"{row['offered_rps']:g} -> served {row['achieved_rps']:.0f} requests/s, p50 "
              f"{row['p50_ms']:g} ms, p99 {row['p99_ms']:g} ms, mean batch "
              f"{row['mean_batch_size']:.2f}, shed {row['shed_503']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
