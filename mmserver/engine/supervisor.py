"""The process ``mmserver serve --http-workers N`` starts: the engine, then N HTTP workers.

Start-up: the engine loads the preloaded models and says it is ready (or why it
failed, and the server exits 1 as one process would); then the workers bind the port
with ``SO_REUSEPORT`` and connect to the engine's socket, in a folder of its own only
this user may enter.

Shutdown (SIGTERM or SIGINT): the workers first, each finishing the requests it
accepted (aiohttp's graceful stop, within ``MMSERVER_SHUTDOWN_TIMEOUT``), then the
engine, which drains what is left; a process still there past its share of the time is
killed, and the socket's folder removed, so nothing is left behind.

**The engine's death** (a model's native code crashed, ``abort()``, the OOM killer)
does not end the server. The workers answer the requests the engine held, and every
request until a new engine serves, with 503 at once; the supervisor starts a new engine,
which loads again the models the dead one held (its :mod:`~mmserver.engine.journal`),
each within ``MMSERVER_LOAD_TIMEOUT``, and the workers reconnect to it. A model whose
load was under way when an engine died is not loaded again but marked failed, so a
model that kills the engine as it loads cannot make it crash-loop. An engine that dies
before it serves with no load under way (it cannot start at all) ends the server
(exit 1), as does a worker that ends on its own: a container's restart policy then
starts it afresh.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import signal
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path

from mmserver.config import Settings
from mmserver.engine.client import EngineService
from mmserver.engine.journal import Failure, Restart, State, journal_beside
from mmserver.engine.spawn import CONTEXT, cause_of_end, spawn_engine, wait_ready
from mmserver.grpc.server import attach as attach_grpc
from mmserver.http.app import SERVICE, create_app
from mmserver.http.local import LocalService
from mmserver.process import prepare_process, run_app
from mmserver.status import ModelStatus

log = logging.getLogger(__name__)
#: Of the shutdown timeout, the share the workers get; the engine drains in the rest.
WORKERS_SHARE = 0.6
#: Of the workers' share, what a worker's drain (aiohttp's and its engine requests') may use.
WORKER_DRAIN_SHARE = 0.9


def serve_with_workers(settings: Settings, log_level: str) -> int:
    """Run the engine and the workers until a signal stops them; the exit status."""
    prepare_process(settings, log_level, runs_models=False)
    folder = Path(tempfile.mkdtemp(prefix="mmserver-engine-"))  # mode 0700
    socket_path = str(folder / "engine.sock")
    stopping = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stopping.append(signum))
    engine = workers = None
    try:
        engine, answer = _start_engine(settings, socket_path, log_level, None, stopping)
        if answer is None or answer[0] != ModelStatus.READY:
            reason = "it stopped" if answer is None else answer[1]
            log.error("mmserver: cannot start: the engine did not start: %s", reason)
            return 1
        workers = [CONTEXT.Process(target=_run_worker, name=f"mmserver-http-{index}",
                                   args=(settings, socket_path, index, log_level))
                   for index in range(settings.http_workers)]
        for worker in workers:
            worker.start()
        host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
        grpc = f", gRPC on {host}:{settings.grpc_port}" if settings.grpc_port else ""
        print(f"mmserver ready on http://{host}:{settings.port}{grpc} ({answer[1]}): "
              f"{len(workers)} HTTP workers over one engine (pid {engine.pid})", flush=True)
        restart = None
        while not stopping:
            ended = wait([engine.sentinel, *(w.sentinel for w in workers)], timeout=0.5)
            if not ended:
                continue
            if engine.sentinel not in ended:
                gone = next(w for w in workers if w.sentinel in ended)
                log.error("%s (pid %d) ended with %s; stopping the server", gone.name,
                          gone.pid, gone.exitcode)
                return 1
            replaced = _replace_engine(engine, restart, settings, socket_path, log_level,
                                       stopping)
            if replaced is None:
                return 1
            engine, restart = replaced
        return 0
    finally:
        _stop(settings, workers or [], engine)
        shutil.rmtree(folder, ignore_errors=True)


def _replace_engine(engine, restart: Restart | None, settings: Settings, socket_path: str,
                    log_level: str, stopping: list):
    """After ``engine`` died: a new engine that serves and the ``Restart`` it was given, or
    None when the server must end (an engine died before serving with no load under way).
    A new engine that dies while loading again is replaced in turn, less the model it was
    loading. A signal meanwhile returns the engine as it is, for the shutdown."""
    served = True
    while not stopping:
        engine.join()
        cause = cause_of_end(engine.exitcode)
        restart = after_death(restart, journal_beside(socket_path).read(), served, cause)
        if restart is None:
            log.error("the engine (pid %d) died before it served (%s), loading no model; "
                      "stopping the server", engine.pid, cause)
            return None
        log.error("the engine (pid %d) died (%s); starting another to load again %d model(s)%s",
                  engine.pid, cause, len(restart.restore), "".join(
                      f"; {name!r} stays unloaded: {failure.reason}"
                      for name, failure in restart.failed.items()))
        engine, answer = _start_engine(settings, socket_path, log_level, restart, stopping)
        served = answer is not None and answer[0] == ModelStatus.READY
        if served:
            log.warning("a new engine (pid %d) serves, restart %d", engine.pid,
                        restart.restarts)
            break
    return engine, restart


def after_death(previous: Restart | None, state: State, served: bool, cause: str
                ) -> Restart | None:
    """What the next engine loads and leaves unloaded, from the dead engine's journal.

    ``served``: the dead engine had said it was ready. Before that, it was still loading
    the models ``previous`` gave it, which its journal does not hold yet. None when it died
    before it served with no load under way: another would most likely die the same way.
    """
    if not served and not state.loading:
        return None
    held = state.held if served or previous is None else previous.restore
    failed = dict(state.failed) if served or previous is None else \
        {**previous.failed, **state.failed}
    for name, url in state.loading:
        failed[name] = Failure(url, f"the engine process died ({cause}) while it was loading "
                                    "this model, so it is not loaded again; load it (POST "
                                    "/models) once its cause is fixed")
    return Restart(restore=tuple((name, url) for name, url in held if name not in failed),
                   failed=failed, restarts=(previous.restarts if previous else 0) + 1)


def _start_engine(settings: Settings, socket_path: str, log_level: str,
                  restart: Restart | None, stopping: list):
    """A started engine and its first word (see :func:`wait_ready`). A new engine after a
    restart loads what ``restart`` says, not ``--preload``."""
    if restart is not None:
        settings = dataclasses.replace(settings, preload=())
    engine, ready = spawn_engine(settings, socket_path, log_level, restart,
                                 service=LocalService)
    return engine, wait_ready(engine, ready, stopping)


def _run_worker(settings: Settings, socket_path: str, index: int, log_level: str) -> None:
    """An HTTP worker's main: the aiohttp host over the engine, sharing the port."""
    prepare_process(settings, log_level, runs_models=False)
    # The worker's own drain ends within its share, a little before the supervisor kills it.
    settings = dataclasses.replace(settings, shutdown_timeout_seconds=(
        settings.shutdown_timeout_seconds * WORKERS_SHARE * WORKER_DRAIN_SHARE))
    app = create_app(settings, EngineService(settings, socket_path), worker=index)
    if settings.grpc_port:
        attach_grpc(app, app[SERVICE], settings, reuse_port=True)
    run_app(app, settings, reuse_port=True)


def _stop(settings: Settings, workers: list, engine) -> None:
    """Workers first (each answers what it accepted), then the engine; then whatever is left
    is killed, so no process outlives the server."""
    budget = settings.shutdown_timeout_seconds
    deadline = time.monotonic() + budget * WORKERS_SHARE
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
    if engine is not None:
        if engine.is_alive():
            engine.terminate()
        engine.join(max(1.0, budget * (1 - WORKERS_SHARE) - 1))
    for process in [*workers, engine]:
        if process is not None and process.is_alive():
            log.warning("%s (pid %d) did not stop in time; killing it", process.name,
                        process.pid)
            process.kill()
            process.join(5)
