"""What a runner counts: one record per model call, and running totals over them.

The runner keeps these as plain numbers and hands every :class:`BatchRecord`
to its listeners; exporters (Prometheus in ``mmserver.metrics``, a notebook's
plots) read them, so the batching core needs no metrics library.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

from mmserver.batching.sequences import padded_tokens


@dataclasses.dataclass(frozen=True)
class BatchRecord:
    """What one model call did; handed to listeners after every batch."""

    rows: int
    requests: int
    queue_wait_seconds: tuple[float, ...]
    compute_seconds: float
    failed_requests: int
    #: Seconds from arrival to the end of the call, summed over the requests it answered
    #: with a result, and over those it answered with an error.
    completed_seconds: float = 0.0
    failed_seconds: float = 0.0
    #: A later call of the model was already running (or queued in its worker thread) when
    #: this batch's answers were written: the device did not wait on them.
    next_call_started: bool = False
    #: A text model's call (``sequences.py``): the rows' own tokens, and the tokens of the
    #: padded batch the model ran (rows x longest row); 0 for rows of one fixed shape.
    real_tokens: int = 0
    padded_tokens: int = 0


def batch_record(taken: Sequence[Any], started: float, now: float,
                 next_call_started: bool) -> BatchRecord | None:
    """The record of a model call from ``started`` to ``now`` on the loop's clock, over the
    requests of ``taken`` (queued requests, every one answered) that reached it (``ran``: a
    request withdrawn while its batch waited behind another call never did); None when none
    did, as no call was made. One pass over the batch: it runs after every call."""
    rows = tokens = longest = failed = 0
    waits: list[float] = []
    completed_seconds = failed_seconds = 0.0
    for request in taken:
        if not request.ran:
            continue
        rows += request.rows
        tokens += request.tokens
        longest = max(longest, request.longest)
        waits.append(started - request.arrival)
        future = request.future
        if future.cancelled():
            continue
        if future.exception() is None:
            completed_seconds += now - request.arrival
        else:
            failed += 1
            failed_seconds += now - request.arrival
    if not waits:
        return None
    return BatchRecord(
        rows=rows, requests=len(waits), queue_wait_seconds=tuple(waits),
        compute_seconds=now - started, failed_requests=failed,
        completed_seconds=completed_seconds, failed_seconds=failed_seconds,
        next_call_started=next_call_started, real_tokens=tokens,
        padded_tokens=padded_tokens(rows, longest))


#: The stages of a request answered with a result, as Triton's statistics name them.
STAGES = ("success", "queue", "compute_input", "compute_infer", "compute_output")


@dataclasses.dataclass
class RequestStages:
    """Requests answered with a result, once their answer is encoded, and their seconds per
    stage, summed (Triton's ``inference_stats``; docs/design.md section 10). One :meth:`add`
    per request moves every count together, so a reader between two requests (perf_analyzer
    reads before and after its window) always sees the counts equal, as Triton's are."""

    count: int = 0
    #: Seconds summed per stage of :data:`STAGES`, in that order.
    seconds: list[float] = dataclasses.field(default_factory=lambda: [0.0] * len(STAGES))

    def add(self, success: float, queue: float, compute_input: float, compute_infer: float,
            compute_output: float) -> None:
        self.count += 1
        totals = self.seconds
        totals[0] += success
        totals[1] += queue
        totals[2] += compute_input
        totals[3] += compute_infer
        totals[4] += compute_output

    def by_stage(self) -> dict[str, float]:
        return dict(zip(STAGES, self.seconds))


@dataclasses.dataclass
class RunnerStats:
    """Plain running totals; exporters (Prometheus, notebooks) read them."""

    requests_submitted: int = 0
    requests_completed: int = 0
    requests_failed: int = 0
    requests_rejected: int = 0
    requests_cancelled: int = 0
    #: Model calls by their number of rows.
    batch_size_counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    batches: int = 0
    rows: int = 0
    compute_seconds_total: float = 0.0
    #: Model-call seconds by the call's number of rows.
    batch_size_compute_seconds: collections.Counter = dataclasses.field(
        default_factory=collections.Counter)
    #: Requests that reached a model call, and their seconds queued before it, summed.
    requests_batched: int = 0
    queue_seconds_total: float = 0.0
    #: Each batched request counted with its whole call's seconds (Triton's compute_infer).
    request_compute_seconds_total: float = 0.0
    #: Requests a model call answered with an error, and the seconds from arrival to the end
    #: of the call summed over those and over the requests it answered with a result.
    requests_failed_in_calls: int = 0
    completed_seconds_total: float = 0.0
    failed_seconds_total: float = 0.0
    #: When the last model call ended, in seconds since the epoch (0 before the first).
    last_batch_unix: float = 0.0
    #: A text model's tokens over its calls: its rows' own, and what the padded batches held.
    real_tokens_total: int = 0
    padded_tokens_total: int = 0
    #: Requests answered with a result and encoded, per stage: recorded by whoever encodes
    #: the answer (the pipeline here, or an HTTP worker through the engine).
    stages: RequestStages = dataclasses.field(default_factory=RequestStages)

    def add(self, record: BatchRecord) -> None:
        self.batches += 1
        self.rows += record.rows
        self.batch_size_counts[record.rows] += 1
        self.compute_seconds_total += record.compute_seconds
        self.batch_size_compute_seconds[record.rows] += record.compute_seconds
        self.requests_batched += record.requests
        self.queue_seconds_total += sum(record.queue_wait_seconds)
        self.request_compute_seconds_total += record.compute_seconds * record.requests
        self.requests_failed_in_calls += record.failed_requests
        self.completed_seconds_total += record.completed_seconds
        self.failed_seconds_total += record.failed_seconds
        self.real_tokens_total += record.real_tokens
        self.padded_tokens_total += record.padded_tokens
        self.last_batch_unix = time.time()

    @property
    def padding_efficiency(self) -> float | None:
        """Real tokens / padded tokens over every call (1: no padding); None before a text
        model's first call, or for a model whose rows are not token sequences."""
        if not self.padded_tokens_total:
            return None
        return self.real_tokens_total / self.padded_tokens_total

    @property
    def requests_in_flight(self) -> int:
        """Requests accepted and not yet answered: queued, or in a model call.

        Every submitted request ends exactly one way (completed, failed, cancelled), so this
        is what a client or a test waits on to know the server holds its requests.
        """
        return (self.requests_submitted - self.requests_completed - self.requests_failed
                - self.requests_cancelled)

    @property
    def mean_batch_size(self) -> float:
        """Mean rows per model call (0 before the first batch)."""
        return self.rows / self.batches if self.batches else 0.0

    def drain_seconds(self, queue_depth: int, max_batch_size: int) -> float:
        """About how long ``queue_depth`` queued requests take to run (a client's Retry-After).

        At least 1 s; before the first batch a batch is taken to cost 0.1 s.
        """
        per_batch = self.compute_seconds_total / self.batches if self.batches else 0.1
        return max(1.0, math.ceil(queue_depth / max_batch_size) * per_batch)
