"""Run a real mmserver in a subprocess, talk to it, and read its /metrics.

The tests, the load-test sweep, the benchmarks and the notebooks all start
``python -m mmserver serve`` on a free port, wait for ``/ping``, send a few
requests and read Prometheus counters. This module is that harness, written
once. It lives in the package (as ``aiohttp.test_utils`` lives in aiohttp)
so that every one of them imports the same code, notebooks included, without
putting ``tests/`` or ``bench/`` on ``sys.path``.

It needs only the standard library and ``prometheus_client`` (a dependency of
the server): no pytest, no locust, no gevent, so the sweep can import it
without pulling in locust's monkey-patching.

    with ServerProcess(["--model-root", "build/examples"]) as server:   # or RunningServer(url)
        server.load("tabular", "tabular/model")
        status, rows = server.invoke("tabular", [[0.5] * 16])
        server.metric("mmserver_requests_total", model="tabular", status="200")
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from prometheus_client import Metric
from prometheus_client.parser import text_string_to_metric_families

#: How much of a server log an error message quotes.
LOG_TAIL_CHARS = 4000

Families = Mapping[str, Metric]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def taskset_prefix(cpus: str | None) -> list[str]:
    """``["taskset", "-c", cpus]`` where pinning is possible and meaningful, else ``[]``.

    Pinning needs ``taskset``, CPUs this process may use, and more than one of them
    (pinning everything to the only core would measure nothing).
    """
    if not cpus or shutil.which("taskset") is None or not hasattr(os, "sched_getaffinity"):
        return []
    wanted: set[int] = set()
    for part in cpus.split(","):
        low, _, high = part.partition("-")
        wanted.update(range(int(low), int(high or low) + 1))
    allowed = os.sched_getaffinity(0)
    if not wanted or not wanted <= allowed or len(allowed) < 2:
        return []
    return ["taskset", "-c", cpus]


def http_request(base_url: str, method: str, path: str, body: bytes | str | None = None,
                 headers: Mapping[str, str] | None = None,
                 timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    """One request on a fresh connection: (status, headers, body). Raises OSError when
    nothing answers."""
    address = urllib.parse.urlsplit(base_url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=timeout)
    try:
        if isinstance(body, str):
            body = body.encode()
        connection.request(method, path, body=body, headers=dict(headers or {}))
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def wait_for_http_workers(base_url: str, workers: int, worker_header: str,
                          timeout: float = 60) -> None:
    """Return once each of ``workers`` HTTP workers (``--http-workers``) has answered
    ``/ping``, naming itself in ``worker_header`` (``mmserver.http.app.WORKER_HEADER``): the
    port answers as soon as the first worker listens, and the others start (import torch)
    seconds apart. Each ping is a fresh connection, which the kernel gives to any worker."""
    answered: set[str | None] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answered.add(http_request(base_url, "GET", "/ping")[1].get(worker_header))
        if len(answered - {None}) >= workers:
            return
    raise TimeoutError(f"only workers {sorted(map(str, answered))} of {workers} answered "
                       f"within {timeout:g} s")


def wait_for_ping(base_url: str, timeout: float = 120, process: subprocess.Popen | None = None,
                  *, log: Callable[[], str] | None = None) -> None:
    """Return once ``GET /ping`` answers 200.

    ``process`` is watched (anything with ``poll()``): if it exits first, the error
    says so at once instead of after ``timeout`` seconds. ``log`` returns the
    server's output; its tail goes into either error. Without ``log``, an exited
    ``Popen`` started with ``stdout=PIPE`` gives its output instead.
    """
    def tail() -> str:
        if log is not None:
            return log()[-LOG_TAIL_CHARS:]
        stream = getattr(process, "stdout", None)
        if stream is not None and process.poll() is not None:
            output = stream.read()
            return (output.decode(errors="replace") if isinstance(output, bytes)
                    else output)[-LOG_TAIL_CHARS:]
        return "(no log)"

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server at {base_url} exited with {process.poll()} "
                               f"before /ping answered:\n{tail()}")
        try:
            if http_request(base_url, "GET", "/ping", timeout=1)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{base_url}/ping did not answer 200 within {timeout} s:\n{tail()}")


def scrape_metrics(base_url: str) -> dict[str, Metric]:
    """``GET /metrics``, parsed by prometheus_client, keyed by family name.

    A counter's family name has no ``_total`` (``mmserver_requests``); its sample does
    (``mmserver_requests_total``), which is what :func:`sample_value` looks for.
    """
    return RunningServer(base_url).metrics()


def parse_metrics(text: str) -> dict[str, Metric]:
    """Prometheus text format, parsed by prometheus_client, keyed by family name."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample_value(families: Families, sample_name: str, **labels: str) -> float:
    """The sum of the samples named ``sample_name`` whose labels include ``labels``.

    0.0 when there is none, as for a model that has not been called yet. Giving every
    label picks one sample; leaving some out adds over them (``status="200"`` over all
    models).
    """
    wanted = {key: str(value) for key, value in labels.items()}
    return sum(sample.value
               for family in families.values() for sample in family.samples
               if sample.name == sample_name
               and all(sample.labels.get(key) == value for key, value in wanted.items()))


def histogram(families: Families, name: str,
              **labels: str) -> tuple[dict[float, float], float, float]:
    """One histogram: ({upper bound ``le``: cumulative count}, sum, count).

    Bounds are floats (``+Inf`` is ``math.inf``) in increasing order. Subtract two
    scrapes' values to get what happened between them.
    """
    wanted = {key: str(value) for key, value in labels.items()}
    buckets: dict[float, float] = {}
    family = families.get(name)
    for sample in family.samples if family is not None else ():
        if (sample.name == name + "_bucket"
                and all(sample.labels.get(key) == value for key, value in wanted.items())):
            bound = float(sample.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + sample.value
    return (dict(sorted(buckets.items())), sample_value(families, name + "_sum", **labels),
            sample_value(families, name + "_count", **labels))


class ModelServerClient:
    """The requests a test or a notebook makes to mmserver, over any transport.

    Subclasses say how one request travels (:meth:`request`); everything else is built
    on it, so a subprocess server and an in-process test client answer the same calls.
    """

    def request(self, method: str, path: str, body: bytes | str | None = None,
                headers: Mapping[str, str] | None = None,
                timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one request."""
        raise NotImplementedError

    def json(self, method: str, path: str, payload=None, headers=None,
             timeout: float = 60) -> tuple[int, object]:
        """A JSON request (``payload`` None sends no body); the answer decoded, or None."""
        body = None if payload is None else json.dumps(payload)
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        status, _, raw = self.request(method, path, body, all_headers, timeout)
        return status, json.loads(raw) if raw else None

    def load(self, name: str, url: str | Path) -> tuple[int, object]:
        return self.json("POST", "/models", {"model_name": name, "url": str(url)})

    def unload(self, name: str) -> tuple[int, object]:
        return self.json("DELETE", f"/models/{name}")

    def invoke(self, name: str, rows, headers=None, timeout: float = 60) -> tuple[int, object]:
        return self.json("POST", f"/models/{name}/invoke", rows, headers, timeout)

    def metrics(self) -> dict[str, Metric]:
        status, _, raw = self.request("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"GET /metrics answered {status}")
        return parse_metrics(raw.decode())

    def metric(self, sample_name: str, **labels: str) -> float:
        """One sample of ``/metrics`` now (see :func:`sample_value`); 0.0 when absent."""
        return sample_value(self.metrics(), sample_name, **labels)


class RunningServer(ModelServerClient):
    """A server already listening at ``url`` (``make serve``'s, a container's)."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def request(self, method: str, path: str, body: bytes | str | None = None,
                headers: Mapping[str, str] | None = None,
                timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
        return http_request(self.url, method, path, body, headers, timeout)


class ServerProcess(RunningServer):
    """``python -m mmserver serve`` in a subprocess on 127.0.0.1, and a small client for it.

    Runs ``[taskset -c cpus] python -m mmserver serve --host 127.0.0.1 --port PORT *args``
    with ``env`` over this process's environment. Its output goes to ``log_path``
    (default: a new file in the temporary directory, kept so a failure can be read
    afterwards). ``cpus`` is the pinning actually applied ("" when none was possible).
    """

    def __init__(self, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
                 port: int | None = None, cpus: str | None = None,
                 log_path: Path | None = None, cwd: Path | None = None):
        self.args = [str(arg) for arg in args]
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.port = port if port is not None else free_port()
        super().__init__(f"http://127.0.0.1:{self.port}")
        self.pinning = taskset_prefix(cpus)
        self.cpus = cpus if self.pinning else ""
        self.log_path = Path(log_path) if log_path is not None else None
        self.cwd = cwd
        self.process: subprocess.Popen | None = None
        self._log_file = None

    def command(self) -> list[str]:
        """gRPC is off unless ``args`` give ``--grpc-port`` (a later flag wins), so that
        servers started side by side never contend for its default port."""
        return [*self.pinning, sys.executable, "-m", "mmserver", "serve",
                "--host", "127.0.0.1", "--port", str(self.port), "--grpc-port", "0",
                *self.args]

    def start(self, timeout: float = 120) -> ServerProcess:
        """Start the server and wait until ``/ping`` answers 200; stop it if it does not."""
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix=f"mmserver-{self.port}-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        self._log_file = open(self.log_path, "wb")
        self.process = subprocess.Popen(self.command(), stdout=self._log_file,
                                        stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd)
        try:
            wait_for_ping(self.url, timeout, self.process, log=self.log)
        except BaseException:
            self.stop(signal.SIGKILL)
            raise
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig`` and wait up to ``timeout`` seconds, then kill. The exit status."""
        if self.process is None:
            raise RuntimeError("the server was never started")
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log_file is not None:
            self._log_file.close()
        return self.process.returncode

    def __enter__(self) -> ServerProcess:
        return self.start() if self.process is None else self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def log(self) -> str:
        """Everything the server printed so far."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")
