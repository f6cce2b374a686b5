"""``ModelRunner``: one model's queue, admission and deadlines, and the step around the planner.

Running a formed batch (the worker thread, failure isolation, the stuck-call watchdog) is
``execution.py``'s; choosing the batch is ``planner.py``'s; the queue is ``pending.py``'s.

``model`` is any callable from a batch (a tensor, or a dict, tuple or list of tensors
sharing dimension 0) to a tensor (or a tuple, list or dict of tensors) with one row per
input row. ``device`` is where batches are moved before the call (default: where the
model's parameters are; a plain function gets its inputs where they are); outputs come
back on the CPU. ``concatenate=False`` is for models that are not row-wise: each request
is one call of its own, its input and output whole; queueing, shedding, statistics and
draining work as with batching. ``call_timeout`` (seconds, default none) bounds one call:
a call that outlives it fails its requests with :class:`InvocationTimeout` and marks the
runner *unhealthy* (:attr:`stuck_seconds`) until it returns; meanwhile new requests are
refused with :class:`ModelUnhealthy` and :meth:`stop` does not wait for it.

Use it from one event loop::

    runner = ModelRunner(model, BatchSettings(max_batch_size=16, max_wait=0.005))
    await runner.start()
    rows = await runner.submit(torch.randn(1, 3, 64, 64))
    await runner.stop()

There is one way in for a request, :meth:`ModelRunner.reserve` (``reservation.py``): a queue
slot, then the request in it, its answer on a future; ``submit`` is those two steps. Requests
that arrive together (an HTTP worker's message to the engine) come in by
:meth:`ModelRunner.submit_many`, admitted as those steps would admit them one after another. Nothing runs a loop
of its own: each change of the queue, of an instance or of the clock schedules one *step*,
which starts a batch on every idle instance the planner says is due and queues a *full* batch
behind an instance's one running call (k = 2 batches in flight per instance at most: on one
CUDA stream the second waits for the first, so the worker thread collates and starts it the
moment the first ends, with no loop step between). The callback that brings a call's result
takes that step itself before it writes the batch's answers, so the device never waits on
answered handlers or new arrivals.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import torch

from mmserver.batching.admission import Admission
from mmserver.batching.execution import BatchExecutor
from mmserver.batching.instances import Instances
from mmserver.batching.pending import QueuedRequest, RequestQueue, answer
from mmserver.batching.planner import BatchPlanner
from mmserver.batching.reservation import Reservation
from mmserver.batching.rows import parameters_device
from mmserver.batching.settings import BatchSettings
from mmserver.batching.sizing import BatchSizer
from mmserver.batching.stats import BatchRecord, RunnerStats, batch_record
from mmserver.errors import MMServerError, RunnerClosed

log = logging.getLogger(__name__)


class ModelRunner:
    """Queue requests for one model and run them in batches (see the module docstring)."""

    def __init__(self, model: Callable[[Any], Any], settings: BatchSettings | None = None, *,
                 device: torch.device | str | None = None, name: str = "model",
                 concatenate: bool = True, call_timeout: float | None = None):
        self.settings = settings or BatchSettings()
        self.device = torch.device(device) if device is not None else parameters_device(model)
        self.name = name
        self.concatenate = concatenate
        self.planner = BatchPlanner.for_settings(self.settings, concatenate)
        self.stats = RunnerStats()
        self.sizer = (BatchSizer(self.settings.max_batch_size)
                      if self.settings.batch_sizing == "measured" and concatenate else None)
        self.call_timeout = call_timeout
        self.instances = Instances([
            BatchExecutor(model, self.device, name if n == 0 else f"{name}-{n}", concatenate,
                          call_timeout, self.stats) for n in range(self.settings.instances)])
        self._listeners: list[Callable[[BatchRecord], None]] = []
        self._queue = RequestQueue(name, self.stats, on_change=self._changed)
        self._admission = Admission(name, self.settings, self.stats, lambda: self.running,
                                    lambda: self.queue_depth, self.instances.unhealthy)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._open = False
        self._closing = False
        self._step_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._drained: asyncio.Event | None = None

    async def start(self) -> None:
        """Start serving on the running loop (idempotent)."""
        if self._open:
            return
        self._loop = asyncio.get_running_loop()
        self._drained = asyncio.Event()
        self.instances.open(on_change=self._changed)
        self._open, self._closing = True, False
        self._changed()

    async def stop(self, timeout: float | None = None) -> None:
        """Refuse new requests, answer every accepted one, then stop.

        Requests already queued run without waiting for company; open
        reservations may still submit until they are used or released. After
        ``timeout`` seconds, or at once while a call is stuck, whatever is
        left is answered with :class:`RunnerClosed` and the stuck worker
        thread (a daemon) is abandoned.
        """
        if not self._open:
            return
        self._closing = True
        self._changed()
        waits = {asyncio.ensure_future(self._drained.wait()),
                 asyncio.ensure_future(self.instances.all_stuck.wait())}
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
            self._close()

    def _close(self) -> None:
        """Stop at once: whatever is queued or in a call is answered, nobody is left waiting."""
        self._open = False  # a timer that fires now finds the runner closed
        self.instances.close()
        for request in [*self.instances.in_flight(), *self._queue.clear()]:
            answer(request, self.stats, error=RunnerClosed(f"model {self.name!r} stopped"))

    async def __aenter__(self) -> ModelRunner:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def running(self) -> bool:
        return self._open and not self._closing

    @property
    def queue_depth(self) -> int:
        """Requests admitted and not yet running: queued, or in a batch queued behind a call."""
        return self._queue.depth + self.instances.waiting()

    @property
    def stuck_seconds(self) -> float | None:
        """While every instance is stuck past ``call_timeout``, for how long; else None."""
        return self.instances.stuck_seconds()

    def add_listener(self, listener: Callable[[BatchRecord], None]) -> None:
        """Call ``listener(record)`` on the loop after every model call."""
        self._listeners.append(listener)

    # -- the way in ----------------------------------------------------------

    def check_admission(self) -> None:
        """Raise now what :meth:`reserve` would raise, without taking a slot."""
        self._admission.check()

    def refusal(self) -> MMServerError | None:
        """What :meth:`check_admission` would raise now (not counted as a rejection), or None
        while the runner admits."""
        return self._admission.refusal()

    def watch_admission(self, listener: Callable[[MMServerError | None], None]) -> None:
        """Tell ``listener`` each change of :meth:`refusal`'s kind (``admission.py``): the
        engine tells its HTTP workers, which then refuse before they read a body."""
        self._admission.watch(listener)

    def reserve(self) -> Reservation:
        """Take a queue slot now, or raise the refusal at once (the one way in)."""
        self.check_admission()
        self._queue.reserve()
        return Reservation(self._enqueue, self._queue.give_back, self._queue.remove)

    async def submit(self, data: Any, *, deadline: float | None = None) -> Any:
        """``await runner.reserve().submit(data, deadline=deadline)``."""
        return await self.reserve().submit(data, deadline=deadline)

    def submit_many(self, inputs: list[Any], *, deadline: float | None = None,
                    answered: Callable[[int, QueuedRequest], None] | None = None
                    ) -> tuple[list[QueuedRequest], MMServerError | None]:
        """Requests that arrived together (one message of an HTTP worker), admitted as a
        :meth:`reserve` and ``submit`` for each in turn would admit them, with one admission
        check, one deadline timer and one change of the queue.

        Returns the queued requests (the first ones, in order; each answer comes on its
        ``future``, and cancelling the future withdraws it) and, when some did not fit, the
        refusal of the rest, each counted as :meth:`reserve` counts one. ``answered(position,
        request)``: called once each queued request's future is done (``RequestQueue.put_many``).
        """
        admitted = inputs[:self._admission.room()]
        loop, concatenate = self._loop, self.concatenate
        requests = []
        if admitted:
            now = loop.time()
            requests = [QueuedRequest.of(data, loop.create_future(), now, concatenate)
                        for data in admitted]
            self._queue.put_many(requests, deadline, answered)
        refused = len(inputs) - len(requests)
        return requests, (self._admission.refused(refused) if refused else None)

    def _enqueue(self, data: Any, deadline: float | None) -> QueuedRequest:
        if not self._open:
            raise RunnerClosed(f"model {self.name!r} is not accepting requests")
        request = QueuedRequest.of(data, self._loop.create_future(), self._loop.time(),
                                   self.concatenate)
        self._queue.put(request, deadline)
        return request

    # -- the batching step ---------------------------------------------------

    def _changed(self) -> None:
        """The queue, an instance or the lifecycle changed: tell admission, plan a step."""
        self._admission.changed()
        if self._open and not self._step_scheduled:
            self._step_scheduled = True
            self._loop.call_soon(self._step)

    def _step(self) -> None:
        """Start what the planner says is due (module docstring); else set a timer."""
        self._step_scheduled = False
        if not self._open:
            return
        try:
            self._start_due()
        except Exception:  # noqa: BLE001 - a bug of ours: stop, and leave nobody waiting
            log.exception("model=%s the batching step failed; the runner stops", self.name)
            self._close()
            self._admission.changed()

    def _start_due(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        queue = self._queue
        while (executor := self.instances.idle() or self.instances.ahead()) is not None:
            queue.drop_answered()
            plan = self.planner.plan(
                queue.requests, now=self._loop.time(), on_the_way=queue.reserved,
                closing=self._closing,
                batch_size=self.sizer.next_size if self.sizer is not None else None)
            if not plan.take or not (plan.full or self.instances.idle()):
                if plan.wait is not None and self.instances.idle():
                    self._timer = self._loop.call_later(plan.wait, self._step)
                break
            self.instances.start(executor, queue.take(plan.take), self._batch_done)
        if self._closing and queue.depth == 0 and not self.instances.busy:
            self._drained.set()

    def _batch_done(self, batch: list[QueuedRequest], started: float,
                    model_seconds: float | None, write_answers: Callable[[], None]) -> None:
        """In the callback that brought ``batch``'s result: start the next call, then answer."""
        if write_answers is None:  # it never ran (queued behind a stuck call): run it again
            self._queue.put_back(batch)
            return
        now = self._loop.time()
        self._step()
        next_call_started = self.instances.busy
        write_answers()
        record = batch_record(batch, started, now, next_call_started)
        if record is None:  # every request left before the call: none was made
            return
        if self.sizer is not None and model_seconds is not None:
            self.sizer.record(record.rows, model_seconds)
        self._record(record)

    def _record(self, record: BatchRecord) -> None:
        self.stats.add(record)
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # noqa: BLE001 - a broken exporter must not stop serving
                log.exception("model=%s batch listener failed", self.name)

