"""A model's instances: N executors of one model, each running its own batches at once.

With ``instances`` > 1 a queue feeds N batches of one model concurrently, each in its own
worker thread, all calling the same model object (the weights are held once). Each
instance runs one batch and may hold one full batch queued behind it (``runner.py`` says
why); a stuck instance gets nothing until its call returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mmserver.batching.execution import BatchExecutor
from mmserver.batching.pending import QueuedRequest, answer
from mmserver.errors import ModelUnhealthy, RunnerClosed


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
        #: Per instance, the batches handed to it and not finished: at most one running and
        #: one full batch queued behind it in its worker thread.
        self._running: list[list[list[QueuedRequest]]] = [[] for _ in executors]
        #: Batches handed to an instance so far.
        self.calls_started = 0
        #: Set while every instance is stuck: nothing can drain the queue.
        self.all_stuck = asyncio.Event()

    def open(self, on_change: Callable[[], None]) -> None:
        """Start the worker threads; ``on_change()`` when an instance gets stuck, and when a
        stuck one can work again."""
        self._on_change = on_change

        def changed() -> None:
            self.stuck_changed()
            on_change()
        for executor in self.executors:
            executor.on_stuck = executor.on_unstuck = changed
            executor.open()

    def idle(self) -> BatchExecutor | None:
        """An instance with no call, to start the next batch on now."""
        return self._with_calls(0)

    def ahead(self) -> BatchExecutor | None:
        """An instance with one call running, to queue a full batch behind it in its thread."""
        return self._with_calls(1)

    def _with_calls(self, calls: int) -> BatchExecutor | None:
        for index, executor in enumerate(self.executors):
            if len(self._running[index]) == calls and not executor.stuck.is_set():
                return executor
        return None

    @property
    def busy(self) -> bool:
        return any(self._running)

    def waiting(self) -> int:
        """Requests in batches queued behind a running call: admitted, not yet running."""
        return sum(1 for batches in self._running for batch in batches[1:] for request in batch
                   if not request.future.done())

    def in_flight(self) -> list[QueuedRequest]:
        return [request for batches in self._running for batch in batches for request in batch]

    def start(self, executor: BatchExecutor, batch: list[QueuedRequest],
              done: Callable[[list[QueuedRequest], float, float | None,
                              Callable[[], None] | None], None]) -> None:
        """Run ``batch`` on ``executor`` (now, or after the call it runs); then, in the callback
        that brings its result, ``done(batch, started, model_seconds, write_answers)``,
        ``started`` on the loop's clock when its call began (a batch queued behind a running
        call starts when that call ends; its wait there is queue time, as Triton counts it),
        also stamped on each request (see :meth:`BatchExecutor.start`); ``write_answers``
        None when the batch did not run (queued behind a call that got stuck)."""
        running = self._running[self.executors.index(executor)]
        handed = asyncio.get_running_loop().time()
        running.append(batch)
        self.calls_started += 1

        def finished(model_seconds: float | None,
                     write_answers: Callable[[], None] | None,
                     waited_seconds: float = 0.0) -> None:
            started = handed + waited_seconds
            for request in batch:
                request.started = started
            running.remove(batch)
            self._on_change()  # the batch behind it (if any) runs now: the queue is shorter
            if write_answers is None:
                done(batch, started, None, None)
                return

            def write_every_answer() -> None:
                write_answers()
                for request in batch:  # a batch that died with a bug of ours is answered too
                    if not request.future.done():
                        answer(request, executor.stats, error=RunnerClosed(
                            f"model {self.executors[0].name!r} failed to run this request; "
                            "see the server log"))
            done(batch, started, model_seconds, write_every_answer)
        executor.start(batch, finished)

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

    def close(self) -> None:
        for executor in self.executors:
            executor.close()
