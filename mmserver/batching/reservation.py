"""A queue slot taken once a request's body has arrived, before it is decoded."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


class Reservation:
    """A queue slot taken before the request body is decoded.

    The server reserves once the body has arrived and before decoding it, so a
    request that is being decoded counts toward the queue and ``greedy`` knows
    company is on its way. The slot is given back by :meth:`submit` or
    :meth:`release` (also on leaving a ``with``).
    """

    def __init__(self, enqueue: Callable[[Any, float | None], Any],
                 give_back: Callable[[], None]):
        self._enqueue = enqueue
        self._give_back = give_back
        self._open = True

    def submit(self, data: Any, *, deadline: float | None = None) -> Awaitable[Any]:
        """Queue the decoded input in this slot; await the result for its output rows.

        A plain method returning the runner's coroutine: one coroutine less to resume
        on every request's way back.
        """
        if not self._open:
            raise RuntimeError("this reservation was already used")
        self._open = False
        self._give_back()
        return self._enqueue(data, deadline)

    def release(self) -> None:
        """Give the slot back without submitting (decoding failed, say)."""
        if self._open:
            self._open = False
            self._give_back()

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
