"""Whether a runner admits a request now, and one listener told whenever that changes kind.

A runner refuses for one of three reasons: it is not running (:class:`RunnerClosed`),
every instance is stuck (:class:`ModelUnhealthy`), or its queue is full
(:class:`QueueFull`). The engine tells its HTTP workers each change, so that they refuse
before reading a body, as one process does. The runner calls :meth:`Admission.changed`
from the one place where its state changes are heard (its queue's and its instances'
callbacks, start and stop); the watch compares kinds once per loop turn and reports only
a change.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mmserver.batching.settings import BatchSettings
from mmserver.batching.stats import RunnerStats
from mmserver.errors import MMServerError, ModelUnhealthy, QueueFull, RunnerClosed


class Admission:
    """Whether the runner admits now (:meth:`refusal`), and one listener told of each change of
    kind (:meth:`watch`)."""

    def __init__(self, name: str, settings: BatchSettings, stats: RunnerStats,
                 running: Callable[[], bool], depth: Callable[[], int],
                 unhealthy: Callable[[], ModelUnhealthy | None]):
        self._name, self._settings, self._stats = name, settings, stats
        self._running, self._depth, self._unhealthy = running, depth, unhealthy
        self._listener: Callable[[MMServerError | None], None] | None = None
        self._reported: MMServerError | None = None
        self._scheduled = False

    def refusal(self) -> MMServerError | None:
        if not self._running():
            return RunnerClosed(f"model {self._name!r} is not accepting requests")
        unhealthy = self._unhealthy()
        if unhealthy is not None:
            return unhealthy
        depth, settings = self._depth(), self._settings
        if depth < settings.max_queue_size:
            return None
        return QueueFull(f"model {self._name!r} has {depth} requests queued "
                         f"(max_queue_size={settings.max_queue_size})",
                         retry_after_seconds=self._stats.drain_seconds(
                             depth, settings.max_batch_size))

    def check(self) -> None:
        """Raise the refusal, if any; a full queue's counts as a rejected request."""
        refusal = self.refused(1)
        if refusal is not None:
            raise refusal

    def room(self) -> int:
        """How many requests in a row the runner admits now (0 while it refuses): what as many
        :meth:`check` calls in a row, each followed by a queued request, would let in."""
        if not self._running() or self._unhealthy() is not None:
            return 0
        return max(0, self._settings.max_queue_size - self._depth())

    def refused(self, requests: int) -> MMServerError | None:
        """The refusal, if any, of ``requests`` asking now, each counted as :meth:`check`
        counts one."""
        refusal = self.refusal()
        if isinstance(refusal, QueueFull):
            self._stats.requests_rejected += requests
        return refusal

    def watch(self, listener: Callable[[MMServerError | None], None]) -> None:
        """Call ``listener(refusal)`` on the loop each time :meth:`refusal` changes kind: the
        queue filled (:class:`QueueFull`), the model got stuck (:class:`ModelUnhealthy`), the
        runner stopped, or it admits again (None). Changes within one turn of the loop are
        reported once, at its end."""
        self._listener = listener
        self._reported = None

    def changed(self) -> None:
        """Something admission depends on changed: compare at the end of this loop turn."""
        if self._listener is not None and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._report)

    def _report(self) -> None:
        self._scheduled = False
        refusal = self.refusal()
        if type(refusal) is not type(self._reported):
            self._reported = refusal
            self._listener(refusal)
