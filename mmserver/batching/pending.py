"""A runner's queue: requests admitted and not yet in a batch, and slots held for requests on
their way.

Everything that depends on the queue's depth (whether the runner admits, whether a batch is
due) must hear of every change. The queue tells one callback itself after each change, so no
caller has to remember to.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

from mmserver.batching.rows import batch_key, rows_of
from mmserver.batching.sequences import token_counts
from mmserver.batching.stats import RunnerStats
from mmserver.errors import InvocationTimeout


@dataclasses.dataclass(eq=False)
class QueuedRequest:
    """One submitted request: its input, its answer-to-be, and what the planner reads."""

    data: Any
    future: asyncio.Future
    arrival: float
    rows: int
    key: Any
    #: A text model's rows (``sequences.py``): real tokens, and the longest row's.
    tokens: int = 0
    longest: int = 0
    #: When its batch's call started and when it was answered with a result (the loop's
    #: clock; 0 until then): its queue and compute times, for whoever encodes the answer.
    started: float = 0.0
    ended: float = 0.0
    #: Set in the worker thread as its call starts: its rows reach the model.
    ran: bool = False

    @classmethod
    def of(cls, data: Any, future: asyncio.Future, arrival: float,
           concatenate: bool) -> QueuedRequest:
        """``data``'s rows, batch key and tokens, or one opaque row when requests are not
        row-wise."""
        if not concatenate:
            return cls(data, future, arrival, 1, None)
        if type(data) is torch.Tensor and data.dim() > 0:  # the common case: no tokens
            return cls(data, future, arrival, data.shape[0], batch_key(data))
        return cls(data, future, arrival, rows_of(data), batch_key(data), *token_counts(data))


def answer(request: QueuedRequest, stats: RunnerStats, *, result: Any = None,
           error: BaseException | None = None) -> None:
    """Answer ``request`` unless it already was (cancelled, expired), and count it."""
    if request.future.done():
        return
    if error is None:
        request.ended = request.future.get_loop().time()
        request.future.set_result(result)
        stats.requests_completed += 1
    else:
        request.future.set_exception(error)
        stats.requests_failed += 1


class _Expiry:
    """One timer for requests queued together with one deadline: at the deadline it expires
    those still waiting; it is cancelled once every one of them is answered."""

    __slots__ = ("waiting", "timer")

    def __init__(self, queue: RequestQueue, requests: list[QueuedRequest], deadline: float):
        self.waiting = len(requests)
        self.timer = asyncio.get_running_loop().call_at(deadline, queue.expire, requests)

    def settled(self) -> None:
        self.waiting -= 1
        if self.waiting == 0:
            self.timer.cancel()


class RequestQueue:
    """Queued requests, oldest first, and ``reserved`` slots (admitted, still decoding).

    A queued request leaves before its batch when its deadline passes (answered with
    :class:`InvocationTimeout`) or its future is cancelled (withdrawn, counted).
    """

    def __init__(self, name: str, stats: RunnerStats, on_change: Callable[[], None]):
        self.requests: list[QueuedRequest] = []
        self.reserved = 0
        self._name = name
        self._stats = stats
        self._on_change = on_change

    @property
    def depth(self) -> int:
        """Requests admitted and not yet taken into a batch."""
        return len(self.requests) + self.reserved

    def reserve(self) -> None:
        self.reserved += 1
        self._on_change()

    def give_back(self) -> None:
        self.reserved -= 1
        self._on_change()

    def put(self, request: QueuedRequest, deadline: float | None = None) -> None:
        """Queue ``request``; ``deadline`` on the loop's clock, or None."""
        self.put_many([request], deadline)

    def put_many(self, requests: list[QueuedRequest], deadline: float | None = None,
                 answered: Callable[[int, QueuedRequest], None] | None = None) -> None:
        """Queue ``requests`` in order, with one deadline for all (the loop's clock, or None):
        one timer and one change, however many arrived together. ``answered(position,
        request)``, when given, runs in the queue's own callback once each one's future is
        done, after the queue has let it go: one callback a request, not two."""
        self._stats.requests_submitted += len(requests)
        expiry = None if deadline is None else _Expiry(self, requests, deadline)
        settled = self._settled
        for position, request in enumerate(requests):
            request.future.add_done_callback(
                functools.partial(settled, request, expiry, answered, position))
        self.requests.extend(requests)
        self._on_change()

    def _settled(self, request: QueuedRequest, expiry: _Expiry | None,
                 answered: Callable[[int, QueuedRequest], None] | None, position: int,
                 future: asyncio.Future) -> None:
        if expiry is not None:
            expiry.settled()
        if future.cancelled():  # withdrawn: it leaves the queue uncomputed
            self._stats.requests_cancelled += 1
            self.remove(request)
        if answered is not None:
            answered(position, request)

    def expire(self, requests: list[QueuedRequest]) -> None:
        """Their deadline passed: those still waiting are answered with
        :class:`InvocationTimeout` and leave the queue at once."""
        expired = [r for r in requests if not r.future.done()]
        if not expired:  # all answered: the queue is as it was
            return
        for request in expired:
            answer(request, self._stats, error=InvocationTimeout(
                f"model {self._name!r} did not answer before the request's deadline"))
        gone = set(expired)
        self.requests = [r for r in self.requests if r not in gone]
        self._on_change()

    def put_back(self, requests: list[QueuedRequest]) -> None:
        """Requests taken into a batch that did not run go back to the front, in order."""
        self.requests[:0] = [r for r in requests if not r.future.done()]
        self._on_change()

    def remove(self, request: QueuedRequest) -> None:
        """A request answered before its batch (cancelled, expired) frees its place at once
        (here, or in a batch queued behind a running call)."""
        if request in self.requests:
            self.requests.remove(request)
        self._on_change()

    def drop_answered(self) -> None:
        if any(r.future.done() for r in self.requests):
            self.requests = [r for r in self.requests if not r.future.done()]
            self._on_change()

    def take(self, positions: tuple[int, ...]) -> list[QueuedRequest]:
        chosen = set(positions)
        batch = [self.requests[i] for i in positions]
        self.requests = [r for i, r in enumerate(self.requests) if i not in chosen]
        self._on_change()
        return batch

    def clear(self) -> list[QueuedRequest]:
        requests, self.requests = self.requests, []
        if requests:
            self._on_change()
        return requests
