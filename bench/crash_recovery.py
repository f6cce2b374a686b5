"""From a model process's death to the model serving again: mmserver's engine, TorchServe's worker.

A native crash in a model (a segfault in an extension, ``abort()``, the OOM killer)
kills the process that runs it. This benchmark kills that process with SIGKILL while a
client sends one request after another, and measures, for each of ``--repeats`` kills:

* **to serving again**: from the kill to the first 200 after it;
* what the client saw meanwhile: answers by status, and requests with no answer within
  ``CLIENT_TIMEOUT_S`` (a hang: there should be none).

The servers, driven the same way, with the same TorchScript model (``bench/peers.py``'s
small CNN) and the same ``.npy`` body:

* ``mmserver --http-workers 2``: the engine process that holds the model is killed; the
  supervisor starts another, which imports torch and loads the model again
  (README, "HTTP workers");
* ``isolated``: one mmserver process, the model with ``"isolation": "process"`` in its
  ``mmserver.json`` beside a copy without it; the isolated model's process is killed, and a
  second client on the copy counts what the other model answered meanwhile (README,
  "Isolation");
* ``torchserve`` (when ``torchserve``, ``torch-model-archiver`` and ``java`` are installed):
  its Python backend worker (``model_service_worker``) is killed; the frontend starts another.

Both sides restart a whole Python process that imports torch, so the figures are mostly
that import and the model's load, on this machine. The summary prints the median of each
and their ratio, from this one run.

Usage: python bench/crash_recovery.py [--repeats 5] [--only mmserver,torchserve];
``MMSERVER_QUICK=1`` shrinks it.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
import peers  # noqa: E402

from mmserver.harness.testing import ServerProcess, http_request, wait_for_http_workers  # noqa: E402
from mmserver.http.app import WORKER_HEADER  # noqa: E402

QUICK = os.environ.get("MMSERVER_QUICK") == "1"
#: A request still unanswered after this long counts as a hang.
CLIENT_TIMEOUT_S = 30.0
#: After serving again, the client keeps going this long before the next kill.
SETTLE_S = 1.0
HTTP_WORKERS = 2


class Client(threading.Thread):
    """One request after another to ``url + path``; every answer recorded with its time."""

    def __init__(self, url: str, path: str, body: bytes):
        super().__init__(daemon=True)
        self.url, self.path, self.body = url, path, body
        #: (monotonic time sent, time answered, status)
        self.answers: list[tuple[float, float, int | str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            sent = time.monotonic()
            try:
                status = http_request(self.url, "POST", self.path, self.body, peers.NPY,
                                      timeout=CLIENT_TIMEOUT_S)[0]
            except TimeoutError:
                status = "hung"
            except OSError:
                status = "refused"
                time.sleep(0.01)
            self.answers.append((sent, time.monotonic(), status))

    def first_200_after(self, moment: float, timeout: float) -> float | None:
        """When the first request sent after ``moment`` and answered 200 was answered (one
        sent before may still have been answered by the process just killed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for sent, answered, status in list(self.answers):
                if sent > moment and status == 200:
                    return answered
            time.sleep(0.01)
        return None


def engine_pid(server: ServerProcess) -> int:
    """The pid of the engine that holds ``cnn`` now (its describe answer says)."""
    return int(server.json("GET", "/models/cnn")[1]["engine"]["pid"])


def torchserve_worker_pid(server: ServerProcess) -> int:
    """TorchServe's Python backend worker: the frontend's child running model_service_worker."""
    for child in psutil.Process(server.process.pid).children(recursive=True):
        try:
            if any("model_service_worker" in part for part in child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    raise RuntimeError("TorchServe has no backend worker process")


def measure(name: str, server: ServerProcess, path: str, victim, repeats: int,
            bystander: str | None = None) -> list[float]:
    """Seconds from each kill to the first 200 after it; prints what the client saw, and
    what a second client on the ``bystander`` path saw throughout."""
    client = Client(server.url, path, peers.BODY)
    client.start()
    other = Client(server.url, bystander, peers.BODY) if bystander else None
    if other is not None:
        other.start()
    recoveries = []
    try:
        for repeat in range(repeats):
            assert client.first_200_after(time.monotonic(), 30), f"{name} does not serve"
            pid = victim(server)
            seen_before = len(client.answers)
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            served = client.first_200_after(killed, 120)
            if served is None:
                raise RuntimeError(f"{name} did not serve again within 120 s of the kill:\n"
                                   f"{server.log()[-3000:]}")
            recoveries.append(served - killed)
            time.sleep(SETTLE_S)
            during = collections.Counter(status for _, answered, status
                                         in client.answers[seen_before:] if answered <= served)
            print(f"{name:10s} kill {repeat + 1}: serving again after {served - killed:6.2f} s; "
                  f"meanwhile {dict(during)}", flush=True)
    finally:
        for each in (client, other):
            if each is not None:
                each.stop.set()
                each.join(CLIENT_TIMEOUT_S + 5)
    hangs = sum(status == "hung" for _, _, status in client.answers)
    print(f"{name:10s} {len(client.answers)} requests answered in all, {hangs} hung")
    if other is not None:
        print(f"{name:10s} the other model, throughout: "
              f"{dict(collections.Counter(status for _, _, status in other.answers))}")
    return recoveries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2 if QUICK else 5)
    parser.add_argument("--only", default="mmserver,isolated,torchserve")
    parser.add_argument("--quiet-neighbour", action="store_true",
                        help="isolated: no client on the other model (its load then takes "
                             "no CPU from the restart)")
    args = parser.parse_args()
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    only = args.only.split(",")
    medians = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        torch.manual_seed(0)
        harness.save_torchscript(harness.SmallCNN(), torch.randn(2, *peers.INPUT_SHAPE),
                                 root / "cnn")
        if "mmserver" in only:
            server = ServerProcess(["--model-root", str(root), "--preload", f"cnn={root / 'cnn'}",
                                    "--http-workers", str(HTTP_WORKERS), "--log-level", "WARNING"],
                                   cwd=harness.REPO, env=harness.ONE_THREAD)
            with harness.serving(server):
                wait_for_http_workers(server.url, HTTP_WORKERS, WORKER_HEADER)
                medians["mmserver"] = statistics.median(
                    measure("mmserver", server, "/models/cnn/invoke", engine_pid, args.repeats))
        if "isolated" in only:
            shutil.copytree(root / "cnn", root / "isolated")
            (root / "isolated" / "mmserver.json").write_text('{"isolation": "process"}')
            server = ServerProcess(["--model-root", str(root), "--preload",
                                    f"cnn={root / 'isolated'}", "--preload",
                                    f"other={root / 'cnn'}", "--log-level", "WARNING"],
                                   cwd=harness.REPO, env=harness.ONE_THREAD)
            with harness.serving(server):
                medians["isolated"] = statistics.median(measure(
                    "isolated", server, "/models/cnn/invoke", engine_pid, args.repeats,
                    bystander=None if args.quiet_neighbour else "/models/other/invoke"))
        if "torchserve" in only:
            servers = peers.make_servers(root, ["torchserve"])   # prints why when it cannot run
            if "torchserve" in servers:
                server, path, _ = servers["torchserve"]
                server.pinning, server.cpus = [], ""   # on every core, as mmserver above
                with harness.serving(server):
                    medians["torchserve"] = statistics.median(
                        measure("torchserve", server, path, torchserve_worker_pid, args.repeats))
    print()
    print(f"median seconds from the kill to serving again, over {args.repeats} kills:")
    for name, median in medians.items():
        print(f"  {name:10s} {median:6.2f} s")
    ratios = [(a, b) for a, b in (("isolated", "mmserver"), ("mmserver", "torchserve"),
                                  ("isolated", "torchserve")) if a in medians and b in medians]
    for a, b in ratios:
        print(f"  {a} / {b}: {medians[a] / medians[b]:.2f}")
    if not ratios:
        print("  no ratio: only one server ran in this run")


if __name__ == "__main__":
    main()
