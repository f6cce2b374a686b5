"""What the HTTP benchmarks share: models on disk, pinned server processes, a load generator.

The machine has 2 cores, so the server under test is pinned to core 0 and the
load generator to core 1 (``taskset``) with one intra-op torch thread: each
side gets a whole core and neither steals from the other. The generator is
``wrk`` when it is installed (a C program, far lighter than any Python
client) and otherwise a closed loop of aiohttp clients in a process of its own
on the load core, which can itself become the bottleneck; the benchmarks print
which one ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

from mmserver.harness.testing import (
    LOG_TAIL_CHARS,
    ServerProcess,
    sample_value,
    scrape_metrics,
    taskset_prefix,
)

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # loadtests/ is a folder, not a package

from loadtests.lesson_servers import SmallCNN  # noqa: E402,F401 - the lessons' small CNN, benchmarked too

SERVER_CPU = "0"
LOAD_CPU = "1"
REPO = Path(__file__).resolve().parents[1]
#: One intra-op thread, so the server's core is all it uses.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class NoOp(torch.nn.Module):
    """Returns its input: the model costs nothing, so all that is left is the server."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def save_torchscript(module: torch.nn.Module, example: torch.Tensor, model_dir: Path) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.trace(module.eval(), example).save(str(model_dir / "model.pt"))
    return model_dir


def median_call_seconds(model, x: torch.Tensor, repeats: int = 30, warmup: int = 3) -> float:
    """Median wall time of ``model(x)`` under inference mode, after a few warm-up calls."""
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


@contextlib.contextmanager
def serving(server: ServerProcess) -> Iterator[ServerProcess]:
    """Start ``server``, stop it afterwards; if the benchmark fails, its log tail on stderr."""
    with server:
        try:
            yield server
        except BaseException:
            sys.stderr.write(server.log()[-LOG_TAIL_CHARS:])
            raise


@contextlib.contextmanager
def mmserver(model_root: Path, preload: dict[str, Path], *extra: str) -> Iterator[str]:
    """An mmserver process pinned to the server core, one torch thread; yields its base url."""
    args = ["--model-root", str(model_root), "--no-access-log", "--log-level", "WARNING", *extra]
    for name, path in preload.items():
        args += ["--preload", f"{name}={path}"]
    with serving(ServerProcess(args, env=ONE_THREAD, cpus=SERVER_CPU, cwd=REPO)) as server:
        yield server.url


def generator_name() -> str:
    return "wrk" if shutil.which("wrk") else "aiohttp closed loop"


def closed_loop(url: str, body: bytes, content_type: str, *, connections: int,
                seconds: float, headers: dict[str, str] | None = None) -> dict[str, float]:
    """Saturate ``url`` with ``connections`` clients: requests/s, p50/p99 ms, non-2xx count."""
    return latency_window(url, body, {"Content-Type": content_type, **(headers or {})},
                          connections, seconds)


def latency_window(url: str, body: bytes, headers: dict[str, str], users: int,
                   seconds: float) -> dict[str, float]:
    """One closed-loop window of ``users`` clients POSTing ``body`` with ``headers``.

    Returns ``rps``, ``p50_ms``, ``p99_ms`` and ``non_2xx``; the aiohttp loop adds
    ``requests`` and ``cpu_seconds``, its own CPU over the window (its start-up, which
    imports torch, left out). Either generator runs as a
    process of its own on the load core: wrk when installed, else this file's aiohttp
    loop. A process, not a thread of the caller, so that the clients neither share the
    caller's interpreter lock nor need its event loop: a notebook's kernel runs one
    already, where ``asyncio.run`` would refuse.
    """
    if shutil.which("wrk"):
        return _wrk(url, body, headers, users, seconds)
    return _aiohttp(url, body, headers, users, seconds)


_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()
    return float(value) * _UNITS[unit]


def _wrk(url, body, headers, users, seconds) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "body"
        body_file.write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text('wrk.method = "POST"\n'
                          + "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
                          + f'local f = io.open("{body_file}", "rb")\n'
                          'wrk.body = f:read("*all")\nf:close()\n')
        out = subprocess.run(
            [*taskset_prefix(LOAD_CPU), "wrk", "-t1", f"-c{users}",
             f"-d{max(1, round(seconds))}s", "--timeout", "10s", "--latency", "-s", str(script),
             url], capture_output=True, text=True, check=True).stdout
    percentile = dict(re.findall(r"^\s*(50|99)(?:\.0+)?%\s+([\d.]+(?:us|ms|s|m))", out, re.M))
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50_ms": _ms(percentile["50"]) if "50" in percentile else float("nan"),
            "p99_ms": _ms(percentile["99"]) if "99" in percentile else float("nan"),
            "non_2xx": int(non_2xx.group(1)) if non_2xx else 0}


def _aiohttp(url, body, headers, users, seconds) -> dict[str, float]:
    return _generator({"url": url, "headers": headers, "users": users, "seconds": seconds}, body)


def open_loop(url: str, body: bytes, headers: dict[str, str], rate_per_second: float,
              seconds: float) -> dict[str, float]:
    """One open-loop window: ``body`` POSTed at Poisson arrivals of ``rate_per_second`` for
    ``seconds``, each request sent when it is due whether or not earlier ones were answered
    (the same seeded arrivals every call, so two servers meet the same load). Returns
    ``rps`` (answers over the window until the last answer), ``p50_ms``, ``p99_ms`` and
    ``non_2xx``. An aiohttp process of its own on the load core, as :func:`latency_window`'s."""
    return _generator({"url": url, "headers": headers, "rate": rate_per_second,
                       "seconds": seconds}, body)


def _generator(window: dict, body: bytes) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "body"
        body_file.write_bytes(body)
        window = {**window, "body_file": str(body_file)}
        seconds = window["seconds"]
        out = subprocess.run(
            [*taskset_prefix(LOAD_CPU), sys.executable, __file__, json.dumps(window)],
            capture_output=True, text=True, check=True, timeout=seconds + GENERATOR_GRACE_SECONDS)
    return json.loads(out.stdout.splitlines()[-1])


#: How long the aiohttp generator's process may take beyond its window: its start-up (this
#: file imports torch) and the last requests' answers.
GENERATOR_GRACE_SECONDS = 60


#: The seed of :func:`open_loop`'s arrivals.
OPEN_LOOP_SEED = 7


async def _open_loop_window(url, body, headers, rate, seconds) -> dict[str, float]:
    import aiohttp

    latencies, non_2xx, running = [], 0, set()
    arrivals = random.Random(OPEN_LOOP_SEED)

    async def request(session):
        nonlocal non_2xx
        started = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
        latencies.append(time.perf_counter() - started)
        non_2xx += response.status >= 300

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        began = due = time.perf_counter()
        while (due := due + arrivals.expovariate(rate)) < began + seconds:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            task = asyncio.create_task(request(session))
            running.add(task)
            task.add_done_callback(running.discard)
        await asyncio.gather(*running)
        wall = time.perf_counter() - began
    return _summary(latencies, wall, non_2xx)


def _summary(latencies: list[float], wall_s: float, non_2xx: int) -> dict[str, float]:
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else latencies * 99
    return {"rps": len(latencies) / wall_s, "p50_ms": q[49] * 1e3, "p99_ms": q[98] * 1e3,
            "non_2xx": non_2xx, "requests": len(latencies)}


async def _aiohttp_window(url, body, headers, users, seconds) -> dict[str, float]:
    import aiohttp

    latencies, non_2xx = [], 0
    deadline = time.perf_counter() + seconds

    async def user(session):
        nonlocal non_2xx
        while (started := time.perf_counter()) < deadline:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
            latencies.append(time.perf_counter() - started)
            non_2xx += response.status >= 300

    began, cpu_began = time.perf_counter(), time.process_time()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=users)) as session:
        await asyncio.gather(*(user(session) for _ in range(users)))
    return {**_summary(latencies, time.perf_counter() - began, non_2xx),
            "cpu_seconds": time.process_time() - cpu_began}


def saturate_model(base: str, name: str, body: bytes, content_type: str, *, connections: int,
                   seconds: float, warmup_seconds: float) -> tuple[dict[str, float], float]:
    """Warm up, then saturate one model of a running mmserver.

    Returns the load generator's result and the mean rows per batch the server formed
    in the measured window (from /metrics, read before and after).
    """
    url = f"{base}/models/{name}/invoke"
    closed_loop(url, body, content_type, connections=connections, seconds=warmup_seconds)
    before = scrape_metrics(base)
    result = closed_loop(url, body, content_type, connections=connections, seconds=seconds)
    after = scrape_metrics(base)

    def delta(sample_name: str) -> float:
        return sample_value(after, sample_name, model=name) - sample_value(before, sample_name,
                                                                           model=name)

    batches = delta("mmserver_batch_size_rows_count")
    return result, delta("mmserver_batch_size_rows_sum") / batches if batches else 0.0


if __name__ == "__main__":  # one window of the aiohttp generator, as _aiohttp runs it
    import uvloop

    spec = json.loads(sys.argv[1])
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        body = Path(spec["body_file"]).read_bytes()
        result = runner.run(
            _open_loop_window(spec["url"], body, spec["headers"], spec["rate"], spec["seconds"])
            if "rate" in spec else
            _aiohttp_window(spec["url"], body, spec["headers"], spec["users"], spec["seconds"]))
    print(json.dumps(result))
