"""What every server process does at its start and its end, whoever starts it.

``mmserver serve`` as one process (``cli``), the supervisor of ``--http-workers``, each HTTP
worker and each engine (``engine.supervisor``, ``engine.spawn``) begin and end the same way:
the log, glibc's allocator and torch's threads before any model runs, the event loop, the
aiohttp application served until SIGTERM, and an exit that no abandoned model call can turn
into an abort. One module, below all of them, so none imports another's private start-up.
"""

from __future__ import annotations

import logging
import os
import sys

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from mmserver.allocator import keep_freed_memory_in_heap
from mmserver.config import Settings
from mmserver.resources import usable_cpus
from mmserver.workers import calls_running

ACCESS_LOG_FORMAT = ('%a "%r" %s %b %Tf target_model="%{X-Amzn-SageMaker-Target-Model}i"')


class AccessLog(AbstractAccessLogger):
    """One line per request in :data:`ACCESS_LOG_FORMAT`, built by one %-format.

    aiohttp's ``AccessLogger`` interprets the format per request (a call per field);
    this writes the same line for a third of the cost (about 4 instead of 12 us
    before the logging handler). Nothing is formatted when the logger is not
    enabled for INFO (``--log-level WARNING``).
    """

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        version = request.version
        self.logger.info('%s "%s %s HTTP/%d.%d" %d %d %.6f target_model="%s"',
                         request.remote or "-", request.method, request.path_qs, version.major,
                         version.minor, response.status, response.body_length, time,
                         request.headers.get("X-Amzn-SageMaker-Target-Model", "-"))

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


def prepare_process(settings: Settings, log_level: str, *, runs_models: bool = True) -> None:
    """What a process that serves does first: its log, and, where models run, glibc's
    allocator and torch's threads (before any model runs)."""
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(process)d %(name)s %(message)s")
    if not runs_models:
        return
    if settings.tune_malloc:  # see mmserver/allocator.py
        keep_freed_memory_in_heap()
    if "OMP_NUM_THREADS" not in os.environ:
        import torch
        torch.set_num_threads(intra_op_threads(usable_cpus(), settings.batch.instances))


def exit_past_abandoned_calls() -> None:
    """Exit 0 now, without Python's finalization, if a worker thread is still in a call.

    The drain has answered every accepted request, but a call may still run that no
    request waits for: a load whose client went away or was cut off at the shutdown
    timeout, a batch of disconnected clients, a stuck model. Finalization ends such a
    daemon thread when it next takes the interpreter lock, by unwinding its stack; inside
    torch's C++ that unwinding cannot pass a ``noexcept`` frame, and the C++ runtime
    aborts the whole process ("terminate called without an active exception", exit -6)
    instead of exiting 0. Nothing is left to finalize that matters: the app's cleanup
    has closed the models, the pools and the requirements cache.
    """
    running = calls_running()
    if not running:
        return
    logging.getLogger(__name__).warning(
        "%d call(s) still running in worker threads after the drain (a load or a model call "
        "no request waits for any more); exiting without waiting for them", running)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def intra_op_threads(cpus: int, instances: int) -> int:
    """torch's intra-op threads: the CPUs we may use, divided among the default instances.

    torch keeps one count per process (set in any thread, it changes every thread's), so
    the server's default ``instances`` divides it; ``OMP_NUM_THREADS`` overrides it.
    """
    return max(1, cpus // instances)


def run_app(app: web.Application, settings: Settings, *, reuse_port: bool = False) -> None:
    """Serve ``app`` until SIGTERM or SIGINT; ``reuse_port`` lets other processes bind the
    same port (the HTTP workers)."""
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        reuse_port=reuse_port or None,
        access_log=logging.getLogger("mmserver.access") if settings.access_log else None,
        access_log_class=AccessLog,
        shutdown_timeout=settings.shutdown_timeout_seconds,
        handler_cancellation=True,
        print=None,
        loop=event_loop(settings.uvloop),
    )


def event_loop(uvloop: bool | None = None):
    """uvloop's loop when it is installed and wanted, else None (asyncio's).

    ``uvloop`` defaults to ``Settings.from_env().uvloop`` (``MMSERVER_UVLOOP``). Public so
    that baselines in ``bench/`` can run on the loop mmserver runs on.
    """
    if uvloop is None:
        uvloop = Settings.from_env().uvloop
    if not uvloop:
        return None
    try:
        import uvloop as uvloop_module
    except ImportError:
        return None
    return uvloop_module.new_event_loop()
