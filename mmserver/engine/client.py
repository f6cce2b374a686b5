"""An HTTP worker's :class:`~mmserver.http.service.ModelService`: the engine, over its socket.

Every operation is one message to the engine and its answer (``engine``); a domain
error raised there is raised here, so the worker answers the same status and body as
one process would.

**Invocations of a row-wise model with the default codecs** (every v2 infer request of
one; a SageMaker invocation when the folder defines no ``input_fn``/``output_fn``) are
decoded and encoded *here*, in the worker, with the model's :class:`RowCodecs` (fetched
once per load): the worker refuses what the engine's admission would (the queue full,
the engine's last notice), reads and bounds the body (413, 408), decodes it, writes the
rows into the connection's shared memory (``shared``) and sends the engine a ``Rows``
message of a few dozen bytes; the answer's rows come back the same way, and the worker
encodes them. The ``Rows`` of one turn of the worker's loop leave as one message, and the
engine answers a turn's rows in one ``RowsResult``. Every other invocation (a script's ``input_fn``/``output_fn``, or a model
that is not row-wise) sends the body whole and runs in the engine, where the user's code
lives with its model, as MMS and TorchServe run it.

If the engine's connection ends (the engine stopped or died), every operation waiting
on it and every later one answers 503 (:class:`~mmserver.errors.EngineUnavailable`) at
once; none waits for an answer that cannot come. Meanwhile the worker tries to connect
again every :data:`RECONNECT_SECONDS`: the socket accepts once the supervisor's new
engine has loaded the models again, and from then on the worker serves as before.

The messages are ``engine.messages``' kinds. Every ``ModelService`` method this class
does not write itself (all but :meth:`EngineService.invoke`) is an ``Ask`` of the engine's
operation of that name, made from the protocol (:func:`forwarding`), so a method added
to the protocol answers through workers with no edit here.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import functools
import inspect
import itertools
from collections.abc import Awaitable
from typing import Any

from mmserver import errors
from mmserver.config import Settings
from mmserver.engine.channel import Channel, connect
from mmserver.engine.messages import (
    Admission,
    Ask,
    Cancel,
    Changed,
    Count,
    Failed,
    Free,
    dispatch,
    Refused,
    Result,
    Rows,
    RowsResult,
    Stages,
    service_methods,
)
from mmserver.engine.shared import pack, unpack
from mmserver.handler.folder import RowCodecs
from mmserver.http.service import Call, ModelService
from mmserver.pipeline import (
    Answer,
    Called,
    InvocationPipeline,
    Wire,
    check_payload_size,
    read_whole_body,
)
from mmserver.wires import ToolkitHeaders, V2Headers

#: While the engine is gone, the pause between the worker's attempts to reach a new one.
RECONNECT_SECONDS = 0.1
#: Invocations answered while the engine is lost and kept for the next one's metrics; past
#: it the oldest are dropped (a restart takes seconds, a flood of 503s could be unbounded).
UNCOUNTED_LIMIT = 10_000
#: Past an invocation's own deadline (the engine answers 504 then), how long the worker
#: still waits for the engine's answer before it answers 504 itself.
ANSWER_GRACE_SECONDS = 1.0
_UNKNOWN = object()


class CodecsChanged(errors.RetryLater):
    """Rows decoded with the codecs of a load of the model that is no longer the one loaded;
    the worker fetches the new codecs and decodes again (once; a second time, 503)."""


@dataclasses.dataclass(frozen=True)
class Listed:
    """A model as a listing names it, across the process boundary."""

    name: str
    url: str


def forwarding(protocol: type):
    """A class decorator: each of ``protocol``'s operations (``messages.service_methods``)
    that the class does not write itself becomes an ``Ask`` of the engine's operation of
    that name, with the arguments the protocol declares, bound as a call binds them."""

    def install(cls: type) -> type:
        for name in service_methods(protocol):
            if name not in vars(cls):
                method = _forwarder(name, getattr(protocol, name))
                method.__qualname__ = f"{cls.__qualname__}.{name}"
                setattr(cls, name, method)
        return cls

    return install


def _forwarder(name: str, declared):
    signature = inspect.signature(declared)

    @functools.wraps(declared)
    async def forward(self, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return await self._ask(name, *bound.args[1:])

    return forward


@forwarding(ModelService)
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
        #: Invocations answered while the engine was lost, for the next one's metrics.
        self._uncounted: collections.deque = collections.deque(maxlen=UNCOUNTED_LIMIT)
        #: Per model, its RowCodecs, or None: its bodies go to the engine whole.
        self._codecs: dict[str, RowCodecs | None] = {}
        #: Per model, what its runner refuses now (the engine's last notice).
        self._refusals: dict[str, errors.MMServerError] = {}
        #: Rows sent and not yet answered: where they lie in the requests' arena (or None).
        self._rows_sent: dict[int, int | None] = {}
        #: The worker's own decode threads (large bodies, images), as one process has.
        self._pipeline = InvocationPipeline(settings)
        #: What each kind the engine sends does; any other kind is a protocol error.
        self._handlers = {Result: self._result, RowsResult: self._rows_result,
                          Failed: self._failed, Changed: self._changed,
                          Admission: self._admission}

    # -- the connection ------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """False from the moment the connection to the engine is lost until it is made
        again: a request made meanwhile is answered 503 at once."""
        return self._lost is None

    async def start(self) -> None:
        self._channel = await connect(self.socket_path, self._received)
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
        self._forget_connection()
        if self._channel is not None:
            self._channel.close()
        self._pipeline.close()

    def _forget_connection(self) -> None:
        """The connection ended: fail what waits on it, and drop what it told."""
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(errors.EngineUnavailable(self._died))
        self._waiting.clear()
        self._rows_sent.clear()
        self._codecs.clear()
        self._refusals.clear()

    async def _stay_connected(self) -> None:
        while True:
            await self._channel.lost
            self._lost = self._restarting
            self._forget_connection()
            while True:
                await asyncio.sleep(RECONNECT_SECONDS)
                try:
                    self._channel = await connect(self.socket_path, self._received)
                    break
                except OSError:
                    continue
            self._lost = None
            while self._uncounted:
                self._channel.gather(Count, self._uncounted.popleft())

    def _received(self, messages: list) -> None:
        """The engine's notices and answers, as a read brings them."""
        dispatch(self._handlers, messages, "a worker", "the engine")

    def _changed(self, message: Changed) -> None:
        self._codecs.pop(message.name, None)
        self._refusals.pop(message.name, None)

    def _admission(self, message: Admission) -> None:
        if message.refusal is None:
            self._refusals.pop(message.name, None)
        else:
            self._refusals[message.name] = message.refusal

    def _answered(self, request_id: int) -> asyncio.Future | None:
        """The future a reply settles (None when its client went away), the request's rows
        freed: the engine copied them out when they arrived."""
        if request_id in self._rows_sent:
            region = self._rows_sent.pop(request_id)
            if region is not None:
                self._channel.outgoing.free(region)
        waiting = self._waiting.pop(request_id, None)
        return None if waiting is None or waiting.done() else waiting

    def _result(self, message: Result) -> None:
        waiting = self._answered(message.request_id)
        if waiting is not None:
            waiting.set_result(message.value)

    def _rows_result(self, message: RowsResult) -> None:
        for request_id, descriptor, region, queue_seconds, infer_seconds in message.answers:
            waiting = self._answered(request_id)
            if waiting is not None:
                waiting.set_result((descriptor, region, queue_seconds, infer_seconds))
            elif region is not None:  # nobody reads the answer's rows
                self._channel.gather(Free, region)

    def _failed(self, message: Failed) -> None:
        waiting = self._answered(message.request_id)
        if waiting is None:
            return
        if message.error is None:
            waiting.set_exception(RuntimeError("the engine failed the operation; see its log"))
        else:
            waiting.set_exception(message.error)

    def _request(self) -> tuple[int, asyncio.Future]:
        """A new request's id and the future its answer settles (503 while disconnected)."""
        if self._lost is not None:
            raise errors.EngineUnavailable(self._lost)
        request_id = next(self._ids)
        waiting = self._waiting[request_id] = asyncio.get_running_loop().create_future()
        return request_id, waiting

    async def _await(self, request_id: int, waiting: asyncio.Future) -> Any:
        try:
            return await waiting
        except asyncio.CancelledError:
            if self._lost is None:  # the client went away: the engine stops the work too
                self._channel.send(Cancel(request_id))
            raise
        finally:
            self._waiting.pop(request_id, None)

    async def _ask(self, operation: str, *arguments: Any) -> Any:
        request_id, waiting = self._request()
        self._channel.send(Ask(request_id, operation, arguments))
        return await self._await(request_id, waiting)

    def count_invocation(self, name: str, status: int, seconds: float,
                         unavailable: str | None = None) -> None:
        """One invocation answered by this worker (and a 503's reason), into the engine's
        metrics."""
        count = (name, status, seconds, None if unavailable is None else str(unavailable))
        if self._lost is None and self._channel is not None:
            self._channel.gather(Count, count)
        elif self._lost is not None:  # the 503s of a lost engine are counted by the next one
            self._uncounted.append(count)

    # -- invocations -------------------------------------------------------------------

    async def invoke(self, name: str, headers: ToolkitHeaders | V2Headers, call: Call
                     ) -> Answer:
        codecs = await self._row_codecs(name)
        if call.content_length is not None:
            check_payload_size(call.content_length, self.settings.max_payload_bytes)
        if not _decodes_here(codecs, headers):
            body = await read_whole_body(call.read_body, call.body_arrived, self.settings)
            return await self._ask("invoke", name, headers, body)
        refusal = self._refusals.get(name)
        if refusal is not None:
            if isinstance(refusal, errors.QueueFull):
                self._channel.send(Refused(name))
            raise copy.copy(refusal)
        wire = headers.wire(name, codecs, self.settings.default_accept)
        wire.admit()
        body = await read_whole_body(call.read_body, call.body_arrived, self.settings)
        try:
            return await self._invoke_rows(name, codecs.generation, wire, body)
        except CodecsChanged:  # loaded again since this worker fetched the codecs
            self._codecs.pop(name, None)
            codecs = await self._row_codecs(name)
            if not _decodes_here(codecs, headers):
                return await self._ask("invoke", name, headers, body)
            return await self._invoke_rows(
                name, codecs.generation, headers.wire(name, codecs, self.settings.default_accept),
                body)

    async def _row_codecs(self, name: str) -> RowCodecs | None:
        codecs = self._codecs.get(name, _UNKNOWN)
        if codecs is _UNKNOWN:
            codecs = await self._ask("row_codecs", name)
            if self._lost is None:
                self._codecs[name] = codecs
        return codecs

    def _invoke_rows(self, name: str, generation: int, wire: Wire, body: bytes
                     ) -> Awaitable[Answer]:
        """Decode here, the model in the engine, encode here: one process's steps 3 to 5
        (``InvocationPipeline.answer``), within the same deadline."""
        return self._pipeline.answer(name, wire, body,
                                     functools.partial(self._through_engine, name, generation))

    async def _through_engine(self, name: str, generation: int, data: Any, deadline: float
                              ) -> Called:
        """Step 4 in a worker: the rows into the connection's shared memory, a ``Rows``
        message to the engine, and its answer's rows read where the engine wrote them."""
        request_id, waiting = self._request()
        channel = self._channel
        try:
            descriptor, region = pack(data, channel.outgoing)
        except BaseException:
            del self._waiting[request_id]
            raise
        self._rows_sent[request_id] = region
        channel.gather(Rows, (request_id, name, generation, descriptor))
        timer = asyncio.get_running_loop().call_at(deadline + ANSWER_GRACE_SECONDS, _give_up,
                                                   waiting, name)
        try:
            answer_descriptor, answer_region, queue_s, infer_s = await self._await(
                request_id, waiting)
        finally:
            timer.cancel()

        def settled(stages: tuple[float, ...] | None) -> None:
            if channel is not self._channel or channel.closed:
                return  # the engine that wrote the rows is gone, and its memory with it
            if stages is not None:
                channel.gather(Stages, (name, *stages))
            if answer_region is not None:
                channel.gather(Free, answer_region)

        try:
            rows = unpack(answer_descriptor, channel.incoming, copy=False)
        except BaseException:
            settled(None)
            raise
        return Called(rows, queue_s, infer_s, settled)


def _decodes_here(codecs: RowCodecs | None, headers: ToolkitHeaders | V2Headers) -> bool:
    """The worker decodes this invocation (the module docstring); else the engine does."""
    return codecs is not None and (codecs.toolkit or isinstance(headers, V2Headers))


def _give_up(waiting: asyncio.Future, name: str) -> None:
    if not waiting.done():
        waiting.set_exception(errors.InvocationTimeout(f"model {name!r} did not answer"))
