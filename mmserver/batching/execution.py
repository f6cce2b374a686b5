"""Running one formed batch: the worker thread, failure isolation, and the stuck-call watchdog.

The runner (``runner.py``) decides *which* requests form a batch; a
:class:`BatchExecutor` runs it and answers every request in it:

* the model runs in the runner's own daemon worker thread under
  ``torch.inference_mode()``, never on the event loop;
* if the batched call raises, the batch is retried request by request, so
  only the failing requests fail; an out-of-memory batch is retried in halves
  first, since a smaller batch may fit;
* a call that outlives ``call_timeout`` fails its requests with
  :class:`InvocationTimeout` and leaves the executor *stuck* until the call
  returns (the thread cannot be interrupted; it is abandoned on close);
* each successful single call is timed around the model alone, for the
  :class:`BatchSizer`;
* the result comes back to the loop in one callback (``WorkerPool.run_then``), in which
  the runner starts the next call *before* this batch's answers are written.

What crosses threads: the worker thread gets the inputs and row counts as
arguments and returns ``(outputs, model_seconds)``; one loop callback carries
them back. Every other field here is read and written on the loop only.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from mmserver.batching.failures import as_model_error, is_out_of_memory
from mmserver.batching.pending import QueuedRequest, answer
from mmserver.batching.rows import concatenate, moved, split_rows
from mmserver.batching.stats import RunnerStats
from mmserver.errors import InvocationTimeout
from mmserver.workers import WorkerPool

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class _Flight:
    """One batch's call on its way through the worker thread."""

    live: list[QueuedRequest]
    on_finished: Callable[[float | None, Callable[[], None] | None, float], None]
    #: ``perf_counter`` when it was handed to the thread, then when its call began.
    started: float
    #: Seconds it waited in the thread behind the call ahead of it (0 when none ran).
    waited_seconds: float = 0.0
    timer: asyncio.TimerHandle | None = None
    #: The call outlived ``call_timeout``: its requests were answered then.
    overdue: bool = False
    #: Queued behind a call that got stuck: given back to the runner, skipped by the thread.
    abandoned: bool = False
    done: bool = False

    def finished(self, model_seconds: float | None,
                 write_answers: Callable[[], None] | None) -> None:
        """``write_answers`` None: the batch did not run and goes back to the runner."""
        self.done = True
        self.on_finished(model_seconds, write_answers, self.waited_seconds)


def _nothing() -> None:
    pass


@dataclasses.dataclass(eq=False)
class BatchExecutor:
    """Runs batches of one model, one at a time, and answers each request exactly once."""

    model: Callable[[Any], Any]
    device: torch.device | None
    name: str
    concatenate_rows: bool
    call_timeout: float | None
    #: Counts each answer (completed or failed); the runner's statistics.
    stats: RunnerStats
    #: Set while a call runs past ``call_timeout``; cleared when it returns.
    stuck: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    #: Called on the loop when a call gets stuck, and when a stuck call returns.
    on_stuck: Callable[[], None] | None = None
    on_unstuck: Callable[[], None] | None = None
    #: Wall seconds this instance spent running batches (its share of the model's work).
    busy_seconds: float = 0.0
    _pool: WorkerPool | None = None
    #: When the latest call started (``perf_counter``); read only while it is stuck.
    _call_started: float | None = None
    #: On CUDA, the instance's own stream, so one instance's copies overlap another's compute.
    _stream: Any = None
    #: Retries of failed batches, in parts; cancelled on close.
    _retries: set = dataclasses.field(default_factory=set)
    #: Calls handed to the worker thread, in its order: the first is running.
    _flights: collections.deque = dataclasses.field(default_factory=collections.deque)

    def open(self) -> None:
        if self._pool is None or self._pool.closed:
            self._pool = WorkerPool(self.name, workers=1)
        if self._stream is None and self.device is not None and self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)

    def close(self) -> None:
        """Let the worker thread end after its call; a stuck one is abandoned (a daemon)."""
        if self._pool is not None:
            self._pool.close()
        for task in self._retries:
            task.cancel()

    def answer(self, request: QueuedRequest, *, result: Any = None,
               error: BaseException | None = None) -> None:
        answer(request, self.stats, result=result, error=error)

    @property
    def stuck_seconds(self) -> float | None:
        """How long the call past ``call_timeout`` has run, or None when healthy."""
        if not self.stuck.is_set():
            return None
        return time.perf_counter() - self._call_started

    def start(self, batch: list[QueuedRequest],
              finished: Callable[[float | None, Callable[[], None], float], None]) -> None:
        """Hand ``batch`` to the worker thread now; every request in it is answered exactly once.

        On the loop, in the very callback that brings the call's result back, this calls
        ``finished(model_seconds, write_answers, waited_seconds)``: the caller starts the next
        call first, then writes this batch's answers, so the device never waits on them.
        ``waited_seconds``: how long the batch waited in the thread behind the call ahead
        (its requests' queue time, not their call's).
        ``model_seconds`` is the model's own time when the batch ran as one successful call
        (what the sizer learns from), else None. A failed batch is retried smaller in a task
        first; a call past ``call_timeout`` finishes at the timeout, answered with
        :class:`InvocationTimeout`.
        """
        live = [r for r in batch if not r.future.done()]
        if not live:
            asyncio.get_running_loop().call_soon(finished, None, _nothing)
            return
        flight = _Flight(live, finished, time.perf_counter())
        self._flights.append(flight)
        self._pool.run_then(functools.partial(self._landed, flight), self._flight_in_thread,
                            flight)
        if len(self._flights) == 1:
            self._begin(flight)

    def _begin(self, flight: _Flight) -> None:
        """``flight``'s call starts now in the worker thread: time it, and watch it."""
        began = time.perf_counter()
        flight.waited_seconds = began - flight.started
        flight.started = self._call_started = began
        if self.call_timeout is not None:
            flight.timer = asyncio.get_running_loop().call_later(
                self.call_timeout, self._overdue, flight)

    def _landed(self, flight: _Flight, result: Any, error: BaseException | None) -> None:
        if flight.abandoned:
            return
        try:
            self._arrived(flight, result, error)
        except Exception:  # noqa: BLE001 - a bug of ours must leave nobody waiting
            log.exception("model=%s running a batch failed", self.name)
            if not flight.done:
                flight.finished(None, _nothing)

    def _arrived(self, flight: _Flight, result: Any, error: BaseException | None) -> None:
        if flight.timer is not None:
            flight.timer.cancel()
        if flight.overdue:
            self._healthy_again()
            return
        if self._flights and self._flights[0] is flight:
            self._flights.popleft()
            if self._flights:  # the batch queued behind it started the moment it ended
                self._begin(self._flights[0])
        self.busy_seconds += time.perf_counter() - flight.started
        live = [r for r in flight.live if not r.future.done()]
        if error is None and result is None:  # nobody was left waiting: no call was made
            flight.finished(None, _nothing)
        elif error is None:
            live, outputs, model_seconds = result

            def write_answers() -> None:
                for request, output in zip(live, outputs):
                    self.answer(request, result=output)
            flight.finished(model_seconds, write_answers)
        elif len(live) == 1:
            flight.finished(None, lambda: self.answer(
                live[0], error=as_model_error(error, self.name)))
        else:
            task = asyncio.get_running_loop().create_task(self._retry(flight, error))
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)

    def _overdue(self, flight: _Flight) -> None:
        flight.overdue = True
        self.busy_seconds += time.perf_counter() - flight.started
        behind = [f for f in self._flights if f is not flight]
        self._flights.clear()
        self._became_stuck()
        for queued in behind:  # they would wait for the stuck call: the runner takes them back
            queued.abandoned = True
            queued.finished(None, None)
        error = self._timeout_error()
        flight.finished(None, lambda: [self.answer(r, error=error) for r in flight.live])

    async def _retry(self, flight: _Flight, error: BaseException) -> None:
        """The batched call raised: run it again in parts, so only failing requests fail."""
        started = time.perf_counter()
        try:
            await self._in_parts(flight.live, error)
        finally:
            self.busy_seconds += time.perf_counter() - started
            flight.finished(None, _nothing)

    async def _in_parts(self, live: list[QueuedRequest], error: BaseException) -> None:
        log.warning("model=%s batch of %d requests failed (%s); retrying smaller",
                    self.name, len(live), error.__class__.__name__)
        parts = ([live[:len(live) // 2], live[len(live) // 2:]] if is_out_of_memory(error)
                 else [[request] for request in live])
        for part in parts:
            await self._run(part)

    async def _run(self, batch: list[QueuedRequest]) -> None:
        live = [r for r in batch if not r.future.done()]
        if not live:
            return
        try:
            outputs, _ = await self._call([r.data for r in live], [r.rows for r in live])
        except InvocationTimeout as error:
            for request in live:
                self.answer(request, error=error)
        except Exception as error:  # noqa: BLE001 - any model error is the request's answer
            if len(live) == 1:
                self.answer(live[0], error=as_model_error(error, self.name))
            else:
                await self._in_parts(live, error)
        else:
            for request, output in zip(live, outputs):
                self.answer(request, result=output)

    async def _call(self, inputs: list[Any], sizes: list[int]) -> tuple[list[Any], float | None]:
        """One call of a retry in the worker thread, watched by ``call_timeout``."""
        call = self._pool.run(self._call_in_thread, inputs, sizes)
        self._call_started = time.perf_counter()
        if self.call_timeout is None:
            return await call
        try:
            return await asyncio.wait_for(asyncio.shield(call), self.call_timeout)
        except TimeoutError:
            self._became_stuck()
            call.add_done_callback(self._unstuck)
            raise self._timeout_error() from None

    def _became_stuck(self) -> None:
        self.stuck.set()
        if self.on_stuck is not None:
            self.on_stuck()
        log.error("model=%s a call has run past its %g s limit; the model is unhealthy "
                  "until it returns", self.name, self.call_timeout)

    def _timeout_error(self) -> InvocationTimeout:
        return InvocationTimeout(f"model {self.name!r} did not answer within its "
                                 f"{self.call_timeout:g} s call timeout")

    def _unstuck(self, call: asyncio.Future) -> None:
        if not call.cancelled():
            call.exception()  # retrieved: the requests were answered already
        self._healthy_again()

    def _healthy_again(self) -> None:
        self.stuck.clear()
        log.warning("model=%s the stuck call returned; the model is healthy again", self.name)
        if self.on_unstuck is not None:
            self.on_unstuck()

    def _flight_in_thread(self, flight: _Flight) -> tuple[list[QueuedRequest], list[Any],
                                                          float | None] | None:
        """In the worker thread: the requests of ``flight`` still waiting when its call starts
        (one queued behind another call may have expired or been withdrawn meanwhile), their
        outputs, and the model's seconds; None when none is left or the flight was abandoned.
        A request answered just after this look is computed and its answer dropped."""
        if flight.abandoned:
            return None
        live = [r for r in flight.live if not r.future.done()]
        if not live:
            return None
        for request in live:
            request.ran = True
        return live, *self._call_in_thread([r.data for r in live], [r.rows for r in live])

    def _call_in_thread(self, inputs: list[Any], sizes: list[int]) -> tuple[list[Any], float | None]:
        """In the worker thread: concatenate, move, call, move back, split.

        Reads only its arguments and fields fixed at construction; returns what it measured.
        """
        on_stream = contextlib.nullcontext() if self._stream is None \
            else torch.cuda.stream(self._stream)
        with torch.inference_mode(), on_stream:
            if not self.concatenate_rows:
                return [moved(self.model(moved(inputs[0], self.device)), None, to_cpu=True)], None
            batch = concatenate(inputs)
            if self.device is not None:
                batch = moved(batch, self.device)
            started = time.perf_counter()
            output = moved(self.model(batch), None, to_cpu=True)
            model_seconds = time.perf_counter() - started
            return split_rows(output, sizes), model_seconds
