"""``ModelRunner``: one model's queue, admission, deadlines, and the loop around the planner.

Running a formed batch (the worker thread, failure isolation, the stuck-call
watchdog) is ``execution.py``'s; choosing the batch is ``planner.py``'s.

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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import torch

from mmserver.batching.execution import BatchExecutor, Instances, QueuedRequest, answer
from mmserver.batching.planner import BatchPlanner
from mmserver.batching.reservation import Reservation
from mmserver.batching.rows import batch_key, rows_of
from mmserver.batching.settings import BatchSettings
from mmserver.batching.sizing import BatchSizer
from mmserver.batching.stats import BatchRecord, RunnerStats
from mmserver.errors import InvocationTimeout, MMServerError, QueueFull, RunnerClosed

log = logging.getLogger(__name__)


class ModelRunner:
    """Queue requests for one model and run them in batches (see the module docstring)."""

    def __init__(
        self,
        model: Callable[[Any], Any],
        settings: BatchSettings | None = None,
        *,
        device: torch.device | str | None = None,
        name: str = "model",
        concatenate: bool = True,
        call_timeout: float | None = None,
    ):
        self.settings = settings or BatchSettings()
        self.device = torch.device(device) if device is not None else _parameters_device(model)
        self.name = name
        self.concatenate = concatenate
        self.planner = BatchPlanner(policy=self.settings.policy,
                                    max_batch_size=self.settings.max_batch_size,
                                    max_wait=self.settings.max_wait, concatenate=concatenate)
        self.stats = RunnerStats()
        self.sizer = (BatchSizer(self.settings.max_batch_size)
                      if self.settings.batch_sizing == "measured" and concatenate else None)
        self.call_timeout = call_timeout
        self.instances = Instances([
            BatchExecutor(model, self.device, name if n == 0 else f"{name}-{n}", concatenate,
                          call_timeout, self.stats) for n in range(self.settings.instances)])
        self._listeners: list[Callable[[BatchRecord], None]] = []
        self._queue: list[QueuedRequest] = []
        self._reserved = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._admission_listener: Callable[[MMServerError | None], None] | None = None
        self._admission_reported: MMServerError | None = None
        self._admission_scheduled = False

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Start the batching task on the running loop (idempotent)."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self.instances.open(on_unstuck=self._unstuck, on_stuck=self._admission_may_change)
        self._closing = False
        self._task = asyncio.create_task(self._run(), name=f"ModelRunner[{self.name}]")
        self._admission_may_change()

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
        self._admission_may_change()
        task = self._task
        stuck = asyncio.ensure_future(self.instances.all_stuck.wait())
        try:
            await asyncio.wait({task, stuck}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
            if not task.done():
                task.cancel()
                await asyncio.wait({task})
        finally:
            stuck.cancel()
            self.instances.close()
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
        """While every instance is stuck past ``call_timeout``, for how long; else None."""
        return self.instances.stuck_seconds()

    def add_listener(self, listener: Callable[[BatchRecord], None]) -> None:
        """Call ``listener(record)`` on the loop after every model call."""
        self._listeners.append(listener)

    # -- admission -----------------------------------------------------------

    def check_admission(self) -> None:
        """Raise now what :meth:`reserve` would raise, without taking a slot."""
        refusal = self.refusal()
        if refusal is not None:
            if isinstance(refusal, QueueFull):
                self.stats.requests_rejected += 1
            raise refusal

    def refusal(self) -> MMServerError | None:
        """What :meth:`check_admission` would raise now (not counted as a rejection), or None
        while the runner admits."""
        if not self.running:
            return RunnerClosed(f"model {self.name!r} is not accepting requests")
        unhealthy = self.instances.unhealthy()
        if unhealthy is not None:
            return unhealthy
        if self.queue_depth >= self.settings.max_queue_size:
            return QueueFull(
                f"model {self.name!r} has {self.queue_depth} requests queued "
                f"(max_queue_size={self.settings.max_queue_size})",
                retry_after_seconds=self.stats.drain_seconds(self.queue_depth,
                                                             self.settings.max_batch_size))
        return None

    def watch_admission(self, listener: Callable[[MMServerError | None], None]) -> None:
        """Call ``listener(refusal)`` on the loop each time :meth:`refusal` changes kind: the
        queue filled (:class:`QueueFull`), the model got stuck (:class:`ModelUnhealthy`), the
        runner stopped, or it admits again (None). Changes within one turn of the loop are
        reported once, at its end. The engine tells its HTTP workers, which then refuse
        before they read a body, as one process does."""
        self._admission_listener = listener
        self._admission_reported = None

    def _admission_may_change(self) -> None:
        if self._admission_listener is not None and not self._admission_scheduled:
            self._admission_scheduled = True
            self._loop.call_soon(self._report_admission)

    def _report_admission(self) -> None:
        self._admission_scheduled = False
        refusal = self.refusal()
        if type(refusal) is not type(self._admission_reported):
            self._admission_reported = refusal
            self._admission_listener(refusal)

    def reserve(self) -> Reservation:
        """Take a queue slot now, or raise :class:`QueueFull` at once."""
        self.check_admission()
        self._reserved += 1
        self._admission_may_change()
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
        self._wake()
        self._admission_may_change()

    def _unstuck(self) -> None:
        self._wakeup.set()
        self._admission_may_change()

    def _wake(self) -> None:
        """Wake the loop when it can act: an instance is idle (else a batch's end wakes it)."""
        if self._wakeup is not None and self.instances.idle() is not None:
            self._wakeup.set()

    async def _enqueue(self, data: Any, deadline: float | None = None) -> Any:
        request = self.enqueue(data, deadline)
        try:
            return await request.future
        except asyncio.CancelledError:
            self.withdraw(request)
            raise

    def enqueue(self, data: Any, deadline: float | None = None) -> QueuedRequest:
        """Queue ``data`` now, without a coroutine: its output rows come on the request's
        ``future``. For a caller that already checked admission (:meth:`check_admission`)
        and answers many requests from one callback (the engine's workers' rows). A
        caller that gives up calls :meth:`withdraw`."""
        if self.concatenate:
            rows, key = rows_of(data), batch_key(data)
        else:
            rows, key = 1, None
        if self._task is None:
            raise RunnerClosed(f"model {self.name!r} is not accepting requests")
        loop = self._loop
        request = QueuedRequest(data=data, future=loop.create_future(),
                                arrival=loop.time(), rows=rows, key=key)
        self._queue.append(request)
        self.stats.requests_submitted += 1
        self._wake()
        self._admission_may_change()
        if deadline is not None:
            timer = loop.call_at(deadline, self._expire, request)
            request.future.add_done_callback(lambda _: timer.cancel())
        return request

    def withdraw(self, request: QueuedRequest) -> None:
        """The caller gave up on ``request``: it leaves the queue uncomputed (or its batch is
        answered without it), and counts as cancelled."""
        request.future.cancel()  # nothing, if it was answered just before
        self._leave_queue(request)
        if request.future.cancelled():
            self.stats.requests_cancelled += 1

    def _expire(self, request: QueuedRequest) -> None:
        """The request's deadline passed: answer it now and free its place in the queue."""
        answer(request, self.stats, error=InvocationTimeout(
            f"model {self.name!r} did not answer before the request's deadline"))
        self._leave_queue(request)

    def _leave_queue(self, request: QueuedRequest) -> None:
        """A request answered before its batch (cancelled, expired) frees its place at once."""
        if request in self._queue:
            self._queue.remove(request)
            self._wake()
            self._admission_may_change()

    # -- the batching loop ---------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                self._wakeup.clear()
                executor = self.instances.idle()
                if executor is None:  # every instance busy (or stuck): a batch's end wakes us
                    await self._wakeup.wait()
                    continue
                self._drop_cancelled()
                if self._closing and not self._queue and self._reserved == 0 \
                        and not self.instances.busy:
                    return
                plan = self.planner.plan(
                    self._queue, now=self._loop.time(), on_the_way=self._reserved,
                    closing=self._closing,
                    batch_size=self.sizer.next_size if self.sizer is not None else None)
                if plan.take:
                    self.instances.start(executor, self._take(plan.take), self._batch_done)
                elif plan.wait is None:
                    await self._wakeup.wait()
                else:
                    try:
                        await asyncio.wait_for(self._wakeup.wait(), plan.wait)
                    except TimeoutError:
                        pass
        finally:
            self.instances.cancel()
            self._fail_leftovers()

    def _drop_cancelled(self) -> None:
        if any(r.future.done() for r in self._queue):
            self._queue = [r for r in self._queue if not r.future.done()]
            self._admission_may_change()

    def _take(self, positions: tuple[int, ...]) -> list[QueuedRequest]:
        chosen = set(positions)
        batch = [self._queue[i] for i in positions]
        self._queue = [r for i, r in enumerate(self._queue) if i not in chosen]
        self._admission_may_change()
        return batch

    def _batch_done(self, batch: list[QueuedRequest], started: float,
                    model_seconds: float | None) -> None:
        """On the loop, after an instance ran ``batch``: record it and wake the loop."""
        now = self._loop.time()
        for request in batch:  # a batch that died with a bug of ours is answered too
            answer(request, self.stats, error=RunnerClosed(
                f"model {self.name!r} failed to run this request; see the server log"))
        answered = [r for r in batch if not r.future.cancelled()]
        failed = [r for r in answered if r.future.exception() is not None]
        completed = [r for r in answered if r.future.exception() is None]
        rows = sum(r.rows for r in batch)
        if self.sizer is not None and model_seconds is not None:
            self.sizer.record(rows, model_seconds)
        self._record(BatchRecord(
            rows=rows, requests=len(batch),
            queue_wait_seconds=tuple(started - r.arrival for r in batch),
            compute_seconds=now - started, failed_requests=len(failed),
            completed_seconds=sum(now - r.arrival for r in completed),
            failed_seconds=sum(now - r.arrival for r in failed)))
        self._wakeup.set()

    def _record(self, record: BatchRecord) -> None:
        self.stats.add(record)
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # noqa: BLE001 - a broken exporter must not stop serving
                log.exception("model=%s batch listener failed", self.name)

    def _fail_leftovers(self) -> None:
        """If the loop task ends any other way than a drained stop, nobody may be left waiting."""
        leftovers = [*self.instances.in_flight(), *self._queue]
        self._queue = []
        for request in leftovers:
            answer(request, self.stats, error=RunnerClosed(f"model {self.name!r} stopped"))


def _parameters_device(model: Any) -> torch.device | None:
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        try:
            return next(iter(parameters())).device
        except (StopIteration, TypeError, RuntimeError):
            pass
    return None
