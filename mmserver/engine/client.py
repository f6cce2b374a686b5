"""An HTTP worker's :class:`~mmserver.http.service.ModelService`: the engine, over its socket.

Every operation is one message to the engine and its answer (``engine``); a domain
error raised there is raised here, so the worker answers the same status and body as
one process would. The worker itself reads and bounds an invocation's body (the payload
limit, 413; the body timeout, 408) before it sends it, and counts each invocation in the
engine's metrics, so ``/metrics`` from any worker shows every worker's requests.

If the engine's connection ends (the engine stopped or died), every operation waiting
on it and every later one answers 503 (:class:`~mmserver.errors.EngineUnavailable`) at
once; none waits for an answer that cannot come. Meanwhile the worker tries to connect
again every :data:`RECONNECT_SECONDS`: the socket accepts once the supervisor's new
engine has loaded the models again, and from then on the worker serves as before.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from mmserver import errors
from mmserver.config import Settings
from mmserver.engine.channel import Channel, connect
from mmserver.http.service import Call
from mmserver.loaded_model import ModelInfo, ModelStatus
from mmserver.pipeline import Answer, check_payload_size, read_whole_body
from mmserver.wires import ToolkitHeaders, V2Headers

#: While the engine is gone, the pause between the worker's attempts to reach a new one.
RECONNECT_SECONDS = 0.1


@dataclasses.dataclass(frozen=True)
class Listed:
    """A model as a listing names it, across the process boundary."""

    name: str
    url: str


class EngineService:
    """The models of an engine process, as one HTTP worker (or the process that holds an
    isolated model) reaches them. ``holds`` names them in errors."""

    def __init__(self, settings: Settings, socket_path: str, holds: str = "the models"):
        self.settings = settings
        self.socket_path = socket_path
        self._restarting = (f"the engine process that holds {holds} ended; the server is "
                            f"starting another, which loads {holds} again: retry shortly")
        self._died = (f"the engine process that held {holds} ended while it ran this "
                      f"request; the server is starting another, which loads {holds} again")
        self._channel: Channel | None = None
        self._waiting: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._reading: asyncio.Task | None = None
        self._lost: str | None = None

    # -- the connection ------------------------------------------------------------------

    async def start(self) -> None:
        self._channel = await connect(self.socket_path)
        self._reading = asyncio.create_task(self._stay_connected())

    async def close(self, timeout: float | None = None) -> None:
        """On SIGTERM: wait (at most ``timeout`` s, by default the shutdown timeout) for the
        engine's answers to the requests this worker accepted, then disconnect; a request
        still waiting then is answered 503."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.settings.shutdown_timeout_seconds if timeout is None
                                  else timeout)
        while self._waiting and self._lost is None and loop.time() < deadline:
            await asyncio.wait(list(self._waiting.values()),
                               timeout=min(0.5, deadline - loop.time()))
        if self._reading is not None:
            self._reading.cancel()
        self._fail_waiting()
        if self._channel is not None:
            self._channel.close()

    def _fail_waiting(self) -> None:
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(errors.EngineUnavailable(self._died))
        self._waiting.clear()

    async def _stay_connected(self) -> None:
        while True:
            await self._read_answers()
            self._lost = self._restarting
            self._fail_waiting()
            self._channel.close()
            while True:
                await asyncio.sleep(RECONNECT_SECONDS)
                try:
                    self._channel = await connect(self.socket_path)
                    break
                except OSError:
                    continue
            self._lost = None

    async def _read_answers(self) -> None:
        """Settle each answer's waiting operation, until the connection ends."""
        try:
            while True:
                request_id, ok, value = await self._channel.receive()
                waiting = self._waiting.pop(request_id, None)
                if waiting is None or waiting.done():
                    continue  # its client went away
                if ok:
                    waiting.set_result(value)
                elif value is None:
                    waiting.set_exception(RuntimeError("the engine failed the operation; "
                                                       "see its log"))
                else:
                    waiting.set_exception(value)
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    async def _ask(self, operation: str, *arguments: Any) -> Any:
        if self._lost is not None:
            raise errors.EngineUnavailable(self._lost)
        request_id = next(self._ids)
        waiting = self._waiting[request_id] = asyncio.get_running_loop().create_future()
        try:
            self._channel.send((request_id, operation, arguments))
            return await waiting
        except asyncio.CancelledError:
            if self._lost is None:  # the client went away: the engine stops the work too
                self._channel.send(("cancel", request_id))
            raise
        finally:
            self._waiting.pop(request_id, None)

    def count_invocation(self, name: str, status: int, seconds: float) -> None:
        """One invocation answered by this worker, into the engine's metrics."""
        if self._lost is None and self._channel is not None:
            self._channel.send(("count", name, status, seconds))

    # -- the ModelService's operations ---------------------------------------------------------

    async def load(self, name: str, url: str) -> Listed:
        return await self._ask("load", name, url)

    async def page(self, limit: int | None, next_page_token: str | None
                   ) -> tuple[Sequence[Listed], str | None]:
        return await self._ask("page", limit, next_page_token)

    async def describe(self, name: str) -> dict[str, object]:
        return await self._ask("describe", name)

    async def unload(self, name: str) -> None:
        await self._ask("unload", name)

    async def invoke(self, name: str, headers: ToolkitHeaders | V2Headers, call: Call
                     ) -> Answer:
        if call.content_length is not None:
            check_payload_size(call.content_length, self.settings.max_payload_bytes)
        body = await read_whole_body(call.read_body, call.body_arrived, self.settings)
        return await self._ask("invoke", name, headers, body)

    async def status(self, name: str) -> ModelStatus:
        return await self._ask("status", name)

    async def model_metadata(self, name: str) -> dict[str, object]:
        return await self._ask("model_metadata", name)

    async def model_config(self, name: str) -> dict[str, object]:
        return await self._ask("model_config", name)

    async def model_statistics(self, name: str | None) -> list[dict[str, object]]:
        return await self._ask("model_statistics", name)

    async def index(self) -> list[ModelInfo]:
        return await self._ask("index")

    async def load_folder(self, name: str) -> None:
        await self._ask("load_folder", name)

    async def exposition(self) -> bytes:
        return await self._ask("exposition")
