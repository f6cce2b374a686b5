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
        self.last_batch_unix = time.time()

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
