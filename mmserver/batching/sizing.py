"""Which batch size serves the most rows per second, learned from the model's own calls.

``max_batch_size`` is a ceiling, and the largest batch is not always the
fastest per row. On a GPU a batch of 32 costs little more than a batch of 1,
so filling the batch is right. On a CPU a large batch's activations can cost
more per row than a small one's: they may outgrow the caches, or, past glibc's
32 MiB mmap ceiling (or with ``MMSERVER_TUNE_MALLOC=0``, see
``mmserver/allocator.py``), be mapped afresh and faulted in on every call.
Untuned, the small CNN of ``bench/peers.py`` ran a batch of 8 in 2.2 ms
(3,700 rows/s) and a batch of 16 in 5.8 ms (2,750 rows/s) on one core. A
server that always fills 16 rows then serves fewer requests *and* answers
each later. Where the largest batch is also the fastest, the sizer finds that
too and stays there.

With ``batch_sizing="measured"`` the runner asks a :class:`BatchSizer` how
many rows make a full batch. The sizer climbs a ladder of halvings of
``max_batch_size`` (16, 8, 4, 2, 1). It keeps a smoothed time per call for
each rung, taken from real batches of exactly that many rows, and stays on
its rung until a neighbour serves at least ``margin`` more rows per second.
Neighbours are measured by a probe: one full batch in ``probe_every`` is cut
to the next rung down or up, alternately. A probe costs at most one batch at
a neighbour's speed, so with the defaults it costs under 1/16 of throughput.
When the model is fastest at ``max_batch_size`` the sizer stays there and
behaves like ``batch_sizing="max"``, apart from those probes.

The sizer only decides when a batch counts as full. Below that size nothing
changes: greedy still runs whatever is queued when the model is free. It is
pure arithmetic on the records it is given, with no clock and no threads, so
``tests/test_sizing.py`` drives it with made-up timings.
"""

from __future__ import annotations

import collections


class BatchSizer:
    """Hill-climbing on the ladder ``max_batch_size, /2, /4, ... 1`` by measured rows/s.

    ``probe_every``: full batches per probe of a neighbouring rung (default 16).
    ``min_samples``: calls of a rung before its speed counts (default 3).
    ``smoothing``: weight of the newest call in a rung's mean time (default 0.25).
    ``margin``: how much faster a neighbour must be to move there (default 0.05, 5 %).
    """

    def __init__(self, max_batch_size: int, *, probe_every: int = 16, min_samples: int = 3,
                 smoothing: float = 0.25, margin: float = 0.05):
        self.ladder = sorted({max_batch_size >> k for k in range(max_batch_size.bit_length())})
        self.best = max_batch_size
        self.next_size = max_batch_size
        self.probe_every = probe_every
        self.min_samples = min_samples
        self.smoothing = smoothing
        self.margin = margin
        self.probes = 0
        self._seconds: dict[int, float] = {}
        self._samples: collections.Counter[int] = collections.Counter()
        self._full_batches = 0
        self._probe_below = False  # flipped before each probe: the first one goes below

    def rows_per_second(self, size: int) -> float | None:
        """The measured speed of ``size`` rows per call, once it has ``min_samples`` calls."""
        if self._samples[size] < self.min_samples:
            return None
        return size / self._seconds[size]

    def record(self, rows: int, seconds: float) -> None:
        """One successful model call of ``rows`` rows that took ``seconds``."""
        if rows in self.ladder and seconds > 0:
            previous = self._seconds.get(rows)
            self._seconds[rows] = seconds if previous is None else (
                previous + self.smoothing * (seconds - previous))
            self._samples[rows] += 1
        if rows >= self.next_size:
            self._full_batches += 1
        self.best = self._climb()
        self.next_size = self.best
        if self._full_batches >= self.probe_every:
            self._full_batches = 0
            probe = self._neighbour()
            if probe is not None:
                self.next_size = probe
                self.probes += 1

    def _beside(self) -> tuple[int | None, int | None]:
        """The rungs just below and just above the best (None past either end)."""
        rung = self.ladder.index(self.best)
        below = self.ladder[rung - 1] if rung > 0 else None
        above = self.ladder[rung + 1] if rung + 1 < len(self.ladder) else None
        return below, above

    def _neighbour(self) -> int | None:
        """The rung to probe next: below and above the best, in turn, below first."""
        below, above = self._beside()
        self._probe_below = not self._probe_below
        if below is not None and (self._probe_below or above is None):
            return below
        return above

    def _climb(self) -> int:
        current = self.rows_per_second(self.best)
        if current is None:
            return self.best
        fastest, speed = self.best, current * (1 + self.margin)
        for neighbour in self._beside():
            measured = None if neighbour is None else self.rows_per_second(neighbour)
            if measured is not None and measured > speed:
                fastest, speed = neighbour, measured
        return fastest
