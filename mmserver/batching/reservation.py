"""The one way into a runner: a queue slot, then the request in it, then its answer.

Every caller goes through :meth:`ModelRunner.reserve`, which admits or refuses at once:

* the HTTP pipeline reserves once the body has arrived and before decoding it, so a
  request being decoded counts toward the queue (a full queue refuses the next one before
  its body is read) and ``greedy`` knows company is on its way;
* the engine reserves and submits at once, for rows an HTTP worker decoded;
* ``await runner.submit(x)`` is the same two steps for a notebook.

The answer comes on :attr:`Reservation.future` (the output rows, or the error); a caller
that gives up calls :meth:`Reservation.withdraw` (or cancels the future).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from mmserver.batching.pending import QueuedRequest


class Reservation:
    """One admitted request: a queue slot until :meth:`submit`, then its queued rows.

    The slot is given back by :meth:`submit` (the rows take its place), by
    :meth:`release` (also on leaving a ``with``) or by :meth:`withdraw`.
    """

    def __init__(self, enqueue: Callable[[Any, float | None], QueuedRequest],
                 give_back: Callable[[], None], leave: Callable[[QueuedRequest], None]):
        self._enqueue = enqueue
        self._give_back = give_back
        self._leave = leave
        self._open = True
        self._request: QueuedRequest | None = None

    @property
    def future(self) -> asyncio.Future | None:
        """The output rows, or the error, once :meth:`submit` queued the input."""
        return None if self._request is None else self._request.future

    @property
    def queued(self) -> QueuedRequest | None:
        """The request once :meth:`submit` queued it (its arrival, start and end times)."""
        return self._request

    def submit(self, data: Any, *, deadline: float | None = None) -> asyncio.Future:
        """Queue ``data`` (rows along dimension 0) in this slot; await the returned future for
        its output rows.

        ``deadline`` (the loop's clock): if no answer has come by then, the request leaves
        the queue (or its batch is answered without it) with :class:`InvocationTimeout`.
        Cancelling the future (or the task awaiting it) withdraws the request.
        """
        if not self._open:
            raise RuntimeError("this reservation was already used")
        self._open = False
        self._give_back()
        self._request = self._enqueue(data, deadline)
        return self._request.future

    def release(self) -> None:
        """Give the slot back without submitting (decoding failed, say)."""
        if self._open:
            self._open = False
            self._give_back()

    def withdraw(self) -> None:
        """The caller gave up: the slot is given back, or the queued request leaves the queue
        uncomputed (or its batch is answered without it) and counts as cancelled. Nothing
        changes once it was answered."""
        if self._request is None:
            self.release()
        elif self._request.future.cancel():
            self._leave(self._request)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
