"""``ModelRunner``: one model's queue, its batching loop, and its statistics."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from mmserver.batching.failures import as_model_error, is_out_of_memory
from mmserver.batching.planner import BatchPlanner
from mmserver.batching.reservation import Reservation
from mmserver.batching.rows import batch_key, moved, rows_of, split_rows
from mmserver.batching.rows import concatenate as concatenate_rows
from mmserver.batching.settings import BatchSettings
from mmserver.batching.sizing import BatchSizer
from mmserver.batching.stats import BatchRecord, RunnerStats
from mmserver.errors import (
    InvocationTimeout,
    ModelUnhealthy,
    QueueFull,
    RunnerClosed,
)
from mmserver.workers import WorkerPool

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class _Request:
    data: Any
    future: asyncio.Future
    arrival: float
    rows: int
    key: Any


class ModelRunner:
    """Queue requests for one model and run them in batches.

    ``model`` is any callable from a batch (a tensor, or a dict, tuple or list of
    tensors sharing dimension 0) to a tensor (or a tuple, list or dict of
    tensors) with one row per input row. ``device`` is where batches are moved
    before the call (default: where the model's parameters are; a plain
    function gets its inputs where they are); outputs come back on the CPU.

    ``concatenate=False`` is for models that are not row-wise: each request is
    then one call of its own, with its input as it is (any object), and its
    output handed back whole. Queueing, shedding, statistics and draining work
    as with batching.

    ``call_timeout`` (seconds, default none) bounds one model call: a call that
    outlives it fails its requests with :class:`InvocationTimeout` and marks the
    runner *unhealthy* (:attr:`stuck_seconds`) until it returns; meanwhile new
    requests are refused with :class:`ModelUnhealthy` and :meth:`stop` does
    not wait for it.

    Use it from one event loop::

        runner = ModelRunner(model, BatchSettings(max_batch_size=16, max_wait=0.005))
        await runner.start()
        rows = await runner.submit(torch.randn(1, 3, 64, 64))
        await runner.stop()

    Keyword arguments named like :class:`BatchSettings` fields override
    ``settings`` (``ModelRunner(model, max_batch_size=8)``).
    """

    def __init__(
        self,
        model: Callable[[Any], Any],
        settings: BatchSettings | None = None,
        *,
        device: torch.device | str | None = None,
        name: str = "model",
        concatenate: bool = True,
        call_timeout: float | None = None,
        **knobs: Any,
    ):
        self.settings = dataclasses.replace(settings or BatchSettings(), **knobs)
        self.model = model
        self.device = torch.device(device) if device is not None else _parameters_device(model)
        self.name = name
        self.concatenate = concatenate
        self.call_timeout = call_timeout
        self.planner = BatchPlanner(policy=self.settings.policy,
                                    max_batch_size=self.settings.max_batch_size,
                                    max_wait=self.settings.max_wait, concatenate=concatenate)
        self.stats = RunnerStats()
        self.sizer = (BatchSizer(self.settings.max_batch_size)
                      if self.settings.batch_sizing == "measured" and concatenate else None)
        self._listeners: list[Callable[[BatchRecord], None]] = []
        self._queue: list[_Request] = []
        self._reserved = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: WorkerPool | None = None
        self._closing = False
        self._in_flight: list[_Request] = []
        self._call_started: float | None = None
        self._stuck = False
        self._model_seconds: list[float] = []

    # The knobs, read through the settings they came from.
    max_batch_size = property(lambda self: self.settings.max_batch_size)
    max_wait = property(lambda self: self.settings.max_wait)
    max_queue_size = property(lambda self: self.settings.max_queue_size)
    policy = property(lambda self: self.settings.policy)

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Start the batching task on the running loop (idempotent)."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._pool = WorkerPool(self.name, workers=1)
        self._closing = False
        self._task = asyncio.create_task(self._run(), name=f"ModelRunner[{self.name}]")

    async def stop(self, timeout: float | None = None) -> None:
        """Refuse new requests, answer every accepted one, then stop.

        Requests already queued run without waiting for company; open
        reservations may still submit until they are used or released. After
        ``timeout`` seconds, or at once while a call is stuck, whatever is
        left is answered with :class:`RunnerClosed` and the stuck worker
        thread (a daemon) is abandoned.
        """
        if self._task is None:
            return
        self._closing = True
        self._wakeup.set()
        task = self._task
        deadline = None if timeout is None else self._loop.time() + timeout
        try:
            while not task.done():
                if self._stuck or (deadline is not None and self._loop.time() >= deadline):
                    task.cancel()
                    await asyncio.wait({task})
                    break
                await asyncio.wait({task}, timeout=0.1)
        finally:
            self._pool.close()
            self._task = None

    async def __aenter__(self) -> ModelRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and not self._closing

    @property
    def queue_depth(self) -> int:
        """Requests admitted and not yet taken into a batch."""
        return len(self._queue) + self._reserved

    @property
    def stuck_seconds(self) -> float | None:
        """How long the call past ``call_timeout`` has run, or None when healthy."""
        if not self._stuck or self._call_started is None:
            return None
        return time.perf_counter() - self._call_started

    def add_listener(self, listener: Callable[[BatchRecord], None]) -> None:
        """Call ``listener(record)`` on the loop after every model call."""
        self._listeners.append(listener)

    # -- admission -----------------------------------------------------------

    def check_admission(self) -> None:
        """Raise now what :meth:`reserve` would raise, without taking a slot."""
        if not self.running:
            raise RunnerClosed(f"model {self.name!r} is not accepting requests")
        if self._stuck:
            raise ModelUnhealthy(
                f"model {self.name!r} is unhealthy: a call has run for "
                f"{self.stuck_seconds:.0f} s, past its {self.call_timeout:g} s limit; "
                "unload it or wait for the call to return")
        if self.queue_depth >= self.max_queue_size:
            self.stats.requests_rejected += 1
            raise QueueFull(
                f"model {self.name!r} has {self.queue_depth} requests queued "
                f"(max_queue_size={self.max_queue_size})",
                retry_after_seconds=self._estimated_drain_seconds(),
            )

    def reserve(self) -> Reservation:
        """Take a queue slot now, or raise :class:`QueueFull` at once."""
        self.check_admission()
        self._reserved += 1
        return Reservation(self._enqueue, self._give_back_slot)

    async def submit(self, data: Any, *, deadline: float | None = None) -> Any:
        """Queue ``data`` (rows along dimension 0) and await its output rows.

        ``deadline`` (the loop's clock): if no answer has come by then, the request
        leaves the queue (or its batch is answered without it) with
        :class:`InvocationTimeout`.
        """
        self.check_admission()
        return await self._enqueue(data, deadline)

    def _give_back_slot(self) -> None:
        self._reserved -= 1
        if self._wakeup is not None:
            self._wakeup.set()

    def _estimated_drain_seconds(self) -> float:
        per_batch = (
            self.stats.compute_seconds_total / self.stats.batches if self.stats.batches else 0.1
        )
        batches_ahead = math.ceil(self.queue_depth / self.max_batch_size)
        return max(1.0, batches_ahead * per_batch)

    async def _enqueue(self, data: Any, deadline: float | None = None) -> Any:
        if self.concatenate:
            rows, key = rows_of(data), batch_key(data)
        else:
            rows, key = 1, None
        if self._task is None:
            raise RunnerClosed(f"model {self.name!r} is not accepting requests")
        request = _Request(data=data, future=self._loop.create_future(),
                           arrival=self._loop.time(), rows=rows, key=key)
        self._queue.append(request)
        self.stats.requests_submitted += 1
        self._wakeup.set()
        timer = None if deadline is None else self._loop.call_at(deadline, self._expire, request)
        try:
            return await request.future
        except asyncio.CancelledError:
            self._leave_queue(request)
            if request.future.cancelled():  # else it was answered just before the cancel
                self.stats.requests_cancelled += 1
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _expire(self, request: _Request) -> None:
        """The request's deadline passed: answer it now and free its place in the queue."""
        self._answer(request, error=InvocationTimeout(
            f"model {self.name!r} did not answer before the request's deadline"))
        self._leave_queue(request)

    def _leave_queue(self, request: _Request) -> None:
        """A request answered before its batch (cancelled, expired) frees its place at once."""
        if request in self._queue:
            self._queue.remove(request)
            self._wakeup.set()

    # -- the batching loop ---------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                self._wakeup.clear()
                self._drop_cancelled()
                if self._closing and not self._queue and self._reserved == 0:
                    return
                plan = self.planner.plan(
                    self._queue, now=self._loop.time(), on_the_way=self._reserved,
                    closing=self._closing,
                    batch_size=self.sizer.next_size if self.sizer is not None else None)
                if plan.take:
                    await self._execute(self._take(plan.take))
                elif plan.wait is None:
                    await self._wakeup.wait()
                else:
                    try:
                        await asyncio.wait_for(self._wakeup.wait(), plan.wait)
                    except TimeoutError:
                        pass
        finally:
            self._fail_leftovers()

    def _drop_cancelled(self) -> None:
        if any(r.future.done() for r in self._queue):
            self._queue = [r for r in self._queue if not r.future.done()]

    def _take(self, positions: tuple[int, ...]) -> list[_Request]:
        chosen = set(positions)
        batch = [self._queue[i] for i in positions]
        self._queue = [r for i, r in enumerate(self._queue) if i not in chosen]
        return batch

    async def _execute(self, batch: list[_Request]) -> None:
        now = self._loop.time()
        waits = tuple(now - r.arrival for r in batch)
        started = time.perf_counter()
        self._in_flight = batch  # answered by _fail_leftovers if the task dies mid-batch
        self._model_seconds = []
        await self._run_isolated(batch)
        self._in_flight = []
        compute = time.perf_counter() - started
        failed = sum(1 for r in batch if r.future.done() and not r.future.cancelled()
                     and r.future.exception() is not None)
        rows = sum(r.rows for r in batch)
        if self.sizer is not None and not failed and len(self._model_seconds) == 1:
            self.sizer.record(rows, self._model_seconds[0])
        self._record(BatchRecord(rows=rows, requests=len(batch),
                                 queue_wait_seconds=waits, compute_seconds=compute,
                                 failed_requests=failed))

    async def _run_isolated(self, batch: list[_Request]) -> None:
        """Run ``batch``; on failure retry smaller so only failing requests fail."""
        live = [r for r in batch if not r.future.done()]
        if not live:
            return
        try:
            outputs = await self._call([r.data for r in live], [r.rows for r in live])
        except InvocationTimeout as error:
            for request in live:
                self._answer(request, error=error)
            return
        except Exception as error:  # noqa: BLE001 - any model error is the request's answer
            if len(live) == 1:
                self._answer(live[0], error=as_model_error(error, self.name))
                return
            log.warning("model=%s batch of %d requests failed (%s); retrying smaller",
                        self.name, len(live), error.__class__.__name__)
            if is_out_of_memory(error):
                half = len(live) // 2
                await self._run_isolated(live[:half])
                await self._run_isolated(live[half:])
            else:
                for request in live:
                    await self._run_isolated([request])
            return
        for request, output in zip(live, outputs):
            self._answer(request, result=output)

    async def _call(self, inputs: list[Any], sizes: list[int]) -> list[Any]:
        """One model call in the worker thread, watched by ``call_timeout``."""
        call = self._pool.run(self._call_model, inputs, sizes)
        self._call_started = time.perf_counter()
        try:
            if self.call_timeout is None:
                return await call
            try:
                return await asyncio.wait_for(asyncio.shield(call), self.call_timeout)
            except TimeoutError:
                self._stuck = True
                log.error("model=%s a call has run past its %g s limit; the model is unhealthy "
                          "until it returns", self.name, self.call_timeout)
                call.add_done_callback(self._unstuck)
                raise InvocationTimeout(
                    f"model {self.name!r} did not answer within {self.call_timeout:g} s "
                    "(SAGEMAKER_MODEL_SERVER_TIMEOUT)") from None
        finally:
            if not self._stuck:
                self._call_started = None

    def _unstuck(self, call: asyncio.Future) -> None:
        if not call.cancelled():
            call.exception()  # retrieved: the requests were answered already
        self._stuck = False
        self._call_started = None
        log.warning("model=%s the stuck call returned; the model is healthy again", self.name)
        if self._wakeup is not None:
            self._wakeup.set()

    def _call_model(self, inputs: list[Any], sizes: list[int]) -> list[Any]:
        """Runs in the worker thread: concatenate, move, call, move back, split."""
        with torch.inference_mode():
            if not self.concatenate:
                return [moved(self.model(moved(inputs[0], self.device)), None, to_cpu=True)]
            batch = inputs[0] if len(inputs) == 1 else concatenate_rows(inputs)
            if self.device is not None:
                batch = moved(batch, self.device)
            started = time.perf_counter()
            output = moved(self.model(batch), None, to_cpu=True)
            self._model_seconds.append(time.perf_counter() - started)  # the sizer's measure
            return split_rows(output, sizes)

    def _answer(self, request: _Request, *, result: Any = None,
                error: BaseException | None = None) -> None:
        if request.future.done():
            return
        if error is None:
            request.future.set_result(result)
            self.stats.requests_completed += 1
        else:
            request.future.set_exception(error)
            self.stats.requests_failed += 1

    def _record(self, record: BatchRecord) -> None:
        self.stats.add(record)
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # noqa: BLE001 - a broken exporter must not stop serving
                log.exception("model=%s batch listener failed", self.name)

    def _fail_leftovers(self) -> None:
        """If the loop task ends any other way than a drained stop, nobody may be left waiting."""
        leftovers = [*self._in_flight, *self._queue]
        self._in_flight, self._queue = [], []
        for request in leftovers:
            self._answer(request, error=RunnerClosed(f"model {self.name!r} stopped"))


def _parameters_device(model: Any) -> torch.device | None:
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        try:
            return next(iter(parameters())).device
        except (StopIteration, TypeError, RuntimeError):
            pass
    return None
