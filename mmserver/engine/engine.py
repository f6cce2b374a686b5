"""The engine process: every model of the server, serving the HTTP workers' operations.

It is ``mmserver serve`` without HTTP: a :class:`~mmserver.http.local.LocalService`
(the registry, the runners, the pipeline, the metrics) behind a Unix socket. Each
worker keeps one connection, whose messages are ``engine.messages``' kinds: an ``Ask``
names one of the operations (:data:`~mmserver.engine.messages.OPERATIONS`, the
``ModelService``'s methods) and is answered ``Result`` or ``Failed`` (a domain error), out
of order, as operations finish. Results are plain data (a listing's names and urls, a
describe answer, an invocation's encoded answer), never a model. ``Count`` messages carry
the workers' invocation counts into the one set of metrics (no answer).

A ``Rows`` message is an invocation the worker decoded itself (``engine.client``): its
rows lie in the connection's shared memory (``engine.shared``); the engine copies them
out, enqueues them straight into the model's runner, and answers with a descriptor of
the answer's rows, written into the other arena, for the worker to encode. Notices tell
the workers when a model's codecs change (loaded, unloaded) and when its runner starts or
stops refusing, so that a worker refuses a full queue's requests before reading them.

The engine keeps a :class:`~mmserver.engine.journal.Journal` of the models it holds
and loads, so that if it dies the supervisor can start another that loads them again
(:class:`~mmserver.engine.journal.Restart`); describe answers say which engine serves a
model and how many died before it, and a model that killed an engine while loading is
described as ``failed``, with the reason, until it is loaded again or deleted.

SIGTERM closes the socket and answers every accepted request (the registry's drain);
SIGINT is ignored, as the supervisor decides when the engine stops (after the workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path

from prometheus_client import Counter

from mmserver import heap
from mmserver.config import Settings
from mmserver.engine.channel import serve
from mmserver.engine.client import Listed
from mmserver.engine.journal import Failure, Journal, Restart, journal_beside
from mmserver.engine.messages import OPERATIONS
from mmserver.engine.workers import Workers
from mmserver.errors import MMServerError
from mmserver.handler.requirements import take_installed
from mmserver.http import answers
from mmserver.http.service import Call
from mmserver.model_info import ModelInfo
from mmserver.pipeline import Answer
from mmserver.process import event_loop, exit_past_abandoned_calls, prepare_process
from mmserver.status import ModelStatus
from mmserver.wires import ToolkitHeaders, V2Headers

log = logging.getLogger(__name__)

#: prctl's option that sends a signal to this process when its parent ends (linux/prctl.h).
PR_SET_PDEATHSIG = 1


class EngineOperations:
    """What a worker may ask of the engine, where it differs from the service's own method
    of the same name (:func:`dispatch_table`): results as plain data, the journal."""

    def __init__(self, service, journal: Journal, restart: Restart | None):
        #: The engine's service (``http.local.LocalService``: its models, registry, metrics).
        self.service = service
        self.journal = journal
        self.restarts = restart.restarts if restart else 0
        #: Models that killed an engine while loading (module docstring).
        service.failed.update(restart.failed if restart else {})
        service.on_change = self.record
        self._loading: dict[str, str] = {}

    def record(self) -> None:
        """Write the journal: what this engine holds and is loading, and what failed."""
        self.journal.write([(m.name, m.url) for m in self.service.registry.ready()],
                           list(self._loading.items()), self.service.failed)

    @contextlib.contextmanager
    def loading(self, name: str, url: str):
        """A load under way, in the journal until it ends. A second load of a name being
        loaded (refused, 409) leaves the first one's entry."""
        first = name not in self._loading
        if first:
            self._loading[name] = url
            self.record()
        try:
            yield
        finally:
            if first:
                del self._loading[name]
                self.record()

    async def restore(self, models: tuple[tuple[str, str], ...]) -> None:
        """Load again what the engine before this one held; a model that no longer loads
        is marked failed, not fatal to the others (the caller records the outcome)."""
        for name, url in models:
            if any(model.name == name for model in self.service.registry.ready()):
                continue  # single-model mode's model, loaded by the start-up
            try:
                with self.loading(name, url):
                    await self.service.load(name, url)
            except MMServerError as error:
                self.service.failed[name] = Failure(
                    url, f"it did not load again after the engine process was restarted: {error}")

    async def load(self, name: str, url: str) -> Listed:
        with self.loading(name, url):
            model = await self.service.load(name, url)
        return Listed(model.name, model.url)

    async def page(self, limit: int | None, token: str | None
                   ) -> tuple[list[Listed], str | None]:
        models, next_token = await self.service.page(limit, token)
        return [Listed(m.name, m.url) for m in models], next_token

    async def describe(self, name: str) -> dict[str, object]:
        """The service's answer, naming this engine unless the model has one of its own."""
        return answers.described_in_engine(await self.service.describe(name), os.getpid(),
                                           self.restarts)

    async def unload(self, name: str) -> None:
        await self.service.unload(name)
        self.record()

    async def invoke(self, name: str, headers: ToolkitHeaders | V2Headers, body: bytes
                     ) -> Answer:
        return await self.service.invoke(name, headers, _arrived(body))

    async def index(self) -> list[ModelInfo]:
        return [ModelInfo(info.name, info.url, info.status)
                for info in await self.service.index()]

    async def load_folder(self, name: str) -> None:
        with self.loading(name, name):
            await self.service.load_folder(name)


def dispatch_table(operations: EngineOperations) -> dict[str, Callable[..., Awaitable]]:
    """Each operation a worker may ask (:data:`~mmserver.engine.messages.OPERATIONS`, derived
    from the ``ModelService`` protocol), and what answers it: ``operations``' method of that
    name where it has one, else the service's own. Nothing else is reachable."""
    return {name: getattr(operations, name, None) or getattr(operations.service, name)
            for name in OPERATIONS}


def _arrived(body: bytes) -> Call:
    """The body a worker read (within the limit and the body timeout), as a request."""

    async def read_body(limit: int) -> bytes:
        return body

    return Call(params={}, query={}, headers={}, content_length=len(body),
                read_body=read_body, body_arrived=True)


def run_engine(service: type, settings: Settings, socket_path: str, ready: Connection,
               log_level: str, restart: Restart | None = None, parent_pid: int | None = None,
               packages: Path | None = None) -> None:
    """The engine process's main: load the preloaded models (or, after a restart, the models
    the dead engine held), then serve the socket.

    ``service``: the class of the service the engine holds (``http.local.LocalService``),
    given by whoever starts the engine (``engine.spawn``), so that this module, which an
    isolated model's start reaches, imports no service. Sends ``(ModelStatus.READY, device)``
    on ``ready`` once it serves, or ``(ModelStatus.FAILED, message)``.
    ``parent_pid``: this is an isolated model's engine (``engine.isolated``): it dies with
    that process, and holds its models itself, isolating none further. ``packages``: its
    model's ``code/requirements.txt`` as the parent installed it, put first on this
    process's path when the model loads (``loader``), not installed again.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is not None:
        _die_with(parent_pid)
    if packages is not None:
        take_installed(packages)
    prepare_process(settings, log_level)
    loop = event_loop(settings.uvloop) or asyncio.new_event_loop()
    try:
        loop.run_until_complete(_main(service, settings, socket_path, ready, restart,
                                      isolating=parent_pid is None))
    except MMServerError as error:
        ready.send((ModelStatus.FAILED, str(error)))
        sys.exit(1)
    exit_past_abandoned_calls()


def _die_with(parent_pid: int) -> None:
    """Be killed when ``parent_pid`` ends (Linux's ``PR_SET_PDEATHSIG``), so that no engine
    outlives a server that was killed; exit now if it already has."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


async def _main(service_type: type, settings: Settings, socket_path: str, ready: Connection,
                restart: Restart | None, *, isolating: bool = True) -> None:
    service = service_type(settings, isolating=isolating)
    operations = EngineOperations(service, journal_beside(socket_path), restart)
    Counter("mmserver_engine_restarts", "Engine processes that died and were replaced "
            "since the server started (--http-workers).",
            registry=service.metrics.registry).inc(operations.restarts)
    operations.record()
    await service.start()
    if restart is not None:
        await operations.restore(restart.restore)
    operations.record()
    heap.settle()
    workers = Workers(dispatch_table(operations), service)
    service.model_listeners.append(workers.model_changed)
    for model in service.registry.ready():  # loaded before anyone listened
        workers.model_changed(model, True)
    accepting = await serve(socket_path, workers.connected)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ready.send((ModelStatus.READY, str(service.registry.device)))
    log.info("engine %d serving %d model(s)", os.getpid(), len(service.registry.ready()))
    await stop.wait()
    accepting.cancel()
    await service.close()
    workers.close()
