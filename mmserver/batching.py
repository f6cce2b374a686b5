"""Request batching: the book's ``ModelRunner``, rebuilt without its defects.

Many clients each send a few rows; a model is far cheaper per row when it sees
many rows at once. A ``ModelRunner`` owns one model, queues the requests that
arrive for it, concatenates compatible ones along dimension 0 into one batch,
runs the model once in a worker thread and hands each request back exactly its
own rows.

The knobs (each per runner, so per model):

``max_batch_size`` (default 16, rows)
    The most rows one model call sees. A request with more rows than this runs
    alone; it is never split and never refused. Larger batches raise
    throughput until the model stops getting cheaper per row, and raise the
    latency of every request in the batch by the extra compute.
``max_wait`` (default 0.005 s)
    How long the *oldest* queued request may wait for company before its batch
    runs anyway, measured from its arrival on the loop's monotonic clock.
    0 means never wait for company. It adds at most ``max_wait`` to the
    latency of a request that arrives at a quiet moment.
``max_queue_size`` (default 256, requests)
    Requests admitted but not yet taken into a batch. When it is full,
    :meth:`ModelRunner.reserve` and :meth:`ModelRunner.submit` raise
    :class:`QueueFull` at once, before any work is done for that request, so
    an overloaded server sheds load instead of growing an unbounded backlog.
``policy`` (default ``"greedy"``)
    ``"timer"`` is the book's rule: a batch runs when ``max_batch_size`` rows
    are queued or the oldest request has waited ``max_wait``.
    ``"greedy"`` runs whatever is queued as soon as the model is idle; while
    the model is busy, requests accumulate and form the next batch. It waits
    for company (at most ``max_wait``) only for requests that are known to be
    on their way: admitted with :meth:`ModelRunner.reserve` and still being
    decoded. A lone request to an idle model never waits. With
    ``max_wait = 0`` this is Triton's default dynamic batcher.

Guarantees, whatever the policy:

* Only inputs with the same shape beyond dimension 0, the same dtype and the
  same device share a batch; the oldest queued request decides which.
* A request whose caller was cancelled (the client went away) is dropped
  before its batch is formed.
* If the batched call raises, the runner does not die: the batch is retried
  request by request, so only the failing requests fail. An out-of-memory
  batch is retried in halves before a single request is declared too big.
* Every submitted request is answered exactly once: its result, an exception,
  or :class:`QueueFull`. Stopping the runner answers everything it accepted.
* The model runs in a worker thread under ``torch.inference_mode()``, never on
  the event loop.

This module imports nothing else of the package and no web framework, so a
notebook can run it on its own.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "BatchRecord",
    "BatchingError",
    "ModelError",
    "ModelOutOfMemory",
    "ModelRunner",
    "POLICIES",
    "QueueFull",
    "Reservation",
    "RunnerClosed",
    "RunnerStats",
    "summarize_error",
]

log = logging.getLogger(__name__)

POLICIES = ("greedy", "timer")


class BatchingError(Exception):
    """Base class of the errors a runner hands back to a caller."""


class QueueFull(BatchingError):
    """The queue holds ``max_queue_size`` requests; come back later."""

    def __init__(self, message: str, retry_after_seconds: float):
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class RunnerClosed(BatchingError):
    """The runner is stopping or stopped and accepts no new requests."""


class ModelError(BatchingError):
    """The model raised on this request (its own rows, run alone)."""


class ModelOutOfMemory(ModelError):
    """The model ran out of memory even on this request alone."""


@dataclasses.dataclass(frozen=True)
class BatchRecord:
    """What one model call did; handed to listeners after every batch."""

    rows: int
    requests: int
    queue_wait_seconds: tuple[float, ...]
    compute_seconds: float
    failed_requests: int


@dataclasses.dataclass
class RunnerStats:
    """Plain running totals; exporters (Prometheus, notebooks) read them."""

    requests_submitted: int = 0
    requests_completed: int = 0
    requests_failed: int = 0
    requests_rejected: int = 0
    requests_cancelled: int = 0
    batches: int = 0
    rows: int = 0
    batch_size_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    queue_wait_seconds_total: float = 0.0
    compute_seconds_total: float = 0.0

    @property
    def mean_batch_size(self) -> float:
        """Mean rows per model call (0 before the first batch)."""
        return self.rows / self.batches if self.batches else 0.0


@dataclasses.dataclass(eq=False)
class _Request:
    data: torch.Tensor
    future: asyncio.Future
    arrival: float
    rows: int
    key: tuple


def _batch_key(data: torch.Tensor) -> tuple:
    return (tuple(data.shape[1:]), data.dtype, data.device)


def _is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, (MemoryError, torch.OutOfMemoryError))


def _split_rows(output: Any, sizes: Sequence[int]) -> list[Any]:
    """Cut a batched output back into per-request pieces along dimension 0."""
    if isinstance(output, torch.Tensor):
        if output.dim() == 0 or output.shape[0] != sum(sizes):
            raise ModelError(
                f"the model returned shape {tuple(output.shape)} for a batch of "
                f"{sum(sizes)} rows; its output must have one row per input row"
            )
        return list(torch.split(output, list(sizes)))
    if isinstance(output, Mapping):
        parts = {k: _split_rows(v, sizes) for k, v in output.items()}
        return [{k: parts[k][i] for k in parts} for i in range(len(sizes))]
    if isinstance(output, (tuple, list)):
        parts = [_split_rows(v, sizes) for v in output]
        return [type(output)(p[i] for p in parts) for i in range(len(sizes))]
    raise ModelError(
        f"the model returned {type(output).__name__}; expected a tensor "
        "(or a tuple, list or dict of tensors) with one row per input row"
    )


def _to_cpu(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.detach().cpu()
    if isinstance(output, Mapping):
        return {k: _to_cpu(v) for k, v in output.items()}
    if isinstance(output, (tuple, list)):
        return type(output)(_to_cpu(v) for v in output)
    return output


class Reservation:
    """A queue slot taken before the request body is decoded.

    The server reserves first, so a full queue answers 503 before it spends
    time reading and decoding a body it would throw away. The slot is given
    back by :meth:`submit` or :meth:`release` (also on leaving a ``with``).
    """

    def __init__(self, runner: ModelRunner):
        self._runner = runner
        self._open = True

    async def submit(self, data: torch.Tensor) -> Any:
        """Queue the decoded input in this slot and await its output rows."""
        if not self._open:
            raise RuntimeError("this reservation was already used")
        self._open = False
        self._runner._reserved -= 1
        return await self._runner._enqueue(data)

    def release(self) -> None:
        """Give the slot back without submitting (decoding failed, say)."""
        if self._open:
            self._open = False
            self._runner._reserved -= 1
            self._runner._wakeup.set()

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


class ModelRunner:
    """Queue requests for one model and run them in batches.

    ``model`` is any callable from a batch tensor to a tensor (or a tuple,
    list or dict of tensors) with one row per input row. ``device`` is where
    batches are moved before the call (default: where the model's parameters
    are; a plain function gets its inputs where they are); outputs come back
    on the CPU.

    Use it from one event loop::

        runner = ModelRunner(model, max_batch_size=16, max_wait=0.005)
        await runner.start()
        rows = await runner.submit(torch.randn(1, 3, 64, 64))
        await runner.stop()
    """

    def __init__(
        self,
        model: Callable[[torch.Tensor], Any],
        *,
        max_batch_size: int = 16,
        max_wait: float = 0.005,
        max_queue_size: int = 256,
        policy: str = "greedy",
        device: torch.device | str | None = None,
        name: str = "model",
    ):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if not (max_wait >= 0 and math.isfinite(max_wait)):
            raise ValueError(f"max_wait must be a finite number of seconds >= 0, got {max_wait}")
        if max_queue_size < 1:
            raise ValueError(f"max_queue_size must be at least 1, got {max_queue_size}")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.model = model
        self.max_batch_size = int(max_batch_size)
        self.max_wait = float(max_wait)
        self.max_queue_size = int(max_queue_size)
        self.policy = policy
        self.device = torch.device(device) if device is not None else _parameters_device(model)
        self.name = name
        self.stats = RunnerStats()
        self._listeners: list[Callable[[BatchRecord], None]] = []
        self._queue: collections.deque[_Request] = collections.deque()
        self._reserved = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closing = False
        self._in_flight: list[_Request] = []

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Start the batching task on the running loop (idempotent)."""
        if self._task is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._wakeup = asyncio.Event()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"mmserver-{self.name}"
        )
        self._closing = False
        self._task = asyncio.create_task(self._run(), name=f"ModelRunner[{self.name}]")

    async def stop(self) -> None:
        """Refuse new requests, answer every accepted one, then stop.

        Requests already queued run without waiting for company; open
        reservations may still submit until they are used or released.
        """
        if self._task is None:
            return
        self._closing = True
        self._wakeup.set()
        try:
            await asyncio.shield(self._task)
        finally:
            self._executor.shutdown(wait=False)
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

    def add_listener(self, listener: Callable[[BatchRecord], None]) -> None:
        """Call ``listener(record)`` on the loop after every model call."""
        self._listeners.append(listener)

    # -- admission -----------------------------------------------------------

    def reserve(self) -> Reservation:
        """Take a queue slot now, or raise :class:`QueueFull` at once."""
        self._admit()
        self._reserved += 1
        return Reservation(self)

    async def submit(self, data: torch.Tensor) -> Any:
        """Queue ``data`` (rows along dimension 0) and await its output rows."""
        self._admit()
        return await self._enqueue(data)

    def _admit(self) -> None:
        if not self.running:
            raise RunnerClosed(f"model {self.name!r} is not accepting requests")
        if self.queue_depth >= self.max_queue_size:
            self.stats.requests_rejected += 1
            raise QueueFull(
                f"model {self.name!r} has {self.queue_depth} requests queued "
                f"(max_queue_size={self.max_queue_size})",
                retry_after_seconds=self._estimated_drain_seconds(),
            )

    def _estimated_drain_seconds(self) -> float:
        per_batch = (
            self.stats.compute_seconds_total / self.stats.batches if self.stats.batches else 0.1
        )
        batches_ahead = math.ceil(self.queue_depth / self.max_batch_size)
        return max(1.0, batches_ahead * per_batch)

    async def _enqueue(self, data: torch.Tensor) -> Any:
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"a request must be a torch.Tensor, got {type(data).__name__}")
        if data.dim() == 0:
            raise ValueError("a request must have a batch dimension (dimension 0 counts rows)")
        if self._task is None:
            raise RunnerClosed(f"model {self.name!r} is not accepting requests")
        request = _Request(
            data=data,
            future=self._loop.create_future(),
            arrival=self._loop.time(),
            rows=int(data.shape[0]),
            key=_batch_key(data),
        )
        self._queue.append(request)
        self.stats.requests_submitted += 1
        self._wakeup.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            if request in self._queue:
                self._queue.remove(request)
                self._wakeup.set()
            if request.future.cancelled():  # else it was answered just before the cancel
                self.stats.requests_cancelled += 1
            raise

    # -- the batching loop ---------------------------------------------------

    async def _run(self) -> None:
        try:
            while True:
                self._wakeup.clear()
                self._drop_cancelled()
                if self._closing and not self._queue and self._reserved == 0:
                    return
                timeout = self._seconds_until_batch()
                if timeout is None:
                    await self._wakeup.wait()
                elif timeout > 0:
                    try:
                        await asyncio.wait_for(self._wakeup.wait(), timeout)
                    except TimeoutError:
                        pass
                else:
                    batch = self._take_batch()
                    if batch:
                        await self._execute(batch)
        finally:
            self._fail_leftovers()

    def _drop_cancelled(self) -> None:
        if any(r.future.done() for r in self._queue):
            self._queue = collections.deque(r for r in self._queue if not r.future.done())

    def _compatible_rows(self) -> int:
        oldest = self._queue[0]
        rows = 0
        for request in self._queue:
            if request.key == oldest.key:
                rows += request.rows
                if rows >= self.max_batch_size:
                    break
        return rows

    def _seconds_until_batch(self) -> float | None:
        """0 to run a batch now, a timeout to wait at most, None to wait for news."""
        if not self._queue:
            return None
        if self._closing or self._compatible_rows() >= self.max_batch_size:
            return 0.0
        waited = self._loop.time() - self._queue[0].arrival
        remaining = self.max_wait - waited
        if self.policy == "greedy" and self._reserved == 0:
            return 0.0
        return remaining if remaining > 0 else 0.0

    def _take_batch(self) -> list[_Request]:
        oldest = self._queue.popleft()
        batch, rows, kept = [oldest], oldest.rows, collections.deque()
        while self._queue:
            request = self._queue.popleft()
            if request.key == oldest.key and rows + request.rows <= self.max_batch_size:
                batch.append(request)
                rows += request.rows
            else:
                kept.append(request)
        self._queue = kept
        return batch

    async def _execute(self, batch: list[_Request]) -> None:
        now = self._loop.time()
        waits = tuple(now - r.arrival for r in batch)
        started = time.perf_counter()
        self._in_flight = batch  # answered by _fail_leftovers if the task dies mid-batch
        await self._run_isolated(batch)
        self._in_flight = []
        compute = time.perf_counter() - started
        failed = sum(1 for r in batch if r.future.done() and not r.future.cancelled()
                     and r.future.exception() is not None)
        record = BatchRecord(
            rows=sum(r.rows for r in batch),
            requests=len(batch),
            queue_wait_seconds=waits,
            compute_seconds=compute,
            failed_requests=failed,
        )
        self._record(record)

    async def _run_isolated(self, batch: list[_Request]) -> None:
        """Run ``batch``; on failure retry smaller so only failing requests fail."""
        live = [r for r in batch if not r.future.done()]
        if not live:
            return
        try:
            outputs = await self._loop.run_in_executor(
                self._executor, self._call_model, [r.data for r in live]
            )
        except Exception as error:  # noqa: BLE001 - any model error is the request's answer
            if len(live) == 1:
                self._answer(live[0], error=_as_model_error(error, self.name))
                return
            log.warning("model=%s batch of %d requests failed (%s); retrying smaller",
                        self.name, len(live), error.__class__.__name__)
            if _is_out_of_memory(error):
                half = len(live) // 2
                await self._run_isolated(live[:half])
                await self._run_isolated(live[half:])
            else:
                for request in live:
                    await self._run_isolated([request])
            return
        for request, output in zip(live, outputs):
            self._answer(request, result=output)

    def _call_model(self, inputs: list[torch.Tensor]) -> list[Any]:
        """Runs in the worker thread: concatenate, move, call, move back, split."""
        with torch.inference_mode():
            batch = inputs[0] if len(inputs) == 1 else torch.cat(inputs, dim=0)
            if self.device is not None:
                batch = batch.to(self.device, non_blocking=True)
            output = self.model(batch)
            return _split_rows(_to_cpu(output), [x.shape[0] for x in inputs])

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
        stats = self.stats
        stats.batches += 1
        stats.rows += record.rows
        stats.batch_size_counts[record.rows] += 1
        stats.queue_wait_seconds_total += sum(record.queue_wait_seconds)
        stats.compute_seconds_total += record.compute_seconds
        for listener in self._listeners:
            try:
                listener(record)
            except Exception:  # noqa: BLE001 - a broken exporter must not stop serving
                log.exception("model=%s batch listener failed", self.name)

    def _fail_leftovers(self) -> None:
        """If the loop task ends any other way than stop(), nobody may be left waiting."""
        leftovers = [*self._in_flight, *self._queue]
        self._in_flight, self._queue = [], collections.deque()
        for request in leftovers:
            self._answer(request, error=RunnerClosed(f"model {self.name!r} stopped"))


def _as_model_error(error: BaseException, name: str) -> ModelError:
    if isinstance(error, ModelError):
        return error
    kind = ModelOutOfMemory if _is_out_of_memory(error) else ModelError
    wrapped = kind(
        f"model {name!r} failed: {error.__class__.__name__}: {summarize_error(error)}")
    wrapped.__cause__ = error
    return wrapped


#: Longest error message handed back to a client; the full one stays in the exception chain.
MAX_ERROR_MESSAGE_CHARS = 500


def summarize_error(error: BaseException) -> str:
    """The line of an error's message that says what went wrong, short enough for a client.

    TorchScript puts that line last, under a long trace with the server's file paths.
    """
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    last = lines[-1]
    prefix = f"{error.__class__.__name__}: "
    if last.startswith(prefix):
        last = last[len(prefix):]
    return last[:MAX_ERROR_MESSAGE_CHARS]


def _parameters_device(model: Any) -> torch.device | None:
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        try:
            return next(iter(parameters())).device
        except (StopIteration, TypeError, RuntimeError):
            pass
    return None
