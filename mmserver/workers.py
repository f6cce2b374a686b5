"""Worker threads that user code can never use to hold the process hostage.

``loop.run_in_executor`` with a ``ThreadPoolExecutor`` has two flaws for code
we do not control: its threads are joined when the interpreter exits, so a
``predict_fn`` that never returns keeps a stopped server alive for ever; and a
pool shared by everything is used up by a few calls that hang. A
:class:`WorkerPool` runs calls on *daemon* threads, so the process can always
exit, and each kind of work gets its own pool, so a stuck model only ever
holds its own threads.

The pools count the calls running in their threads (:func:`calls_running`), so
that a stopping server knows whether one is still inside a model's native code,
where Python's finalization must not find it (``cli.serve``). A call counts until
its thread has let go of everything it made: a tensor freed after finalization
began would abort the process just the same.

Exceptions that would end a thread or the process (``SystemExit`` from a
script's ``sys.exit()``, ``KeyboardInterrupt``) are handed back to the caller
as :class:`UserCodeExit`, an ordinary ``Exception``, so they fail the call that
raised them and nothing else.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import queue
import threading
from collections.abc import Callable
from typing import Any

_counter = itertools.count()
_running_lock = threading.Lock()
_running = 0


def calls_running() -> int:
    """How many calls are running in the threads of every pool of this process now."""
    with _running_lock:
        return _running


def _count_running(change: int) -> None:
    global _running
    with _running_lock:
        _running += change


class UserCodeExit(Exception):
    """User code raised ``SystemExit`` or ``KeyboardInterrupt``; the server stays up."""


def _deliver(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller gave up (timeout, cancelled client)
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _run_and_deliver(loop: asyncio.AbstractEventLoop, deliver: Callable[[Any, BaseException | None], None],
                     function: Callable[..., Any], args: tuple) -> None:
    """Run one call and hand its outcome to ``loop``; every reference the call made dies
    with this frame, while the call is still counted as running.

    Why it matters: a tensor freed by a daemon thread releases and retakes the interpreter
    lock inside torch's C++; if Python's finalization has begun meanwhile, the thread is
    unwound there, cannot pass the ``noexcept`` frame, and the C++ runtime aborts the
    process. A thread between calls, or leaving after :meth:`WorkerPool.close`, must hold
    nothing of the model's, and a stopping server (``exit_past_abandoned_calls``) must see
    it counted until it holds nothing.
    """
    result = error = None
    try:
        result = function(*args)
    except Exception as raised:  # noqa: BLE001 - the caller's answer
        error = raised
    except BaseException as raised:  # noqa: BLE001 - never end the thread or process
        error = UserCodeExit(f"{raised.__class__.__name__}: {raised}")
        error.__cause__ = raised
    try:
        loop.call_soon_threadsafe(deliver, result, error)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        pass


class WorkerPool:
    """``workers`` daemon threads taking calls in arrival order; threads start on first use."""

    def __init__(self, name: str, workers: int = 1):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.name = name
        self.workers = workers
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, function: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Schedule ``function(*args)``; await the returned future on the running loop."""
        future = asyncio.get_running_loop().create_future()
        self.run_then(functools.partial(_deliver, future), function, *args)
        return future

    def run_then(self, then: Callable[[Any, BaseException | None], None],
                 function: Callable[..., Any], *args: Any) -> None:
        """Schedule ``function(*args)``; then ``then(result, error)`` on the running loop, in
        the very callback that brings the result back: no future, so no second loop step
        (the batching runner starts a model's next call there)."""
        if self._closed:
            raise RuntimeError(f"worker pool {self.name!r} is closed")
        self._jobs.put((asyncio.get_running_loop(), then, function, args))
        if len(self._threads) < self.workers and self._jobs.qsize() > 0:
            self._start_thread()

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._work, daemon=True,
                                  name=f"mmserver-{self.name}-{next(_counter)}")
        self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            _count_running(1)
            try:
                _run_and_deliver(*job)
            finally:
                del job  # the call's arguments, freed while it still counts as running
                _count_running(-1)

    def close(self) -> None:
        """Let the threads end once their current call returns; a stuck one is abandoned."""
        self._closed = True
        for _ in self._threads:
            self._jobs.put(None)
