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
  :class:`BatchSizer`.

What crosses threads: the worker thread gets the inputs and row counts as
arguments and returns ``(outputs, model_seconds)``; the future carries them
back to the loop. Every other field here is read and written on the loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from mmserver.batching.failures import as_model_error, is_out_of_memory
from mmserver.batching.rows import concatenate, moved, split_rows
from mmserver.batching.stats import RunnerStats
from mmserver.errors import InvocationTimeout, ModelUnhealthy
from mmserver.workers import WorkerPool

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class QueuedRequest:
    """One submitted request: its input, its answer-to-be, and what the planner reads."""

    data: Any
    future: asyncio.Future
    arrival: float
    rows: int
    key: Any


def answer(request: QueuedRequest, stats: RunnerStats, *, result: Any = None,
           error: BaseException | None = None) -> None:
    """Answer ``request`` unless it already was (cancelled, expired), and count it."""
    if request.future.done():
        return
    if error is None:
        request.future.set_result(result)
        stats.requests_completed += 1
    else:
        request.future.set_exception(error)
        stats.requests_failed += 1


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

    def open(self) -> None:
        if self._pool is None or self._pool.closed:
            self._pool = WorkerPool(self.name, workers=1)
        if self._stream is None and self.device is not None and self.device.type == "cuda":
            self._stream = torch.cuda.Stream(self.device)

    def close(self) -> None:
        """Let the worker thread end after its call; a stuck one is abandoned (a daemon)."""
        if self._pool is not None:
            self._pool.close()

    def answer(self, request: QueuedRequest, *, result: Any = None,
               error: BaseException | None = None) -> None:
        answer(request, self.stats, result=result, error=error)

    @property
    def stuck_seconds(self) -> float | None:
        """How long the call past ``call_timeout`` has run, or None when healthy."""
        if not self.stuck.is_set():
            return None
        return time.perf_counter() - self._call_started

    async def run(self, batch: list[QueuedRequest]) -> float | None:
        """Run ``batch``, answering every request in it exactly once.

        Returns the model's own seconds when the batch ran as one successful
        call (what the sizer learns from), else None.
        """
        started = time.perf_counter()
        try:
            return await self._run(batch)
        finally:
            self.busy_seconds += time.perf_counter() - started

    async def _run(self, batch: list[QueuedRequest]) -> float | None:
        live = [r for r in batch if not r.future.done()]
        if not live:
            return None
        try:
            outputs, model_seconds = await self._call([r.data for r in live],
                                                      [r.rows for r in live])
        except InvocationTimeout as error:
            for request in live:
                self.answer(request, error=error)
            return None
        except Exception as error:  # noqa: BLE001 - any model error is the request's answer
            if len(live) == 1:
                self.answer(live[0], error=as_model_error(error, self.name))
                return None
            log.warning("model=%s batch of %d requests failed (%s); retrying smaller",
                        self.name, len(live), error.__class__.__name__)
            parts = ([live[:len(live) // 2], live[len(live) // 2:]] if is_out_of_memory(error)
                     else [[request] for request in live])
            for part in parts:
                await self._run(part)
            return None
        for request, output in zip(live, outputs):
            self.answer(request, result=output)
        return model_seconds

    async def _call(self, inputs: list[Any], sizes: list[int]) -> tuple[list[Any], float | None]:
        """One call in the worker thread, watched by ``call_timeout``."""
        call = self._pool.run(self._call_in_thread, inputs, sizes)
        self._call_started = time.perf_counter()
        if self.call_timeout is None:
            return await call
        try:
            return await asyncio.wait_for(asyncio.shield(call), self.call_timeout)
        except TimeoutError:
            self.stuck.set()
            if self.on_stuck is not None:
                self.on_stuck()
            log.error("model=%s a call has run past its %g s limit; the model is unhealthy "
                      "until it returns", self.name, self.call_timeout)
            call.add_done_callback(self._unstuck)
            raise InvocationTimeout(
                f"model {self.name!r} did not answer within its {self.call_timeout:g} s "
                "call timeout") from None

    def _unstuck(self, call: asyncio.Future) -> None:
        if not call.cancelled():
            call.exception()  # retrieved: the requests were answered already
        self.stuck.clear()
        log.warning("model=%s the stuck call returned; the model is healthy again", self.name)
        if self.on_unstuck is not None:
            self.on_unstuck()

    def _call_in_thread(self, inputs: list[Any], sizes: list[int]) -> tuple[list[Any], float | None]:
        """In the worker thread: concatenate, move, call, move back, split.

        Reads only its arguments and fields fixed at construction; returns what it measured.
        """
        on_stream = contextlib.nullcontext() if self._stream is None \
            else torch.cuda.stream(self._stream)
        with torch.inference_mode(), on_stream:
            if not self.concatenate_rows:
                return [moved(self.model(moved(inputs[0], self.device)), None, to_cpu=True)], None
            batch = inputs[0] if len(inputs) == 1 else concatenate(inputs)
            if self.device is not None:
                batch = moved(batch, self.device)
            started = time.perf_counter()
            output = moved(self.model(batch), None, to_cpu=True)
            model_seconds = time.perf_counter() - started
            return split_rows(output, sizes), model_seconds


class Instances:
    """A model's executors (its *instances*): each runs one batch at a time, all share the model.

    The runner hands a formed batch to an :meth:`idle` instance with :meth:`start`
    and plans the next one at once, so with N instances up to N batches of one model
    run concurrently, each in its own worker thread. A stuck instance (a call past
    ``call_timeout``) is given nothing until its call returns; the model is
    unhealthy only when every instance is stuck.
    """

    def __init__(self, executors: list[BatchExecutor]):
        self.executors = executors
        self._running: dict[int, tuple[asyncio.Task, list[QueuedRequest]]] = {}
        #: Set while every instance is stuck: nothing can drain the queue.
        self.all_stuck = asyncio.Event()

    def open(self, on_unstuck: Callable[[], None],
             on_stuck: Callable[[], None] = lambda: None) -> None:
        """Start the worker threads; ``on_unstuck()`` when a stuck instance can work again,
        ``on_stuck()`` when one gets stuck."""
        def stuck() -> None:
            self.stuck_changed()
            on_stuck()

        def unstuck() -> None:
            self.stuck_changed()
            on_unstuck()
        for executor in self.executors:
            executor.on_stuck, executor.on_unstuck = stuck, unstuck
            executor.open()

    def idle(self) -> BatchExecutor | None:
        for index, executor in enumerate(self.executors):
            if index not in self._running and not executor.stuck.is_set():
                return executor
        return None

    @property
    def busy(self) -> bool:
        return bool(self._running)

    def in_flight(self) -> list[QueuedRequest]:
        return [request for _, batch in self._running.values() for request in batch]

    def start(self, executor: BatchExecutor, batch: list[QueuedRequest],
              done: Callable[[list[QueuedRequest], float, float | None], None]) -> None:
        """Run ``batch`` on ``executor``; then ``done(batch, started, model_seconds)`` on the
        loop, ``started`` on the loop's clock."""
        index = self.executors.index(executor)
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = loop.create_task(executor.run(batch))
        self._running[index] = (task, batch)
        task.add_done_callback(lambda finished: self._finished(index, finished, started, done))

    def _finished(self, index: int, task: asyncio.Task, started: float, done) -> None:
        _, batch = self._running.pop(index)
        model_seconds = None
        if not task.cancelled():
            if task.exception() is not None:  # a bug of ours: nobody may be left waiting
                log.error("model=%s instance %d failed", self.executors[index].name, index,
                          exc_info=task.exception())
            else:
                model_seconds = task.result()
        done(batch, started, model_seconds)

    def stuck_changed(self) -> None:
        if all(e.stuck.is_set() for e in self.executors):
            self.all_stuck.set()
        else:
            self.all_stuck.clear()

    def unhealthy(self) -> ModelUnhealthy | None:
        """While every instance is stuck, the :class:`ModelUnhealthy` that says so; else None."""
        if not self.all_stuck.is_set():
            return None
        first = self.executors[0]
        return ModelUnhealthy(
            f"model {first.name!r} is unhealthy: a call has run for "
            f"{self.stuck_seconds():.0f} s, past its {first.call_timeout:g} s limit; "
            "unload it or wait for the call to return")

    def stuck_seconds(self) -> float | None:
        """While every instance is stuck, how long the most recent stuck call has run."""
        if not self.all_stuck.is_set():
            return None
        return min(e.stuck_seconds for e in self.executors)  # each is stuck: each has one

    def cancel(self) -> None:
        for task, _ in self._running.values():
            task.cancel()

    def close(self) -> None:
        for executor in self.executors:
            executor.close()
