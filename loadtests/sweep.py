"""The batching sweep: policy x MAX_BATCH_SIZE x MAX_WAIT x offered load.

    python -m loadtests.sweep --out results/cpu          # the full grid (~13 min on 2 cores)
    python -m loadtests.sweep --quick --out /tmp/sweep   # CI: a few points, ~1 min
    python -m loadtests.sweep --model simulated-v100 --repeats 3 --out build/sim   # simulated GPU

For each batching setting (policy, max_batch_size, max_wait) the sweep starts
``mmserver serve`` with those flags (pinned with ``taskset`` to
``--server-cpus``, core 0 by default), preloads resnet18 from a model
directory *without* ``mmserver.json`` (so the flags apply; the example's own
file would override them), checks the server reports the settings asked for,
and warms the model up. Then for each offered load it runs locust headless
(pinned to ``--locust-cpus``, core 1; ``--locust-processes N`` uses locust's
own multi-process mode where one core cannot generate the load) with the
open-loop ``OpenLoopUser`` of ``loadtests/steady.py``: Poisson arrivals at
the offered rate spread over ``users = offered rate x --users-per-rps``
users, because N closed-loop users cap every batch at N.

One tidy row per point goes to ``OUT/sweep.csv`` (columns: ``COLUMNS``):
locust's client-side view (achieved throughput, p50/p95/p99 of the 200
answers, failures, 503s shed) beside the server's own view from ``/metrics``
over the same run (deltas of the ``_sum``/``_count`` of the batch-size,
queue-wait and compute histograms, and the batch-size histogram buckets as
JSON). Locust's raw CSVs (``--csv``) and final JSON stats (``--json-file``,
the numbers used here: locust writes its CSVs once a second, so they can miss
the last second) are kept per point under ``OUT/raw/``, with each server's log.

The device's view, per point, in the server's own window: ``mean_batch_size``,
``mean_queue_wait_ms``, ``device_seconds_per_request`` (model-call seconds per
request answered: on a GPU the device's time, on a CPU the core's time in the
model) and ``device_busy_fraction`` (model-call seconds over the window; a call
that straddles the window's start counts whole, so a saturated device can read
a few per cent over 1). ``--repeats N`` runs every point N times, each time on
a fresh server (column ``repeat``).

Resumable: a point already in ``sweep.csv`` is skipped, and so is a server
whose points are all there. Grid rules, so that every point is a distinct
configuration: ``timer`` with ``max_wait = 0``, and ``timer`` with
``max_batch_size = 1``, behave exactly as ``greedy`` and are not run;
``max_batch_size = 1`` runs at the grid's first wait only (a batch of one is
full as soon as it has a request, so the wait never applies); ``greedy`` runs
at the first wait only when the body is decoded on the event loop (under
``decode_in_thread_bytes``, 64 KiB: greedy waits only for bodies being decoded
in a thread, so its wait never applies; ``effective_max_wait_ms`` records 0);
``timer`` runs only at ``Grid.timer_batch_sizes`` (``--timer-batch-sizes``)
when that is set.

``--model`` is the ``resnet18`` example (3x64x64) by default; ``standin`` is
the deep, narrow network of ``loadtests/models.py`` whose batch of 32 costs
little more than a batch of one (the accelerator regime, on a CPU), and
``resnet18-224``/``resnet50-224`` are for a GPU host; ``simulated-v100`` is
``mmserver.harness.simulated_device`` (NVIDIA's published ResNet-50 V100 FP32 t(b),
times ``--time-scale``; labelled simulated, holds no CPU). Each model has its own
default grid (``FULL``/``QUICK``), its loads placed around its capacity.

Nothing here assumes a CPU: the ``device`` column is what the server reports
for the model (``GET /models/{name}``).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import importlib.metadata
import itertools
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mmserver.harness.testing import ServerProcess, histogram, sample_value, taskset_prefix

# loadtests.* is imported inside functions: locust also reads this file as a locustfile,
# on its own, from wherever it runs, where the package may not be importable.

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = REPO_ROOT / "loadtests" / "steady.py"
USER_CLASS = "OpenLoopUser"

COLUMNS = [
    "policy", "max_batch_size", "max_wait_ms", "max_queue_size", "offered_rps", "users",
    "duration_s", "achieved_rps", "sent_rps", "requests", "p50_ms", "p95_ms", "p99_ms",
    "mean_ms", "max_ms", "failures", "shed_503", "server_mean_latency_ms", "mean_batch_size",
    "mean_queue_wait_ms", "mean_compute_ms", "batches", "batch_size_hist", "model", "device",
    "torch_version", "cpu_count", "cpu_model", "server_cpus", "locust_cpus", "locust_processes",
    "started_at", "locust_csv", "repeat", "effective_max_wait_ms", "window_s",
    "device_seconds_per_request", "device_busy_fraction",
]
#: Columns that, with the model, identify a point (for resuming).
KEY = ("policy", "max_batch_size", "max_wait_ms", "offered_rps", "repeat")


@dataclasses.dataclass(frozen=True)
class Grid:
    policies: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    waits_ms: tuple[float, ...]
    loads_rps: tuple[float, ...]
    duration_s: float
    #: the batch sizes ``timer`` runs at (None: all of ``batch_sizes``)
    timer_batch_sizes: tuple[int, ...] | None = None

    def settings(self, greedy_waits: bool = False) -> list[tuple[str, int, float]]:
        """The distinct configurations of the grid. ``greedy_waits``: greedy's MAX_WAIT has an
        effect (bodies decoded in a thread); otherwise greedy runs at the first wait only."""
        out = []
        for policy, size, wait in itertools.product(self.policies, self.batch_sizes, self.waits_ms):
            if policy == "timer" and (wait == 0 or size == 1):
                continue  # identical to greedy: nothing to wait for
            if size == 1 and wait != self.waits_ms[0]:
                continue  # a batch of one is full at once: the wait never applies
            if policy == "greedy" and not greedy_waits and wait != self.waits_ms[0]:
                continue  # greedy only waits for bodies being decoded in a thread: none here
            if (policy == "timer" and self.timer_batch_sizes is not None
                    and size not in self.timer_batch_sizes):
                continue
            out.append((policy, size, wait))
        return out


# Through the server on one core of the 2-core development machine, resnet18 on 3x64x64
# answers ~80-120 requests/s one at a time and ~300-500/s in batches of 8 or more (the
# machine's speed drifts): the loads are easy for every setting (40), past the
# single-request limit (120, 180), comfortable for batching (240) and past MAX_BATCH_SIZE
# 8's knee (420). The shipped defaults (greedy, 16 rows, 5 ms) are in the grid.
FULL = Grid(policies=("greedy", "timer"), batch_sizes=(1, 8, 16, 32), waits_ms=(0, 5, 20),
            loads_rps=(40, 120, 180, 240, 420), duration_s=7, timer_batch_sizes=(16,))
QUICK = Grid(policies=("greedy",), batch_sizes=(1, 16), waits_ms=(5,), loads_rps=(30, 150),
             duration_s=4)
# The stand-in costs ~35 ms a call at batch 1 and a little more at 32: ~30 requests/s one at
# a time, hundreds in batches. Its loads pass MAX_BATCH_SIZE 8's knee (~230/s) and reach
# MAX_BATCH_SIZE 16's (~400/s); the generator's one core limits the rest.
STANDIN_FULL = dataclasses.replace(FULL, loads_rps=(15, 100, 250, 450))
STANDIN_QUICK = dataclasses.replace(QUICK, loads_rps=(15, 200))
#: --model -> (full grid, quick grid)
GRIDS = {"resnet18": (FULL, QUICK), "standin": (STANDIN_FULL, STANDIN_QUICK)}
# A GPU host: loads for one GPU and a many-core load generator (python -m loadtests.accelerator).
GPU_FULL = Grid(policies=("greedy", "timer"), batch_sizes=(1, 8, 16, 32, 64),
                waits_ms=(0, 2, 5), loads_rps=(100, 400, 800, 1600), duration_s=7,
                timer_batch_sizes=(32,))
GRIDS.update({name: (GPU_FULL, QUICK) for name in ("resnet18-224", "resnet50-224")})
# The simulated V100 (mmserver.harness.simulated_device, NVIDIA's FP32 ResNet-50 t(b), times
# SIMULATED_TIME_SCALE): t(1) ~31 ms, capacity ~48 requests/s at MAX_BATCH_SIZE 1 and ~330
# at 16. Notebook 08 places its loads around the capacity it measures first.
SIMULATED = "simulated-v100"
SIMULATED_TIME_SCALE = 3.0
SIMULATED_FULL = Grid(policies=("greedy", "timer"), batch_sizes=(1, 8, 16, 32),
                      waits_ms=(0, 15, 30, 60, 120), loads_rps=(30, 120, 250), duration_s=6,
                      timer_batch_sizes=(32,))
SIMULATED_QUICK = Grid(policies=("greedy", "timer"), batch_sizes=(32,), waits_ms=(0, 60),
                       loads_rps=(30, 150), duration_s=3)
GRIDS[SIMULATED] = (SIMULATED_FULL, SIMULATED_QUICK)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    from loadtests._names import DEFAULT_EXAMPLES_DIR, EXAMPLES_ENV

    p = argparse.ArgumentParser(prog="python -m loadtests.sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the small CI grid (about a minute)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "sweep",
                   help="output folder: sweep.csv, raw/, plots (default build/sweep)")
    p.add_argument("--policies", type=lambda s: tuple(s.split(",")), help="e.g. greedy,timer")
    p.add_argument("--batch-sizes", type=_ints, help="e.g. 1,8,32")
    p.add_argument("--waits-ms", type=_floats, help="e.g. 0,5,20")
    p.add_argument("--loads", type=_floats, help="offered requests/s, e.g. 40,100,160,240")
    p.add_argument("--duration", type=float, help="measured seconds per point")
    p.add_argument("--max-queue-size", type=int, default=64,
                   help="server queue per model (bounds the latency of an overloaded point)")
    p.add_argument("--users-per-rps", type=float, default=1.0,
                   help="open-loop users per offered request/s: the latency (s) a point may "
                        "reach before the generator can no longer keep its rate")
    p.add_argument("--min-users", type=int, default=8)
    p.add_argument("--max-users", type=int, default=600)
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of warm-up per server")
    p.add_argument("--examples-dir", type=Path,
                   default=Path(os.environ.get(EXAMPLES_ENV, DEFAULT_EXAMPLES_DIR)),
                   help="where resnet18/model is (written there if missing)")
    p.add_argument("--model", default="resnet18", choices=tuple(GRIDS),
                   help="resnet18 (the example, 3x64x64), standin (the accelerator stand-in "
                        "of loadtests/models.py) or resnet18-224/resnet50-224 (for a GPU)")
    p.add_argument("--server-cpus", default="0", help="taskset CPU list for the server")
    p.add_argument("--locust-cpus", default="1", help="taskset CPU list for locust")
    p.add_argument("--locust-processes", type=int, default=0,
                   help="locust --processes (0: one process); use with several --locust-cpus")
    p.add_argument("--latency-budget-ms", type=float, default=100.0,
                   help="p99 budget for the recommended setting printed at the end")
    p.add_argument("--no-plots", action="store_true", help="do not write the PNG plots")
    p.add_argument("--timer-batch-sizes", type=_ints,
                   help="the batch sizes timer runs at (default: the grid's, or all)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every point this many times (column repeat), on fresh servers")
    p.add_argument("--time-scale", type=float, default=SIMULATED_TIME_SCALE,
                   help=f"{SIMULATED} only: multiply the published t(b) by this")
    return p


# -- helpers -------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def torch_version() -> str:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def server_view(before, after, model: str) -> dict:
    """The server's own means over a run, from deltas of two scrapes of /metrics."""
    def delta(name, **labels):
        return (sample_value(after, name, model=model, **labels)
                - sample_value(before, name, model=model, **labels))

    def mean(base, scale=1.0):
        count = delta(base + "_count")
        return round(delta(base + "_sum") / count * scale, 3) if count else float("nan")

    buckets_before = histogram(before, "mmserver_batch_size_rows", model=model)[0]
    hist, previous = {}, 0.0
    for bound, cumulative in histogram(after, "mmserver_batch_size_rows", model=model)[0].items():
        cumulative -= buckets_before.get(bound, 0.0)
        hist["+Inf" if math.isinf(bound) else f"{bound:g}"] = int(round(cumulative - previous))
        previous = cumulative
    compute_seconds = delta("mmserver_compute_seconds_sum")
    answered = delta("mmserver_requests_total", status="200")
    return {
        "device_seconds_per_request": round(compute_seconds / answered, 6) if answered else float("nan"),
        "mean_batch_size": mean("mmserver_batch_size_rows"),
        "mean_queue_wait_ms": mean("mmserver_queue_wait_seconds", 1000.0),
        "mean_compute_ms": mean("mmserver_compute_seconds", 1000.0),
        "server_mean_latency_ms": mean("mmserver_request_latency_seconds", 1000.0),
        "batches": int(delta("mmserver_batch_size_rows_count")),
        "batch_size_hist": json.dumps({k: v for k, v in hist.items() if v or k != "+Inf"}),
        "server_requests": delta("mmserver_requests_total", status="200"),
        "server_503": delta("mmserver_requests_total", status="503"),
    }


def percentile(response_times: dict, q: float) -> float:
    """Locust's rounded response-time histogram {ms: count} -> the q-quantile, ms."""
    items = sorted((float(k), int(v)) for k, v in response_times.items())
    total = sum(v for _, v in items)
    if not total:
        return float("nan")
    cumulative = 0
    for ms, count in items:
        cumulative += count
        if cumulative >= q * total:
            return ms
    return items[-1][0]


def client_view(stats: list[dict], model: str) -> dict:
    """Locust's --json-file stats -> throughput, latency of the 200s, failures, shed."""
    from loadtests._names import invoke_name, shed_name

    entries = {e["name"]: e for e in stats}
    ok = entries.get(invoke_name(model), {})
    shed = entries.get(shed_name(model), {})
    failures = sum(int(e.get("num_failures", 0)) for e in stats)
    answered = int(ok.get("num_requests", 0)) - int(ok.get("num_failures", 0))
    starts = [e["start_time"] for e in (ok, shed) if e.get("start_time")]
    ends = [e["last_request_timestamp"] for e in (ok, shed) if e.get("last_request_timestamp")]
    window = (max(ends) - min(starts)) if starts and ends else 0.0
    sent = sum(int(e.get("num_requests", 0)) for e in (ok, shed))
    rt = ok.get("response_times", {})
    n = int(ok.get("num_requests", 0))
    return {
        "requests": answered,
        "achieved_rps": round(answered / window, 2) if window > 0 else 0.0,
        "sent_rps": round(sent / window, 2) if window > 0 else 0.0,
        "p50_ms": percentile(rt, 0.50),
        "p95_ms": percentile(rt, 0.95),
        "p99_ms": percentile(rt, 0.99),
        "mean_ms": round(ok.get("total_response_time", 0.0) / n, 2) if n else float("nan"),
        "max_ms": round(ok.get("max_response_time") or float("nan"), 2),
        "failures": failures,
        "shed_503": int(shed.get("num_requests", 0)),
    }


# -- the server ------------------------------------------------------------------------------


def start_server(args, model_root: Path, policy: str, size: int, wait_ms: float,
                 log_path: Path) -> tuple[ServerProcess, dict]:
    """A server for one batching setting with the model preloaded, and its description
    (``GET /models/{model}``), after checking it runs the setting asked for."""
    server = ServerProcess(
        ["--model-root", str(model_root),
         "--preload", f"{args.model}={model_root / args.model / 'model'}",
         "--max-batch-size", str(size), "--max-wait-ms", f"{wait_ms:g}",
         "--max-queue-size", str(args.max_queue_size), "--policy", policy,
         "--no-access-log", "--log-level", "WARNING"],
        cpus=args.server_cpus, log_path=log_path, cwd=REPO_ROOT).start()
    status, description = server.json("GET", f"/models/{args.model}")
    batching = description.get("batching", {}) if status == 200 else {}
    expected = {"maxBatchSize": size, "maxWaitMs": float(wait_ms), "policy": policy,
                "maxQueueSize": args.max_queue_size}
    if any(batching.get(k) != v for k, v in expected.items()):
        server.stop()
        raise RuntimeError(f"the server runs {batching}, not {expected}: does the model "
                           "directory hold an mmserver.json that overrides the flags?")
    return server, description


def warm_up(server: ServerProcess, model: str, body: bytes, seconds: float,
            concurrency: int, content_type: str = "application/x-npy") -> None:
    """Concurrent requests so the model has run every batch size before we measure."""
    deadline = time.monotonic() + seconds
    headers = {"Content-Type": content_type}

    def client():
        while time.monotonic() < deadline:
            try:
                server.request("POST", f"/models/{model}/invoke", body, headers)
            except OSError:
                time.sleep(0.05)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)


# -- one point ---------------------------------------------------------------------------------


def run_point(args, server: ServerProcess, model_root: Path, load: float, prefix: Path) -> dict:
    users = max(args.min_users, min(args.max_users, math.ceil(load * args.users_per_rps)))
    ramp_s = 1.0  # -r users: all users start within a second
    command = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
               "-u", str(users), "-r", str(users), "-t", f"{args.duration + ramp_s:g}s",
               "--reset-stats", "--only-summary", "--loglevel", "WARNING",
               "--host", server.url, "--csv", str(prefix),
               "--json-file", str(prefix), "--mm-examples-dir", str(model_root),
               "--mm-model", args.model, "--mm-target-rps", f"{load:g}"]
    if args.locust_processes:
        command += ["--processes", str(args.locust_processes)]
    command.append(USER_CLASS)
    pinning = taskset_prefix(args.locust_cpus)
    command, locust_cpus = [*pinning, *command], args.locust_cpus if pinning else ""

    def answered(families) -> float:
        return sample_value(families, "mmserver_request_latency_seconds_count", model=args.model)

    first = server.metrics()
    base_count = answered(first)
    before_at = time.monotonic()
    log_path = prefix.with_name(prefix.name + "_locust.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        try:
            # The server's window starts once traffic flows and the users are all started,
            # as locust's does (--reset-stats), so neither counts the ramp; it ends a second
            # before locust stops sending, so it never counts the tail of abandoned requests.
            before, after = first, None
            deadline = time.monotonic() + 60
            while process.poll() is None and time.monotonic() < deadline:
                if answered(server.metrics()) > base_count:
                    time.sleep(ramp_s + 0.5)
                    before, before_at = server.metrics(), time.monotonic()
                    break
                time.sleep(0.1)
            end = before_at + max(0.5, args.duration - 1.0)
            while process.poll() is None and time.monotonic() < end:
                time.sleep(min(0.05, max(0.0, end - time.monotonic())))
            if process.poll() is None:
                after, after_at = server.metrics(), time.monotonic()
            process.wait(timeout=args.duration + 180)
        except BaseException:
            process.kill()
            process.wait()
            raise
    if after is None:
        after, after_at = server.metrics(), time.monotonic()
    json_path = Path(str(prefix) + ".json")
    if process.returncode not in (0, 1) or not json_path.exists():
        raise RuntimeError(f"locust exited {process.returncode}; see {log_path}:\n"
                           f"{log_path.read_text()[-3000:]}")
    row = {"users": users, "duration_s": args.duration, "locust_cpus": locust_cpus,
           "locust_processes": args.locust_processes}
    row.update(client_view(json.loads(json_path.read_text()), args.model))
    view = server_view(before, after, args.model)
    row.update({k: v for k, v in view.items() if k in COLUMNS})
    # The device's view, all in the server's window: busy = model-call seconds / window.
    window = after_at - before_at
    compute = view["mean_compute_ms"] * view["batches"] / 1000 if view["batches"] else 0.0
    row["window_s"] = round(window, 3)
    row["device_busy_fraction"] = round(compute / window, 4) if window > 0 else float("nan")
    return row


# -- the sweep -------------------------------------------------------------------------------


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def point_key(row: dict) -> tuple:
    return (str(row["model"]), str(row["policy"]), int(float(row["max_batch_size"])),
            float(row["max_wait_ms"]), float(row["offered_rps"]), int(float(row.get("repeat") or 0)))


def effective_wait_ms(policy: str, wait_ms: float, body_bytes: int) -> float:
    """What ``max_wait`` does for this body: greedy waits only for bodies decoded in a thread
    (``decode_in_thread_bytes`` and over); below that its wait never applies."""
    from mmserver.config import DEFAULT_DECODE_IN_THREAD_BYTES

    if policy == "greedy" and body_bytes < DEFAULT_DECODE_IN_THREAD_BYTES:
        return 0.0
    return wait_ms


def prepare_model_root(args, root: Path) -> Path:
    """The model's model.pt in a folder of our own, without the example's mmserver.json."""
    target = root / args.model / "model"
    if args.model == SIMULATED:
        from mmserver.harness.simulated_device import write_model_folder
        write_model_folder(target, time_scale=args.time_scale, input_features=16)
        return root
    if args.model != "resnet18":  # not an example: loadtests.models writes it
        from loadtests.models import write_model
        write_model(args.model, target)
        return root
    source = args.examples_dir / args.model / "model"
    if not (source / "model.pt").exists():
        print(f"writing the {args.model} example to {args.examples_dir} ...", flush=True)
        from mmserver.harness.examples import write_examples
        write_examples(args.examples_dir, names=[args.model])
    target.mkdir(parents=True, exist_ok=True)
    for name in ("model.pt", "metadata.json"):
        if (source / name).exists():
            shutil.copy2(source / name, target / name)
    return root


def _fmt_s(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    full, quick = GRIDS[args.model]
    base = quick if args.quick else full
    grid = Grid(policies=args.policies or base.policies,
                batch_sizes=args.batch_sizes or base.batch_sizes,
                waits_ms=args.waits_ms or base.waits_ms,
                loads_rps=args.loads or base.loads_rps,
                duration_s=args.duration or base.duration_s,
                timer_batch_sizes=args.timer_batch_sizes or (
                    None if args.batch_sizes else base.timer_batch_sizes))
    args.duration = grid.duration_s
    args.examples_dir = args.examples_dir.expanduser().resolve()
    out = args.out.expanduser().resolve()
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    csv_path = out / "sweep.csv"
    rows = read_rows(csv_path)
    done = {point_key(r) for r in rows}

    from loadtests._payload import payload
    body, headers = payload(args.model)
    inline = effective_wait_ms("greedy", 1.0, len(body)) == 0.0
    settings = grid.settings(greedy_waits=not inline)
    # Repeats outermost, each on a fresh server: a repeat meets the machine at another moment.
    points = [(repeat, s, load) for repeat in range(args.repeats) for s in settings
              for load in grid.loads_rps]
    todo = [(repeat, s, load) for repeat, s, load in points
            if (args.model, *s, float(load), repeat) not in done]
    print(f"sweep: {len(points)} points ({len(settings)} settings x {len(grid.loads_rps)} loads "
          f"x {args.repeats} repeats, {grid.duration_s:g} s each); "
          f"{len(points) - len(todo)} already in {csv_path}", flush=True)
    if inline and "greedy" in grid.policies and len(grid.waits_ms) > 1:
        print(f"greedy runs at MAX_WAIT {grid.waits_ms[0]:g} ms only: a {len(body)}-byte body is "
              "decoded on the event loop, so greedy never waits for it", flush=True)
    if not todo:
        return finish(args, csv_path, out)

    common = {"model": args.model, "max_queue_size": args.max_queue_size,
              "torch_version": torch_version(), "cpu_count": os.cpu_count(),
              "cpu_model": cpu_model()}
    started, finished = time.monotonic(), 0
    with tempfile.TemporaryDirectory(prefix="mmserver-sweep-") as tmp:
        model_root = prepare_model_root(args, Path(tmp))
        for (repeat, setting), group in itertools.groupby(todo, key=lambda p: p[:2]):
            policy, size, wait = setting
            tag = f"{policy}-b{size}-w{wait:g}" + (f"-n{repeat}" if repeat else "")
            server, description = start_server(args, model_root, policy, size, wait,
                                               raw / f"{tag}_server.log")
            try:
                warm_up(server, args.model, body, args.warmup,
                        concurrency=max(4, min(64, 2 * size)),
                        content_type=headers["Content-Type"])
                for _, _, load in group:
                    prefix = raw / f"{tag}-r{load:g}"
                    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
                    row = {**common, "policy": policy, "max_batch_size": size,
                           "max_wait_ms": wait, "offered_rps": load, "started_at": stamp,
                           "repeat": repeat,
                           "effective_max_wait_ms": effective_wait_ms(policy, wait, len(body)),
                           "device": description.get("device", ""),
                           "server_cpus": server.cpus,
                           "locust_csv": str(prefix.relative_to(out))}
                    row.update(run_point(args, server, model_root, load, prefix))
                    append_row(csv_path, row)
                    finished += 1
                    elapsed = time.monotonic() - started
                    left = elapsed / finished * (len(todo) - finished)
                    position = len(points) - len(todo) + finished
                    print(f"[{position:>3}/{len(points)}] {policy:<6} batch<={size:<3} "
                          f"wait={wait:>4g}ms {load:>5g} rps offered ({row['users']} users) -> "
                          f"{row['achieved_rps']:>6.1f} rps  p50 {row['p50_ms']:>5g} ms  "
                          f"p99 {row['p99_ms']:>5g} ms  batch {row['mean_batch_size']:>5} "
                          f"device {row['device_busy_fraction']:.0%} busy "
                          f"shed {row['shed_503']} fail {row['failures']} | "
                          f"{_fmt_s(elapsed)} elapsed, ~{_fmt_s(left)} left", flush=True)
            finally:
                server.stop()
    return finish(args, csv_path, out)


def append_row(path: Path, row: dict) -> None:
    new = not path.exists() or path.stat().st_size == 0
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow({k: row.get(k, "") for k in COLUMNS})


def finish(args, csv_path: Path, out: Path) -> int:
    from loadtests.plots import load_rows, recommend

    rows = load_rows(csv_path)
    best = max(rows, key=lambda r: r["achieved_rps"], default=None)
    if best:
        print(f"best throughput: {best['achieved_rps']:.1f} rps at {describe(best)} "
              f"(p99 {best['p99_ms']:g} ms, mean batch {best['mean_batch_size']:.2f})")
    pick = recommend(rows, args.latency_budget_ms)
    if pick:
        print(f"recommended for p99 <= {args.latency_budget_ms:g} ms: {describe(pick)} -> "
              f"{pick['achieved_rps']:.1f} rps, p99 {pick['p99_ms']:g} ms, "
              f"mean batch {pick['mean_batch_size']:.2f}")
    else:
        print(f"no point met p99 <= {args.latency_budget_ms:g} ms without shedding")
    if not args.no_plots:
        from loadtests.plots import save_figures
        for path in save_figures(csv_path, out):
            print(f"wrote {path}")
    return 0


def describe(row: dict) -> str:
    return (f"policy={row['policy']} max_batch_size={row['max_batch_size']} "
            f"max_wait_ms={row['max_wait_ms']:g} offered {row['offered_rps']:g} rps")


if __name__ == "__main__":
    sys.exit(main())
