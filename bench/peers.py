"""mmserver against its peers, on the same core, under the same closed-loop load.

Every server runs pinned to core 0 with one intra-op torch thread and serves the
same small CNN (``harness.SmallCNN``, one 3x32x32 ``.npy`` input per request,
about 12 KB); the load generator runs on core 1. The peers:

* ``mmserver``: ``python -m mmserver serve`` with its defaults, max batch 16, max wait 5 ms;
* ``mmserver-measured``: the same with ``--batch-sizing measured``: a batch is full at
  the size (at most 16) that the model's own calls show to serve the most rows/s;
* ``book``: the book's design (``notebooks/book_server.py``, its runner and handler
  behind aiohttp), same batch settings; its runner stacks inputs, so its body holds
  one 3x32x32 array where the others get 1x3x32x32 (the same 12 KB of data). One
  change: its defect 3 is fixed from outside (a subclass cancels the previous timer
  before arming the next), because as printed a stale timer wakes the runner on an
  empty queue, ``torch.stack([])`` ends it, and the server answers nothing more
  within seconds of load (0 requests/s at 8 users and more);
* ``nobatch``: aiohttp, ``np.load`` on the loop, the model on one executor thread, no batching;
* ``bare``: aiohttp reading the body and answering a constant JSON row: the HTTP limit,
  on the event loop mmserver runs on (uvloop when installed), so it is a limit for it;
* ``torchserve``: TorchServe (when ``torchserve`` and ``java`` are installed, e.g.
  ``pip install torchserve torch-model-archiver``) with batchSize 16, maxBatchDelay 5 ms,
  one worker, a handler that ``np.load``-s each body (written by this script);
* ``ray``: Ray Serve (when ``ray[serve]`` is installed): a local single-node cluster of one
  CPU started inside the pinned process (``ray.init(num_cpus=1)``), its HTTP proxy on
  ``/``, one replica, no autoscaling, ``@serve.batch(max_batch_size=16,
  batch_wait_timeout_s=0.005)`` around the model call, ``max_ongoing_requests`` 256
  (Serve's default of 5 would cap every batch at 5);
* ``litserve``: LitServe (when ``litserve`` is installed) on ``/predict``: its own batching
  (``max_batch_size=16, batch_timeout=0.005``), ``accelerator="cpu"``, one inference
  worker (``workers_per_device=1``) and one API server, its default queues between them.

The last two live in ``bench/peer_servers.py``. Every peer, optional ones included
(``pip install -e '.[peers]'`` installs them), answers the same JSON row list, and a peer
whose package is missing is skipped with a printed line.

All servers are started at once, then for 1, 8 and 32 closed-loop users the script runs
rounds of equal windows alternating between the servers (the order rotates each
round). During a server's window every other server is paused (SIGSTOP to its whole
process tree, SIGCONT after), so an "idle" peer really costs nothing: TorchServe's Java
frontend keeps threads busy on the shared core even when no request comes, as do Ray's
controller and agents and LitServe's inference worker, which polls its queue. On a shared
machine whose speed drifts, a ratio within one round means more than any single figure,
so the summary is the median over rounds of ``mmserver req/s / peer req/s`` (and of
``mmserver-measured``'s). Each window reports requests/s, p50 and p99.

The load generator is ``wrk`` (one thread, one connection per user) when installed, else
an aiohttp closed loop on core 1 (which may itself limit the fastest servers).

Writes ``peers.csv`` (one line per window) and ``peers.md`` (the tables) to ``--out``
(default ``results/peers``; in quick mode, ``MMSERVER_QUICK=1``, a temporary folder
unless ``--out`` is given).

Usage: python bench/peers.py [--seconds 10] [--rounds 4] [--users 1,8,32] [--only mmserver,ray]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import importlib.util
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from mmserver.process import event_loop  # noqa: E402
from mmserver.harness.testing import ServerProcess, free_port, http_request  # noqa: E402

INPUT_SHAPE = (3, 32, 32)
MAX_BATCH_SIZE = 16
MAX_WAIT_MS = 5
MAX_QUEUE_SIZE = 256
QUICK = os.environ.get("MMSERVER_QUICK") == "1"
BOOK_SERVER = harness.REPO / "notebooks" / "book_server.py"
PEER_SERVERS = Path(__file__).resolve().parent / "peer_servers.py"
PEERS = ("mmserver", "mmserver-measured", "book", "nobatch", "bare", "torchserve", "ray",
         "litserve")
OURS = ("mmserver", "mmserver-measured")
ANSWER = b"[[" + b",".join(b"0.0" for _ in range(10)) + b"]]"
NPY = {"Content-Type": "application/x-npy"}


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


ROW = np.random.default_rng(0).random(INPUT_SHAPE, dtype=np.float32)
BODY = npy(ROW[None])      # one row with its batch dimension: all but the book
BOOK_BODY = npy(ROW)       # one input without it: the book's runner stacks inputs


# -- the servers -----------------------------------------------------------------

class ScriptServer(ServerProcess):
    """A Python script with ``--port PORT`` and more arguments, started as mmserver is."""

    def __init__(self, script: Path, args, **kwargs):
        self.script = script
        super().__init__(args, **kwargs)

    def command(self) -> list[str]:
        return [*self.pinning, sys.executable, str(self.script), "--port", str(self.port),
                *self.args]


class PeerProcess(ServerProcess):
    """A peer started by its own command line, pinned like the rest; ``command`` is the peer's.

    Ready once ``invoke_path`` answers the benchmark's body with 200: a health route, where
    a peer has one, may answer before its model is up. The frameworks start more processes
    (TorchServe's Java frontend and Python worker, Ray's cluster and actors, LitServe's API
    server and inference worker): on stop every process of the tree is ended, by id.
    """

    invoke_path = "/"

    def start(self, timeout: float = 240) -> PeerProcess:
        if self.log_path is None:
            handle, name = tempfile.mkstemp(prefix=f"peer-{self.port}-", suffix=".log")
            os.close(handle)
            self.log_path = Path(name)
        self._log_file = open(self.log_path, "wb")
        self.process = subprocess.Popen(self.command(), stdout=self._log_file,
                                        stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                if http_request(self.url, "POST", self.invoke_path, BODY, NPY, timeout=5)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop(signal.SIGKILL)
        raise RuntimeError(f"{' '.join(self.command())} did not answer POST {self.invoke_path} "
                           f"with 200 within {timeout} s:\n{self.log()[-4000:]}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        import psutil

        try:
            tree = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        code = super().stop(sig, timeout)
        for child in tree:
            with contextlib.suppress(psutil.Error):
                child.kill()
        return code


class PythonPeer(PeerProcess):
    """``bench/peer_servers.py ray|litserve`` with this script's batch settings."""

    def __init__(self, kind: str, invoke_path: str, model_dir: Path, **kwargs):
        super().__init__([kind, "--model-dir", str(model_dir), "--max-batch-size",
                          str(MAX_BATCH_SIZE), "--max-wait-ms", str(MAX_WAIT_MS),
                          "--max-queue-size", str(MAX_QUEUE_SIZE)], **kwargs)
        self.invoke_path = invoke_path

    def command(self) -> list[str]:
        return [*self.pinning, sys.executable, str(PEER_SERVERS), self.args[0], "--port",
                str(self.port), *self.args[1:]]


class TorchServe(PeerProcess):
    """``torchserve --foreground`` with a config written into ``workdir``."""

    invoke_path = "/predictions/cnn"

    def __init__(self, workdir: Path, model_dir: Path, **kwargs):
        super().__init__([], cwd=workdir, **kwargs)
        self.workdir, self.model_dir = workdir, model_dir
        self.config = _torchserve_config(workdir, model_dir, self.port)

    def command(self) -> list[str]:
        return [*self.pinning, "torchserve", "--start", "--foreground", "--ncs",
                "--disable-token-auth", "--model-store", str(self.workdir / "store"),
                "--ts-config", str(self.config), "--models", "cnn=cnn.mar"]


TORCHSERVE_HANDLER = '''\
"""Written by bench/peers.py: np.load each body, one batched call, one JSON row per request."""
import io
import json

import numpy as np
import torch

torch.set_num_threads(1)
_model = None


def handle(data, context):
    global _model
    if _model is None:
        model_dir = context.system_properties["model_dir"]
        _model = torch.jit.load(model_dir + "/model.pt", map_location="cpu").eval()
    if data is None:
        return None
    inputs = [torch.from_numpy(np.load(io.BytesIO(r.get("body") or r.get("data")),
                                       allow_pickle=False)) for r in data]
    with torch.inference_mode():
        rows = _model(torch.cat(inputs)).tolist()
    return [json.dumps([row]) for row in rows]
'''


def _torchserve_config(workdir: Path, model_dir: Path, port: int) -> Path:
    store = workdir / "store"
    store.mkdir(parents=True, exist_ok=True)
    (workdir / "handler.py").write_text(TORCHSERVE_HANDLER)
    subprocess.run(["torch-model-archiver", "--model-name", "cnn", "--version", "1.0",
                    "--serialized-file", str(model_dir / "model.pt"),
                    "--handler", str(workdir / "handler.py"), "--export-path", str(store),
                    "--force"], check=True, cwd=workdir)
    models = ('{"cnn": {"1.0": {"defaultVersion": true, "marName": "cnn.mar", '
              f'"minWorkers": 1, "maxWorkers": 1, "batchSize": {MAX_BATCH_SIZE}, '
              f'"maxBatchDelay": {MAX_WAIT_MS}, "responseTimeout": 120}}}}}}')
    config = workdir / "config.properties"
    config.write_text("\n".join([
        f"inference_address=http://127.0.0.1:{port}",
        f"management_address=http://127.0.0.1:{free_port()}",
        f"metrics_address=http://127.0.0.1:{free_port()}",
        f"model_store={store}",
        f"models={models}",
        "default_workers_per_model=1",
        f"job_queue_size={MAX_QUEUE_SIZE}",
        "disable_token_authorization=true",
        "disable_system_metrics=true",
        "install_py_dep_per_model=false",
        "number_of_netty_threads=1",
        "netty_client_threads=1",
        "vmargs=-Xmx512m -XX:+UseSerialGC -XX:ActiveProcessorCount=1",
        ""]))
    return config


def torchserve_available() -> bool:
    return all(shutil.which(tool) for tool in ("torchserve", "torch-model-archiver", "java"))


def installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(module) is not None for module in modules)


def make_servers(root: Path, names: list[str]) -> dict[str, tuple[ServerProcess, str, bytes]]:
    """name -> (server, invoke path, body). Not started."""
    pin = {"env": harness.ONE_THREAD, "cpus": harness.SERVER_CPU}
    model_dir = root / "cnn"
    batch = ["--max-batch-size", str(MAX_BATCH_SIZE), "--max-wait-ms", str(MAX_WAIT_MS),
             "--max-queue-size", str(MAX_QUEUE_SIZE)]
    servers = {}
    for name, sizing in zip(OURS, ("max", "measured")):  # access log on, as deployed
        if name in names:
            servers[name] = (ServerProcess(
                ["--model-root", str(root), "--preload", f"cnn={model_dir}", "--log-level",
                 "WARNING", *batch, "--batch-sizing", sizing], cwd=harness.REPO, **pin),
                "/models/cnn/invoke", BODY)
    for kind in ("book", "nobatch", "bare"):
        if kind in names:
            servers[kind] = (ScriptServer(Path(__file__).resolve(),
                                          ["--serve", kind, "--model-dir", str(model_dir), *batch],
                                          cwd=harness.REPO, **pin), "/invoke",
                             BOOK_BODY if kind == "book" else BODY)
    if "torchserve" in names:
        if torchserve_available():
            workdir = root / "torchserve"
            workdir.mkdir()
            servers["torchserve"] = (TorchServe(workdir, model_dir, **pin),
                                     "/predictions/cnn", BODY)
        else:
            print("torchserve: skipped (needs torchserve, torch-model-archiver and java)")
    for kind, path, modules, needs in (("ray", "/", ("ray", "starlette", "uvicorn"), "ray[serve]"),
                                       ("litserve", "/predict", ("litserve",), "litserve")):
        if kind in names:
            if installed(*modules):
                servers[kind] = (PythonPeer(kind, path, model_dir, cwd=harness.REPO, **pin),
                                 path, BODY)
            else:
                print(f"{kind}: skipped (needs {needs})")
    return servers


def check_answers(servers: dict, model_dir: Path) -> None:
    """Every server but ``bare`` answers the model's own row for the body: the same work."""
    model = torch.jit.load(str(model_dir / "model.pt"), map_location="cpu").eval()
    with torch.inference_mode():
        expected = model(torch.from_numpy(ROW[None])).numpy().reshape(-1)
    for name, (server, path, body) in servers.items():
        if name == "bare":
            continue
        status, _, raw = http_request(server.url, "POST", path, body, NPY)
        got = np.asarray(json.loads(raw) if status == 200 else [], dtype=np.float32).reshape(-1)
        if got.shape != expected.shape or not np.allclose(got, expected, atol=1e-5):
            raise RuntimeError(f"{name} answered {status} {raw[:200]!r}, not the model's row")


def serve_book(argv: list[str]) -> None:
    """``--serve book``: ``notebooks/book_server.py``'s ``main`` with defect 3 fixed from outside."""
    sys.path.insert(0, str(BOOK_SERVER.parent))
    import book_runner
    import book_server

    class OneTimer(book_runner.ModelRunner):
        def schedule_processing_if_needed(self):
            if self.needs_processing_timer is not None:
                self.needs_processing_timer.cancel()
            super().schedule_processing_if_needed()

    book_runner.ModelRunner = OneTimer  # what make_book_app instantiates
    book_server.main(argv)


def serve_peer(kind: str, port: int, model_dir: Path) -> None:
    """``--serve nobatch|bare``: the two aiohttp baselines this script defines."""
    from concurrent.futures import ThreadPoolExecutor

    from aiohttp import web

    torch.set_num_threads(1)
    model = torch.jit.load(str(model_dir / "model.pt"), map_location="cpu").eval()
    executor = ThreadPoolExecutor(1)

    def call(x: torch.Tensor) -> list:
        with torch.inference_mode():
            return model(x).tolist()

    async def nobatch(request: web.Request) -> web.Response:
        x = torch.from_numpy(np.load(io.BytesIO(await request.read()), allow_pickle=False))
        rows = await asyncio.get_running_loop().run_in_executor(executor, call, x)
        return web.json_response(rows)

    async def bare(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({"status": "Healthy"})

    app = web.Application()
    app.router.add_post("/invoke", {"nobatch": nobatch, "bare": bare}[kind])
    app.router.add_get("/ping", ping)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None,
                loop=event_loop() if kind == "bare" else None)


# -- the load ----------------------------------------------------------------------

def load(url: str, body: bytes, users: int, seconds: float) -> dict[str, float]:
    """One closed-loop window: requests/s, p50 and p99 in ms, non-2xx answers."""
    return harness.latency_window(url, body, {"Content-Type": "application/x-npy"}, users,
                                  seconds)


def _pinned_load_generator() -> None:
    if hasattr(os, "sched_setaffinity") and harness.taskset_prefix(harness.LOAD_CPU):
        os.sched_setaffinity(0, {int(harness.LOAD_CPU)})


# -- the report --------------------------------------------------------------------

@contextlib.contextmanager
def only_running(servers: dict, name: str):
    """Pause every server's process tree except ``name``'s for the duration of a window."""
    import psutil

    paused = []
    for other, (server, _, _) in servers.items():
        if other == name:
            continue
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(server.process.pid)
            paused += [root, *root.children(recursive=True)]
    for process in paused:
        with contextlib.suppress(psutil.Error):
            process.suspend()
    try:
        yield
    finally:
        for process in paused:
            with contextlib.suppress(psutil.Error):
                process.resume()


def summarize(rows: list[dict], names: list[str], settled: dict[int, object]) -> str:
    """Markdown: one table per user count (req/s per round, p50, p99, ratios to each mmserver)."""
    ours = [n for n in OURS if n in names]
    lines = []
    for users in sorted({r["users"] for r in rows}):
        at = [r for r in rows if r["users"] == users]
        rounds = sorted({r["round"] for r in at})
        by = {(r["server"], r["round"]): r for r in at}
        lines += [f"### {users} closed-loop user{'s' if users > 1 else ''}", "",
                  "| server | req/s per round | p50 ms | p99 ms | "
                  + " | ".join(f"{mine} ÷ server (median of rounds)" for mine in ours) + " |",
                  "|---|---|---|---|" + "---|" * len(ours)]
        for name in names:
            mine = [by[name, k] for k in rounds if (name, k) in by]
            if not mine:
                continue
            lines.append(
                f"| {name} | {' / '.join(format(r['rps'], '.0f') for r in mine)} "
                f"| {statistics.median(r['p50_ms'] for r in mine):.2f} "
                f"| {statistics.median(r['p99_ms'] for r in mine):.2f} | "
                + " | ".join(_ratio(by, rounds, us, name) for us in ours) + " |")
        if users in settled:
            lines += ["", (f"After this load mmserver-measured counted a batch as full at "
                           f"{settled[users]} rows (smaller batches run as they form).")]
        lines.append("")
    return "\n".join(lines)


def _ratio(by: dict, rounds: list[int], ours: str, peer: str) -> str:
    ratios = [by[ours, k]["rps"] / by[peer, k]["rps"] for k in rounds
              if (ours, k) in by and (peer, k) in by and by[peer, k]["rps"]]
    if peer == ours or not ratios:
        return "—"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def measured_batch_size(server: ServerProcess) -> object:
    """What mmserver-measured's sizer chose, from ``GET /models/cnn``."""
    status, _, raw = http_request(server.url, "GET", "/models/cnn")
    return json.loads(raw)["stats"].get("measuredBatchSize") if status == 200 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1 if QUICK else 10)
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 4)
    parser.add_argument("--users", default="1,8,32")
    parser.add_argument("--only", default=",".join(PEERS), help="servers to run, comma-separated")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--serve", choices=("book", "nobatch", "bare"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.serve == "book":
        serve_book(["--port", str(args.port), "--model-dir", str(args.model_dir), *rest])
        return
    if args.serve:
        serve_peer(args.serve, args.port, args.model_dir)
        return

    # Tools installed beside this interpreter (torchserve in a virtual environment) are found too.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    names = [n for n in PEERS if n in args.only.split(",")]
    users = [int(u) for u in args.users.split(",")]
    out = args.out or (Path(tempfile.mkdtemp(prefix="peers-")) if QUICK
                       else harness.REPO / "results" / "peers")
    print(f"load: {'wrk' if shutil.which('wrk') else 'aiohttp closed loop'} on core "
          f"{harness.LOAD_CPU}; servers on core {harness.SERVER_CPU}; {args.rounds} rounds of "
          f"{args.seconds:g} s per server and user count; body {len(BODY)} bytes")
    rows: list[dict] = []
    settled: dict[int, object] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        torch.manual_seed(0)
        harness.save_torchscript(harness.SmallCNN(), torch.randn(2, *INPUT_SHAPE), root / "cnn")
        servers = make_servers(root, names)
        for name, (server, _, _) in servers.items():
            stack.enter_context(harness.serving(server))
        names = [n for n in names if n in servers]
        check_answers(servers, root / "cnn")
        _pinned_load_generator()
        for n_users in users:
            for name in names:  # warm-up: connections, allocator, first batches
                server, path, body = servers[name]
                with only_running(servers, name):
                    load(server.url + path, body, n_users, min(1.0, args.seconds))
            for round_ in range(args.rounds):
                order = names[round_ % len(names):] + names[:round_ % len(names)]
                for name in order:
                    server, path, body = servers[name]
                    with only_running(servers, name):
                        result = load(server.url + path, body, n_users, args.seconds)
                    rows.append({"users": n_users, "round": round_, "server": name, **result})
                    print(f"users={n_users:3d} round={round_} {name:17s} {result['rps']:8.0f} req/s "
                          f"p50={result['p50_ms']:7.2f} ms p99={result['p99_ms']:7.2f} ms"
                          f"{'  non-2xx=' + str(result['non_2xx']) if result['non_2xx'] else ''}",
                          flush=True)
            if "mmserver-measured" in servers:
                settled[n_users] = measured_batch_size(servers["mmserver-measured"][0])
    table = summarize(rows, names, settled)
    print()
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "peers.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=["users", "round", "server", "rps", "p50_ms",
                                                    "p99_ms", "non_2xx"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (out / "peers.md").write_text(
        f"# mmserver and its peers\n\n`python bench/peers.py --seconds {args.seconds:g} "
        f"--rounds {args.rounds}`: servers on core {harness.SERVER_CPU} (the others paused "
        f"during each server's window), "
        f"{'wrk' if shutil.which('wrk') else 'an aiohttp closed loop'} on core "
        f"{harness.LOAD_CPU}, small CNN, one 3x32x32 `.npy` input per request, max batch "
        f"{MAX_BATCH_SIZE}, max wait {MAX_WAIT_MS} ms; `mmserver-measured` is mmserver with "
        f"`--batch-sizing measured`.\n\n{table}")
    print(f"wrote {out / 'peers.csv'} and {out / 'peers.md'}")


if __name__ == "__main__":
    main()
