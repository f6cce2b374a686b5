"""The engine process: every model of the server, serving the HTTP workers' operations.

It is ``mmserver serve`` without HTTP: a :class:`~mmserver.http.local.LocalService`
(the registry, the runners, the pipeline, the metrics) behind a Unix socket. Each
worker keeps one connection; each message is ``(id, operation, arguments)`` and is
answered ``(id, True, result)`` or ``(id, False, domain error)``, out of order, as
operations finish. Results are plain data (a listing's names and urls, a describe
answer, an invocation's encoded answer), never a model. ``count`` messages carry the
workers' invocation counts into the one set of metrics (no answer).

A ``rows`` message is an invocation the worker decoded itself (``engine.client``): its
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
from multiprocessing.connection import Connection

from prometheus_client import Counter

from mmserver.batching import ModelRunner
from mmserver.batching.execution import QueuedRequest
from mmserver.config import Settings
from mmserver.engine.channel import Channel, serve
from mmserver.engine.client import (
    ADMISSION,
    CANCEL,
    CHANGED,
    COUNT,
    FREE,
    NOTICE,
    REFUSED,
    ROWS,
    CodecsChanged,
    Listed,
)
from mmserver.engine.journal import Failure, Journal, Restart, journal_beside
from mmserver.engine.shared import pack, unpack
from mmserver.errors import InvocationTimeout, MMServerError, QueueFull
from mmserver.http.local import LocalService
from mmserver.http.service import Call
from mmserver.loaded_model import LoadedModel, ModelInfo
from mmserver.pipeline import Answer
from mmserver.wires import ToolkitHeaders, V2Headers

log = logging.getLogger(__name__)

#: prctl's option that sends a signal to this process when its parent ends (linux/prctl.h).
PR_SET_PDEATHSIG = 1


class EngineOperations:
    """What a worker may ask of the engine: the ModelService's operations, in plain data."""

    def __init__(self, service: LocalService, journal: Journal, restart: Restart | None):
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
        return {"engine": self._engine(), **await self.service.describe(name)}

    def _engine(self) -> dict[str, int]:
        return {"pid": os.getpid(), "restarts": self.restarts}

    async def unload(self, name: str) -> None:
        await self.service.unload(name)
        self.record()

    async def invoke(self, name: str, headers: ToolkitHeaders | V2Headers, body: bytes
                     ) -> Answer:
        return await self.service.invoke(name, headers, _arrived(body))

    async def status(self, name: str):
        return await self.service.status(name)

    async def model_metadata(self, name: str) -> dict[str, object]:
        return await self.service.model_metadata(name)

    async def model_config(self, name: str) -> dict[str, object]:
        return await self.service.model_config(name)

    async def model_statistics(self, name: str | None) -> list[dict[str, object]]:
        return await self.service.model_statistics(name)

    async def index(self) -> list[ModelInfo]:
        return [ModelInfo(info.name, info.url, info.status)
                for info in await self.service.index()]

    async def load_folder(self, name: str) -> None:
        with self.loading(name, name):
            await self.service.load_folder(name)

    async def exposition(self) -> bytes:
        return await self.service.exposition()

    async def row_codecs(self, name: str):
        return await self.service.row_codecs(name)


def _arrived(body: bytes) -> Call:
    """The body a worker read (within the limit and the body timeout), as a request."""

    async def read_body(limit: int) -> bytes:
        return body

    return Call(params={}, query={}, headers={}, content_length=len(body),
                read_body=read_body, body_arrived=True)


#: The operations a worker may name (nothing else of the object is reachable).
OPERATIONS = frozenset(("load", "page", "describe", "unload", "invoke", "status", "model_metadata",
                        "model_config", "model_statistics", "index", "load_folder",
                        "exposition", "row_codecs"))


class WorkerConnection:
    """One worker's channel: its messages (``client`` spells them), answered as they finish.

    An operation runs as a task of its own. Rows (an invocation the worker decoded) take no
    task: they are queued in the model's runner as their message is read, and the runner's
    answer is written into the connection's answer arena from the request's own callback,
    so a burst of requests costs the engine a few calls each. Every ``rows`` message gets
    exactly one reply, whatever happens to it, so that the worker knows when its region of
    shared memory is free again (the rows were copied out on arrival).

    A ``cancel`` notice (the worker's client went away, so aiohttp cancelled its handler)
    cancels that operation here too, as one process cancels it: a queued invocation
    leaves the queue uncomputed.
    """

    def __init__(self, operations: EngineOperations, channel: Channel):
        self.operations = operations
        self.service = operations.service
        self.channel = channel
        self._tasks: dict[int, asyncio.Task] = {}
        self._queued: dict[int, tuple[QueuedRequest, ModelRunner]] = {}

    def on_messages(self, messages: list) -> None:
        for message in messages:
            kind = message[0]
            if kind == ROWS:
                self._rows(*message[1:])
            elif kind == FREE:
                self.channel.outgoing.free(message[1])
            elif kind == COUNT:
                self.service.metrics.request_done(*message[1:])
            elif kind == CANCEL:
                self._cancel(message[1])
            elif kind == REFUSED:
                self.service.count_refusal(message[1])
            else:
                request_id = kind
                task = self._tasks[request_id] = asyncio.create_task(
                    _answer(self.operations, self.channel, *message))
                task.add_done_callback(
                    lambda _, request_id=request_id: self._tasks.pop(request_id, None))

    def _cancel(self, request_id: int) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()
        queued = self._queued.get(request_id)
        if queued is not None:
            request, runner = queued
            runner.withdraw(request)

    def _rows(self, request_id: int, name: str, generation: int, descriptor) -> None:
        channel = self.channel
        try:
            model = self.service.serving(name)
            if getattr(model, "generation", None) != generation:
                raise CodecsChanged(f"model {name!r} was loaded again")
            request = self.service.pipeline.submit(
                model, unpack(descriptor, channel.incoming, copy=True))
        except MMServerError as error:
            channel.send((request_id, False, error))
            return
        except Exception:  # noqa: BLE001 - the worker answers 500; the cause stays in this log
            log.exception("engine: queueing rows for model %s failed", name)
            channel.send((request_id, False, None))
            return
        self._queued[request_id] = (request, model.runner)
        request.future.add_done_callback(
            lambda future: self._answer_rows(request_id, model, future))

    def _answer_rows(self, request_id: int, model: LoadedModel, future: asyncio.Future
                     ) -> None:
        self._queued.pop(request_id, None)
        channel = self.channel
        if channel.closed:
            return
        if future.cancelled():
            channel.send((request_id, False, None))  # the worker gave up; its region is free
            return
        error = future.exception()
        if error is None:
            try:
                answer = pack(future.result(), channel.outgoing)
            except Exception:  # noqa: BLE001 - as any failed operation
                log.exception("engine: answering rows of model %s failed", model.name)
                channel.send((request_id, False, None))
            else:
                channel.send((request_id, True, answer))
            return
        if isinstance(error, InvocationTimeout):
            error = self.service.pipeline.timed_out(model.name)
        channel.send((request_id, False, error if isinstance(error, MMServerError) else None))


class Workers:
    """The engine's connections, and what it tells all of them: a model was loaded or
    unloaded (forget its codecs), or its queue filled or has room again (refuse, or stop
    refusing, before reading a body)."""

    def __init__(self, operations: EngineOperations):
        self.operations = operations
        self._connections: set[WorkerConnection] = set()

    def connected(self, channel: Channel):
        connection = WorkerConnection(self.operations, channel)
        self._connections.add(connection)
        channel.lost.add_done_callback(lambda _: self._connections.discard(connection))
        return connection.on_messages

    def tell(self, message: tuple) -> None:
        for connection in self._connections:
            connection.channel.send(message)

    def model_changed(self, model, loaded: bool) -> None:
        self.tell((NOTICE, CHANGED, model.name, None))
        if loaded and isinstance(model, LoadedModel):
            model.runner.watch_admission(
                lambda refusal, name=model.name: self.tell((NOTICE, ADMISSION, name, (
                    refusal if isinstance(refusal, QueueFull) else None))))

    def close(self) -> None:
        for connection in list(self._connections):
            connection.channel.close()


async def _answer(operations: EngineOperations, channel: Channel, request_id: int,
                  operation: str, arguments: tuple) -> None:
    try:
        if operation not in OPERATIONS:
            raise MMServerError(f"the engine has no operation {operation!r}")
        result = await getattr(operations, operation)(*arguments)
    except MMServerError as error:
        channel.send((request_id, False, error))
    except Exception:  # noqa: BLE001 - the worker answers 500; the cause stays in this log
        log.exception("engine operation %s failed", operation)
        channel.send((request_id, False, None))
    else:
        channel.send((request_id, True, result))


def run_engine(settings: Settings, socket_path: str, ready: Connection, log_level: str,
               restart: Restart | None = None, parent_pid: int | None = None) -> None:
    """The engine process's main: load the preloaded models (or, after a restart, the models
    the dead engine held), then serve the socket.

    Sends ``("ready", device)`` on ``ready`` once it serves, or ``("failed", message)``.
    ``parent_pid``: this is an isolated model's engine (``engine.isolated``): it dies with
    that process, and holds its models itself, isolating none further.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is not None:
        _die_with(parent_pid)
    from mmserver.cli import (  # the same start-up and exit as one process
        event_loop,
        exit_past_abandoned_calls,
        prepare_process,
    )

    prepare_process(settings, log_level)
    loop = event_loop(settings.uvloop) or asyncio.new_event_loop()
    try:
        loop.run_until_complete(_main(settings, socket_path, ready, restart,
                                      isolating=parent_pid is None))
    except MMServerError as error:
        ready.send(("failed", str(error)))
        sys.exit(1)
    exit_past_abandoned_calls()


def _die_with(parent_pid: int) -> None:
    """Be killed when ``parent_pid`` ends (Linux's ``PR_SET_PDEATHSIG``), so that no engine
    outlives a server that was killed; exit now if it already has."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


async def _main(settings: Settings, socket_path: str, ready: Connection,
                restart: Restart | None, *, isolating: bool = True) -> None:
    service = LocalService(settings, isolating=isolating)
    operations = EngineOperations(service, journal_beside(socket_path), restart)
    Counter("mmserver_engine_restarts", "Engine processes that died and were replaced "
            "since the server started (--http-workers).",
            registry=service.metrics.registry).inc(operations.restarts)
    operations.record()
    await service.start()
    if restart is not None:
        await operations.restore(restart.restore)
    operations.record()
    workers = Workers(operations)
    service.model_listeners.append(workers.model_changed)
    for model in service.registry.ready():  # loaded before anyone listened
        workers.model_changed(model, True)
    accepting = await serve(socket_path, workers.connected)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ready.send(("ready", str(service.registry.device)))
    log.info("engine %d serving %d model(s)", os.getpid(), len(service.registry.ready()))
    await stop.wait()
    accepting.cancel()
    await service.close()
    workers.close()
