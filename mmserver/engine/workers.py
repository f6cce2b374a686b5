"""The engine's side of its HTTP workers' connections: each worker's messages, answered.

An ``Ask`` runs the operation it names (``dispatch_table``) as a task of its own; a
``Rows`` message's invocations go straight into the model's runner, each answer gathered
into the turn's one ``RowsResult`` from the request's own callback; ``Free``, ``Count``, ``Stages``, ``Refused`` and ``Cancel`` are
notices. :class:`Workers` tells every connection what changed (a model loaded or
unloaded, a runner that starts or stops refusing). ``engine.engine`` is the process
around them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any


from mmserver.batching.pending import QueuedRequest
from mmserver.engine.channel import Channel
from mmserver.engine.client import CodecsChanged
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
)
from mmserver.engine.shared import pack, unpack_copies
from mmserver.errors import InvocationTimeout, MMServerError, QueueFull

log = logging.getLogger(__name__)


class WorkerConnection:
    """One worker's channel: its messages (``engine.messages``), answered as they finish.

    An operation runs as a task of its own. Rows (an invocation the worker decoded) take no
    task: they are queued in the model's runner as their message is read, and the runner's
    answer is written into the connection's answer arena from the request's own callback,
    so a burst of requests costs the engine a few calls each. Every ``Rows`` message gets
    exactly one reply, whatever happens to it, so that the worker knows when its region of
    shared memory is free again (the rows were copied out on arrival).

    A ``Cancel`` notice (the worker's client went away, so aiohttp cancelled its handler)
    cancels that operation here too, as one process cancels it: a queued invocation
    leaves the queue uncomputed.
    """

    def __init__(self, dispatch: dict[str, Callable[..., Awaitable]], service,
                 channel: Channel):
        self.dispatch = dispatch
        self.service = service
        self.channel = channel
        self._tasks: dict[int, asyncio.Task] = {}
        self._queued: dict[int, QueuedRequest] = {}
        #: What each kind a worker sends does; any other kind is a protocol error.
        self._handlers: dict[type, Callable[[Any], None]] = {
            Rows: self._rows, Free: self._free, Count: self._count, Cancel: self._cancel,
            Refused: self._refused, Ask: self._ask, Stages: self._stages}

    def on_messages(self, messages: list) -> None:
        dispatch(self._handlers, messages, "the engine", "a worker")

    def _ask(self, message: Ask) -> None:
        request_id = message.request_id
        task = self._tasks[request_id] = asyncio.create_task(
            _answer(self.dispatch, self.channel, message))
        task.add_done_callback(lambda _: self._tasks.pop(request_id, None))

    def _free(self, message: Free) -> None:
        free = self.channel.outgoing.free
        for offset in message.offsets:
            free(offset)

    def _count(self, message: Count) -> None:
        request_done = self.service.metrics.request_done
        for name, status, seconds, unavailable in message.invocations:
            request_done(name, status, seconds, unavailable)

    def _stages(self, message: Stages) -> None:
        by_model: dict[str, list[tuple[float, ...]]] = {}
        for name, *seconds in message.answers:
            by_model.setdefault(name, []).append(seconds)
        for name, answers in by_model.items():
            self.service.record_stages(name, answers)

    def _refused(self, message: Refused) -> None:
        self.service.count_refusal(message.name)

    def _cancel(self, message: Cancel) -> None:
        request_id = message.request_id
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()
        queued = self._queued.get(request_id)
        if queued is not None:
            queued.future.cancel()  # it leaves the queue uncomputed (``batching.pending``)

    def _rows(self, message: Rows) -> None:
        groups: dict[tuple[str, int], list[tuple[int, Any]]] = {}
        for request_id, name, generation, descriptor in message.invocations:
            groups.setdefault((name, generation), []).append((request_id, descriptor))
        for (name, generation), invocations in groups.items():
            self._queue_rows(name, generation, invocations)

    def _queue_rows(self, name: str, generation: int,
                    invocations: list[tuple[int, Any]]) -> None:
        """One model's requests of a message, queued together (one admission check)."""
        channel = self.channel
        request_ids = [request_id for request_id, _ in invocations]
        try:
            model = self.service.serving(name)
            if model.generation != generation:
                raise CodecsChanged(f"model {name!r} was loaded again")
            requests, refusal = model.submit_rows(
                unpack_copies([descriptor for _, descriptor in invocations], channel.incoming),
                self.service.pipeline,
                lambda position, request: self._answer_rows(request_ids[position], model,
                                                            request))
        except MMServerError as error:
            refusal, requests = self.service.told(error), []
        except Exception:  # noqa: BLE001 - the worker answers 500; the cause stays in this log
            log.exception("engine: queueing rows for model %s failed", name)
            refusal, requests = None, []
        queued = self._queued
        for request_id, request in zip(request_ids, requests):
            queued[request_id] = request
        for request_id in request_ids[len(requests):]:
            channel.send(Failed(request_id, refusal))

    def _answer_rows(self, request_id: int, model, request: QueuedRequest) -> None:
        self._queued.pop(request_id, None)
        channel = self.channel
        if channel.closed:
            return
        future = request.future
        if future.cancelled():
            channel.send(Failed(request_id, None))  # the worker gave up; its region is free
            return
        error = future.exception()
        if error is None:
            try:
                descriptor, region = pack(future.result(), channel.outgoing)
            except Exception:  # noqa: BLE001 - as any failed operation
                log.exception("engine: answering rows of model %s failed", model.name)
                channel.send(Failed(request_id, None))
            else:
                channel.gather(RowsResult, (request_id, descriptor, region,
                                            request.started - request.arrival,
                                            request.ended - request.started))
            return
        if isinstance(error, InvocationTimeout):
            error = self.service.pipeline.timed_out(model.name)
        told = self.service.told(error) if isinstance(error, MMServerError) else None
        channel.send(Failed(request_id, told))


class Workers:
    """The engine's connections, and what it tells all of them: a model was loaded or
    unloaded (forget its codecs), or its queue filled or has room again (refuse, or stop
    refusing, before reading a body)."""

    def __init__(self, dispatch: dict[str, Callable[..., Awaitable]], service):
        #: Each operation a worker may ask, and what answers it (``engine.dispatch_table``).
        self.dispatch = dispatch
        #: The engine's service (``http.local.LocalService``).
        self.service = service
        self._connections: set[WorkerConnection] = set()

    def connected(self, channel: Channel):
        connection = WorkerConnection(self.dispatch, self.service, channel)
        self._connections.add(connection)
        channel.lost.add_done_callback(lambda _: self._connections.discard(connection))
        return connection.on_messages

    def tell(self, message: Changed | Admission) -> None:
        for connection in self._connections:
            connection.channel.send(message)

    def model_changed(self, model, loaded: bool) -> None:
        self.tell(Changed(model.name))
        if loaded:
            model.watch_admission(
                lambda refusal, name=model.name: self.tell(Admission(name, (
                    refusal if isinstance(refusal, QueueFull) else None))))

    def close(self) -> None:
        for connection in list(self._connections):
            connection.channel.close()


async def _answer(dispatch: dict[str, Callable[..., Awaitable]], channel: Channel,
                  ask: Ask) -> None:
    try:
        operation = dispatch.get(ask.method)
        if operation is None:
            raise MMServerError(f"the engine has no operation {ask.method!r}")
        result = await operation(*ask.arguments)
    except MMServerError as error:
        channel.send(Failed(ask.request_id, error))
    except Exception:  # noqa: BLE001 - the worker answers 500; the cause stays in this log
        log.exception("engine operation %s failed", ask.method)
        channel.send(Failed(ask.request_id, None))
    else:
        channel.send(Result(ask.request_id, result))
