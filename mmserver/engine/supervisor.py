"""The process ``mmserver serve --http-workers N`` starts: the engine, then N HTTP workers.

Start-up: the engine loads the preloaded models and says it is ready (or why it
failed, and the server exits 1 as one process would); then the workers bind the port
with ``SO_REUSEPORT`` and connect to the engine's socket, in a folder of its own only
this user may enter.

Shutdown (SIGTERM or SIGINT): the workers first, each finishing the requests it
accepted (aiohttp's graceful stop, within ``MMSERVER_SHUTDOWN_TIMEOUT``), then the
engine, which drains what is left; a process still there past its share of the time is
killed, and the socket's folder removed, so nothing is left behind. A worker or the
engine that ends on its own ends the server (exit 1): a container's restart policy then
starts it afresh.
"""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import signal
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path

from mmserver.config import Settings

log = logging.getLogger(__name__)

#: Processes are spawned, not forked: the parent has imported torch, whose threads a fork
#: would copy in a state the child cannot use.
CONTEXT = multiprocessing.get_context("spawn")
#: Of the shutdown timeout, the share the workers get; the engine drains in the rest.
WORKERS_SHARE = 0.6


def serve_with_workers(settings: Settings, log_level: str) -> int:
    """Run the engine and the workers until a signal stops them; the exit status."""
    from mmserver.cli import prepare_process

    prepare_process(settings, log_level, runs_models=False)
    folder = Path(tempfile.mkdtemp(prefix="mmserver-engine-"))  # mode 0700
    socket_path = str(folder / "engine.sock")
    stopping = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stopping.append(signum))
    engine = workers = None
    try:
        engine, ready = _start_engine(settings, socket_path, log_level)
        answer = _wait_ready(engine, ready, stopping)
        if answer is None or answer[0] != "ready":
            reason = "it stopped" if answer is None else answer[1]
            log.error("mmserver: cannot start: the engine did not start: %s", reason)
            return 1
        workers = [CONTEXT.Process(target=_run_worker, name=f"mmserver-http-{index}",
                                   args=(settings, socket_path, index, log_level))
                   for index in range(settings.http_workers)]
        for worker in workers:
            worker.start()
        host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
        print(f"mmserver ready on http://{host}:{settings.port} ({answer[1]}): "
              f"{len(workers)} HTTP workers over one engine (pid {engine.pid})", flush=True)
        processes = [engine, *workers]
        while not stopping:
            ended = wait([p.sentinel for p in processes], timeout=0.5)
            if ended:
                gone = next(p for p in processes if p.sentinel in ended)
                log.error("%s (pid %d) ended with %s; stopping the server", gone.name,
                          gone.pid, gone.exitcode)
                return 1
        return 0
    finally:
        _stop(settings, workers or [], engine)
        shutil.rmtree(folder, ignore_errors=True)


def _start_engine(settings: Settings, socket_path: str, log_level: str):
    from mmserver.engine.engine import run_engine

    ready, engine_end = CONTEXT.Pipe(duplex=False)
    engine = CONTEXT.Process(target=run_engine, name="mmserver-engine",
                             args=(settings, socket_path, engine_end, log_level))
    engine.start()
    engine_end.close()
    return engine, ready


def _wait_ready(engine, ready, stopping: list) -> tuple[str, str] | None:
    """The engine's first word, or None when it ended (or a signal came) first."""
    while not stopping:
        if ready.poll(0.2):
            try:
                return ready.recv()
            except EOFError:
                return None
        if not engine.is_alive():
            return None
    return None


def _run_worker(settings: Settings, socket_path: str, index: int, log_level: str) -> None:
    """An HTTP worker's main: the aiohttp host over the engine, sharing the port."""
    from mmserver.cli import _run, prepare_process
    from mmserver.engine.client import EngineService
    from mmserver.http.app import create_app

    prepare_process(settings, log_level, runs_models=False)
    _run(create_app(settings, EngineService(settings, socket_path), worker=index), settings,
         reuse_port=True)


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
