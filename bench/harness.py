"""What the HTTP benchmarks share: models on disk, pinned server processes, a load generator.

The machine has 2 cores, so the server under test is pinned to core 0 and the
load generator to core 1 (``taskset``) with one intra-op torch thread: each
side gets a whole core and neither steals from the other. The generator is
``wrk`` when it is installed (a C program, far lighter than any Python
client) and otherwise a closed loop of aiohttp clients, which can itself
become the bottleneck; the benchmarks print which one ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch

SERVER_CPU = "0"
LOAD_CPU = "1"
REPO = Path(__file__).resolve().parents[1]


class NoOp(torch.nn.Module):
    """Returns its input: the model costs nothing, so all that is left is the server."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class SmallCNN(torch.nn.Module):
    """Three conv layers (32-64-64 channels) on 3x32x32 inputs, 10 classes."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


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


def pinned(cpu: str) -> list[str]:
    return ["taskset", "-c", cpu] if shutil.which("taskset") and os.cpu_count() > 1 else []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


@contextlib.contextmanager
def process(command: list[str], ready_url: str) -> Iterator[subprocess.Popen]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        wait_for(ready_url)
        yield proc
    except BaseException:
        log.seek(0)
        sys.stderr.write(log.read().decode(errors="replace")[-4000:])
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.contextmanager
def mmserver(model_root: Path, preload: dict[str, Path], *extra: str) -> Iterator[str]:
    """An mmserver process pinned to the server core; yields its base url."""
    port = free_port()
    command = [*pinned(SERVER_CPU), sys.executable, "-m", "mmserver", "serve", "--port",
               str(port), "--model-root", str(model_root), "--no-access-log",
               "--log-level", "WARNING", *extra]
    for name, path in preload.items():
        command += ["--preload", f"{name}={path}"]
    base = f"http://127.0.0.1:{port}"
    with process(command, base + "/ping"):
        yield base


def generator_name() -> str:
    return "wrk" if shutil.which("wrk") else "aiohttp closed loop"


def closed_loop(url: str, body: bytes, content_type: str, *, connections: int,
                seconds: float) -> dict[str, float]:
    """Saturate ``url`` with ``connections`` clients; requests/s and non-2xx count."""
    if shutil.which("wrk"):
        return _wrk(url, body, content_type, connections, seconds)
    return asyncio.run(_aiohttp_loop(url, body, content_type, connections, seconds))


def _wrk(url, body, content_type, connections, seconds) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        body_file = Path(tmp) / "body"
        body_file.write_bytes(body)
        script = Path(tmp) / "post.lua"
        script.write_text(
            'wrk.method = "POST"\n'
            f'wrk.headers["Content-Type"] = "{content_type}"\n'
            f'local f = io.open("{body_file}", "rb")\nwrk.body = f:read("*all")\nf:close()\n')
        result = subprocess.run(
            [*pinned(LOAD_CPU), "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
             "--latency", "-s", str(script), url],
            capture_output=True, text=True, check=True)
    out = result.stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors:.*", out)
    return {"rps": rps, "non_2xx": int(non_2xx.group(1)) if non_2xx else 0,
            "socket_errors": errors.group(0) if errors else ""}


async def _aiohttp_loop(url, body, content_type, connections, seconds) -> dict[str, float]:
    import aiohttp

    done = non_2xx = 0
    deadline = time.perf_counter() + seconds

    async def client(session):
        nonlocal done, non_2xx
        while time.perf_counter() < deadline:
            async with session.post(url, data=body,
                                    headers={"Content-Type": content_type}) as response:
                await response.read()
                done += 1
                non_2xx += response.status >= 300

    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(connections)))
    return {"rps": done / (time.perf_counter() - started), "non_2xx": non_2xx,
            "socket_errors": ""}


def saturate_model(base: str, name: str, body: bytes, content_type: str, *, connections: int,
                   seconds: float, warmup_seconds: float) -> tuple[dict[str, float], float]:
    """Warm up, then saturate one model of a running mmserver.

    Returns the load generator's result and the mean rows per batch the server formed
    in the measured window (from /metrics, read before and after).
    """
    url = f"{base}/models/{name}/invoke"
    closed_loop(url, body, content_type, connections=connections, seconds=warmup_seconds)
    before = scrape_histogram(base, "mmserver_batch_size_rows", name)
    result = closed_loop(url, body, content_type, connections=connections, seconds=seconds)
    after = scrape_histogram(base, "mmserver_batch_size_rows", name)
    batches = after[1] - before[1]
    return result, (after[0] - before[0]) / batches if batches else 0.0


def scrape_histogram(base: str, metric: str, model: str) -> tuple[float, float]:
    """(sum, count) of one model's histogram from /metrics; subtract two to get a window."""
    with urllib.request.urlopen(base + "/metrics") as response:
        text = response.read().decode()
    values = []
    for suffix in ("_sum", "_count"):
        match = re.search(rf'^{metric}{suffix}{{model="{model}"}} ([\d.e+-]+)$', text, re.M)
        values.append(float(match.group(1)) if match else 0.0)
    return values[0], values[1]
