"""The engine process: every model of the server, serving the HTTP workers' operations.

It is ``mmserver serve`` without HTTP: a :class:`~mmserver.http.local.LocalService`
(the registry, the runners, the pipeline, the metrics) behind a Unix socket. Each
worker keeps one connection; each message is ``(id, operation, arguments)`` and is
answered ``(id, True, result)`` or ``(id, False, domain error)``, out of order, as
operations finish. Results are plain data (a listing's names and urls, a describe
answer, an invocation's encoded answer), never a model. ``count`` messages carry the
workers' invocation counts into the one set of metrics (no answer).

SIGTERM closes the socket and answers every accepted request (the registry's drain);
SIGINT is ignored, as the supervisor decides when the engine stops (after the workers).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
from multiprocessing.connection import Connection

from mmserver.config import Settings
from mmserver.engine.channel import Channel
from mmserver.errors import MMServerError
from mmserver.http.local import LocalService
from mmserver.http.service import Call
from mmserver.loaded_model import ModelInfo
from mmserver.pipeline import Answer
from mmserver.wires import ToolkitHeaders, V2Headers

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Listed:
    """A model as a listing names it, across the process boundary."""

    name: str
    url: str


class EngineOperations:
    """What a worker may ask of the engine: the ModelService's operations, in plain data."""

    def __init__(self, service: LocalService):
        self.service = service

    async def load(self, name: str, url: str) -> Listed:
        model = await self.service.load(name, url)
        return Listed(model.name, model.url)

    async def page(self, limit: int | None, token: str | None
                   ) -> tuple[list[Listed], str | None]:
        models, next_token = await self.service.page(limit, token)
        return [Listed(m.name, m.url) for m in models], next_token

    async def describe(self, name: str) -> dict[str, object]:
        return await self.service.describe(name)

    async def unload(self, name: str) -> None:
        await self.service.unload(name)

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
        await self.service.load_folder(name)

    async def exposition(self) -> bytes:
        return await self.service.exposition()


def _arrived(body: bytes) -> Call:
    """The body a worker read (within the limit and the body timeout), as a request."""

    async def read_body(limit: int) -> bytes:
        return body

    return Call(params={}, query={}, headers={}, content_length=len(body),
                read_body=read_body, body_arrived=True)


#: The operations a worker may name (nothing else of the object is reachable).
OPERATIONS = frozenset(name for name in vars(EngineOperations) if not name.startswith("_"))


async def serve_connection(operations: EngineOperations, channel: Channel) -> None:
    """Answer one worker's messages until it disconnects."""
    tasks: set[asyncio.Task] = set()
    try:
        while True:
            message = await channel.receive()
            if message[0] == "count":
                _, name, status, seconds = message
                operations.service.metrics.request_done(name, status, seconds)
                continue
            task = asyncio.create_task(_answer(operations, channel, *message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass  # the worker stopped; what it had asked still runs, and is answered to no one
    finally:
        channel.close()


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


def run_engine(settings: Settings, socket_path: str, ready: Connection, log_level: str) -> None:
    """The engine process's main: load the preloaded models, then serve the socket.

    Sends ``("ready", device)`` on ``ready`` once it serves, or ``("failed", message)``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from mmserver.cli import event_loop, prepare_process  # the same start-up as one process

    prepare_process(settings, log_level)
    loop = event_loop(settings.uvloop) or asyncio.new_event_loop()
    try:
        loop.run_until_complete(_main(settings, socket_path, ready))
    except MMServerError as error:
        ready.send(("failed", str(error)))
        sys.exit(1)


async def _main(settings: Settings, socket_path: str, ready: Connection) -> None:
    service = LocalService(settings)
    operations = EngineOperations(service)
    await service.start()
    connections: set[asyncio.Task] = set()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        connections.add(task)
        try:
            await serve_connection(operations, Channel(reader, writer))
        finally:
            connections.discard(task)

    server = await asyncio.start_unix_server(connected, path=socket_path, limit=2**20)
    os.chmod(socket_path, 0o600)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ready.send(("ready", str(service.registry.device)))
    log.info("engine %d serving %d model(s)", os.getpid(), len(service.registry.ready()))
    await stop.wait()
    server.close()
    await service.close()
    for task in connections:
        task.cancel()
