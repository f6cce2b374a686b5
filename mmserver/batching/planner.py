"""The batching policy as a pure function: which queued requests run next, and when.

A :class:`BatchPlanner` looks at the queue and the clock and answers with a
:class:`Plan`: either the positions of the requests that form the next batch
now, or how long to sleep before asking again (``None``: until something
changes). It does no I/O, starts no threads and reads no clock of its own,
so the policy can be tested and shown in a notebook with made-up arrival
times, and ``ModelRunner`` stays a thin loop around it.

The rules (see ``mmserver.batching`` for the knobs):

* The oldest queued request leads; only requests with the same batch key
  (shape beyond dimension 0, dtype, device, structure) join it, in arrival
  order, while their rows fit in ``max_batch_size`` and, for a text model's
  rows (``sequences.py``), while the batch padded to its longest row holds at
  most ``max_batch_tokens`` tokens (rows x longest). A request larger than
  either budget runs alone (never split, never refused, never waiting).
* ``timer`` (the book's rule): run when the compatible rows fill a batch or the
  oldest has waited ``max_wait``.
* ``greedy``: run as soon as the model is free, unless requests are *on their
  way* (admitted, body still being decoded); then wait for them at most until
  the oldest has waited ``max_wait``.
* ``batch_sizing="measured"``: a batch is full at the size the runner's
  ``BatchSizer`` measured to serve the most rows per second (never more than
  ``max_batch_size``); see ``sizing.py``.
* Closing: run whatever is queued at once.
* Without concatenation (user code that is not row-wise) every request is a
  batch of its own, oldest first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence
from typing import Protocol

from mmserver.batching.sequences import padded_tokens


class Pending(Protocol):
    """What the planner needs to know of a queued request."""

    rows: int
    key: Hashable
    arrival: float
    #: The longest row, in tokens (0 for rows that are not token sequences); read only
    #: under a token budget (``max_batch_tokens``).
    longest: int


@dataclasses.dataclass(frozen=True)
class Plan:
    """``take``: queue positions of the next batch (empty: none yet); else sleep ``wait``."""

    take: tuple[int, ...] = ()
    wait: float | None = None
    #: ``take`` fills a batch (nothing to gain by waiting): worth queueing behind a running call.
    full: bool = dataclasses.field(default=False, compare=False)


WAIT_FOR_NEWS = Plan()


class BatchPlanner:
    def __init__(self, *, policy: str, max_batch_size: int, max_wait: float,
                 concatenate: bool = True, max_batch_tokens: int = 0):
        self.policy = policy
        self.max_batch_size = max_batch_size
        #: 0: no token budget.
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait
        self.concatenate = concatenate

    @classmethod
    def for_settings(cls, settings, concatenate: bool = True) -> BatchPlanner:
        """The planner of a runner with these knobs (a ``BatchSettings``)."""
        return cls(policy=settings.policy, max_batch_size=settings.max_batch_size,
                   max_wait=settings.max_wait, concatenate=concatenate,
                   max_batch_tokens=settings.max_batch_tokens)

    def plan(self, queue: Sequence[Pending], *, now: float, on_the_way: int = 0,
             closing: bool = False, batch_size: int | None = None) -> Plan:
        """The next step for ``queue`` (oldest first) at time ``now``.

        ``on_the_way`` counts requests admitted but not yet queued (still decoding).
        ``batch_size`` (at most ``max_batch_size``, its default) is how many rows
        make a full batch this time; the runner's ``BatchSizer`` chooses it.
        """
        if not queue:
            return WAIT_FOR_NEWS
        if not self.concatenate:
            return Plan(take=(0,))
        limit = self.max_batch_size if batch_size is None else min(batch_size,
                                                                   self.max_batch_size)
        batch = self.compatible(queue, limit)
        full = sum(queue[i].rows for i in batch) >= limit or self._tokens_full(queue, batch) or (
            len(batch) < len(queue) and self._next_would_overflow(queue, batch))
        if closing or full:
            return Plan(take=batch, full=full)
        if self.policy == "greedy" and on_the_way == 0:
            return Plan(take=batch)
        remaining = self.max_wait - (now - queue[0].arrival)
        if remaining <= 0:
            return Plan(take=batch)
        return Plan(wait=remaining)

    def compatible(self, queue: Sequence[Pending], limit: int) -> tuple[int, ...]:
        """Positions of the requests that would run with the oldest, up to ``limit`` rows."""
        oldest = queue[0]
        taken, rows = [0], oldest.rows
        budget = self.max_batch_tokens
        longest = oldest.longest if budget else 0
        for position in range(1, len(queue)):
            request = queue[position]
            if request.key != oldest.key or rows + request.rows > limit:
                continue
            if budget:
                if padded_tokens(rows + request.rows, max(longest, request.longest)) > budget:
                    continue
                longest = max(longest, request.longest)
            taken.append(position)
            rows += request.rows
        return tuple(taken)

    def _tokens_full(self, queue: Sequence[Pending], batch: tuple[int, ...]) -> bool:
        """The batch's padded tokens reach the budget: no request could join it."""
        if not self.max_batch_tokens:
            return False
        rows = sum(queue[i].rows for i in batch)
        longest = max(queue[i].longest for i in batch)
        return padded_tokens(rows, longest) >= self.max_batch_tokens

    def _next_would_overflow(self, queue: Sequence[Pending], batch: tuple[int, ...]) -> bool:
        """A compatible request is queued that does not fit: waiting longer cannot help."""
        oldest_key = queue[0].key
        chosen = set(batch)
        return any(queue[i].key == oldest_key for i in range(len(queue)) if i not in chosen)
