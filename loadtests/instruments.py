"""The lesson's instruments: each quantity measured one way, returned as a typed record.

``loadtests.definitions`` says what a quantity *is* (a formula over numbers); an instrument
here is the whole *procedure* that produces those numbers: what is timed, on which model file,
at which batch sizes, with which clock, how many repeats, and what spread is reported. Every
notebook measures through these functions, so that ``t_http`` or resnet18's ``t(1)`` is one
number in all of them, and ``tests/test_instruments.py`` runs each against a system whose
truth is known (the simulated device with a chosen t(b), ``mmserver.harness.known_cost``'s
model of known CPU cost) and checks it recovers that truth within the tolerance its docstring
states.

Every instrument returns a :class:`Measurement`: quantity, model, value, unit, spread (lowest
and highest over the repeats), repeats, the *conditions* it was measured under (compared by
the run's ledger, ``loadtests.ledger``) and *context* (what was observed alongside, e.g. the
mean batch the server formed, printed but not compared).

The model alone (in this process):

* :func:`time_calls` times one model at *every* size of :func:`profile_sizes` up to ``B``
  (powers of two and ``B`` itself, none skipped: the offline ceiling is a maximum over them),
  interleaved, in rounds, with a named clock: ``"wall"`` (``time.perf_counter``: what a
  device that holds no CPU costs, e.g. the simulated GPU) or ``"cpu"`` (``time.thread_time``:
  what a call costs its core, whatever else the machine runs). A path loads the TorchScript
  file the server runs (``model.pt`` of a model folder), never an eager copy of it.
* :func:`call_time`, :func:`cost_line`, :func:`fixed_share`, :func:`lone_call`,
  :func:`offline_ceiling`, :func:`speedup` and :func:`speedup_over_t1` read a
  :class:`CallTimes`; each value from the medians over all rounds, each spread from the same
  formula applied round by round.

The server (one ``mmserver serve`` process on core 0, the clients on core 1):

* :func:`saturate` drives each model with closed-loop keep-alive clients, in rounds, and reads
  the server's own counts (``/metrics`` deltas) and its process's CPU seconds over a window
  inside the load: a :class:`ServerRun` per model. Given ``processes`` (a server with HTTP
  workers), it counts every process's CPU, each on its own.
* :func:`t_http`, :func:`capacity`, :func:`served`, :func:`served_per_cpu_second`,
  :func:`busy_fraction`, :func:`core_share`, :func:`device_time_per_request` read a
  :class:`ServerRun`; :func:`serial_limit`,
  :func:`efficiency`, :func:`served_gain` and :func:`server_added` combine records.
* :func:`bursts` sends bursts of concurrent requests to an idle model (far below capacity),
  servers taking turns, and reads every request's latency at the client and the server's
  counts per burst: a :class:`BurstRun`. :func:`mean_batch`, :func:`queue_wait` and
  :func:`device_time_per_request` read a :class:`BurstRun` as they read a :class:`ServerRun`;
  :func:`answer_latency` reads the first, median or last answer of each burst.

* :func:`sweep_point` reads one open-loop point of ``python -m loadtests.sweep`` (or of
  ``loadtests.shared_device``) as records; :func:`over_repeats` combines repeats of a point.
* :func:`queueing_cost` gives ``loadtests.queueing`` its ``t(b)``: the line, with the
  *measured* t(1) for a batch of one.

A batching runner alone (notebooks 02 and 03, on the notebook's own event loop):

* :func:`timer_delay` times ``loop.call_at`` timers from arming to the waiting coroutine's
  wake-up, and whether a cancelled one fires.
* :func:`scripted_clients` runs a script of clients against a runner's entry point and matches
  each answer to the model call that held it: a :class:`Timeline`. :func:`queue_wait`,
  :func:`refusal_time`, :func:`latency`, :func:`own_rows` and :func:`batch_sizes` read it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

if not __package__:  # locust -f loadtests imports each file on its own, from anywhere
    import _repo_path  # noqa: F401

from loadtests import definitions

CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}
SERVER_CPU_CLOCK = "server process CPU (user + system, every thread)"


# -- the record ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One measured quantity: what, of which model, under which conditions, how much, how sure.

    ``spread`` is (lowest, highest) of the quantity over the ``repeats`` (rounds or windows);
    ``conditions`` the settings that define what was measured (two records of one quantity
    are comparable only under the same conditions); ``context`` what was observed alongside.
    Both are stored as sorted (name, value) pairs, so a record is hashable and JSON-able.
    """

    quantity: str
    model: str
    value: float
    unit: str
    spread: tuple[float, float]
    repeats: int
    conditions: tuple[tuple[str, Any], ...] = ()
    context: tuple[tuple[str, Any], ...] = ()
    #: What the ``repeats`` are, in the plural: windows or passes of one setting (``repeats``),
    #: or the items of one run the spread runs over (``answered clients``, ``calls``).
    over: str = "repeats"
    #: The value of each repeat, where the instrument kept them: what a rank test over the
    #: repeats reads (``definitions.rank_chance``); empty where only the range was kept.
    samples: tuple[float, ...] = ()

    @property
    def where(self) -> dict[str, Any]:
        return dict(self.conditions)

    @property
    def observed(self) -> dict[str, Any]:
        return dict(self.context)

    def describe(self) -> str:
        """One line, e.g. ``t_http of noop: 131 µs (120–140 µs over 3 repeats; clock=...)``, or
        ``(98% in each of 3 repeats; ...)`` when the range's two ends print the same."""
        text = f"{self.quantity} of {self.model}: {self._value_text()}"
        text += f" ({self.spread_text() if self.repeats > 1 else self.counted()}"
        details = [f"{k}={v}" for k, v in self.conditions + self.context]
        return text + ("; " + ", ".join(details) if details else "") + ")"

    def shown(self, scale_of: float | None = None, decimals: int | None = None) -> str:
        """The value as a sentence prints it, with its range when it has repeats:
        ``164 µs (148–185 µs over 3 repeats)``, ``155 µs (155 µs in each of 3 repeats)``.
        ``scale_of``: a magnitude whose unit (s, ms or µs) to write seconds in, so that records
        set side by side in one sentence share a unit (``verdicts``); default: this record's own.
        ``decimals``: those of a range set beside this one (default: its own,
        :func:`range_decimals`), so that ``68.5–90.6 ms`` never stands beside ``91–101 ms`` when
        the second's low end is 90.5."""
        text = self._value_text(scale_of, decimals)
        return f"{text} ({self.spread_text(scale_of, decimals)})" if self.repeats > 1 else text

    def own_decimals(self, scale_of: float | None = None) -> int | None:
        """The decimals this record's range prints to by itself (:func:`range_decimals`), or
        None when it prints none (one repeat, or two ends that print the same)."""
        scale = max(abs(end) for end in self.spread) if scale_of is None else scale_of
        if self.repeats == 1 or self._ends_alike(scale):
            return None
        return range_decimals(*self.spread, self.unit, scale)

    def _value_text(self, scale_of: float | None = None, decimals: int | None = None) -> str:
        """The value in the unit and to the decimals its range is written in (seconds in s, ms or
        µs as the range's larger end needs), so that ``0.40 s (0.30–1.31 s ...)`` never reads
        ``401 ms (0.301–1.31 s``, nor ``296 requests/s (292.1–303.2 requests/s``."""
        if self.repeats == 1:
            return _show(self.value, self.unit, scale_of=scale_of)
        scale = max(abs(end) for end in self.spread) if scale_of is None else scale_of
        own = self.own_decimals(scale)
        return _show(self.value, self.unit, scale_of=scale, decimals=None if own is None else
                     own if decimals is None else decimals)

    def _ends_alike(self, scale: float) -> bool:
        """The range's two ends print the same (it reads "in each of")."""
        low, high = self.spread
        return _show(low, self.unit, scale_of=scale) == _show(high, self.unit, scale_of=scale)

    def spread_text(self, scale_of: float | None = None, decimals: int | None = None) -> str:
        """The range over the repeats as every sentence writes it: ``120–140 µs over 3 repeats``,
        or ``98% in each of 3 repeats`` when its two ends print the same (``scale_of`` and
        ``decimals``: as :meth:`shown`'s)."""
        low, high = self.spread
        scale = high if scale_of is None else scale_of
        if self._ends_alike(scale):
            return f"{_show(high, self.unit, scale_of=scale)} in each of {self.counted()}"
        return f"{show_range(low, high, self.unit, scale_of, decimals)} over {self.counted()}"

    def counted(self) -> str:
        """How many the spread runs over, as a sentence says it: ``3 repeats``, ``one repeat``,
        ``9 answered clients``."""
        if self.repeats == 1:
            return f"one {self.over.removesuffix('s')}"
        return f"{self.repeats} {self.over}"

    def as_json(self) -> dict:
        return {"quantity": self.quantity, "model": self.model, "value": self.value, "unit": self.unit,
                "spread": list(self.spread), "repeats": self.repeats, "over": self.over,
                "conditions": dict(self.conditions), "context": dict(self.context),
                **({"samples": list(self.samples)} if self.samples else {})}

    @classmethod
    def from_json(cls, data: Mapping) -> Measurement:
        """A record read back from the ledger: JSON's lists become the tuples they were (a fit's
        sizes print as ``(2, 4, 8)`` in every notebook, read back or not)."""
        def tupled(pairs: Mapping) -> dict:
            return {key: tuple(value) if isinstance(value, list) else value for key, value in pairs.items()}

        return measurement(data["quantity"], data["model"], data["value"], data["unit"],
                           tuple(data["spread"]), data["repeats"], tupled(data.get("conditions", {})),
                           tupled(data.get("context", {})), data.get("over", "repeats"),
                           tuple(data.get("samples", ())))


def measurement(quantity: str, model: str, value: float, unit: str, spread: Sequence[float],
                repeats: int, conditions: Mapping[str, Any] | None = None,
                context: Mapping[str, Any] | None = None, over: str = "repeats",
                samples: Sequence[float] = ()) -> Measurement:
    """A :class:`Measurement` from plain mappings (sorted into pairs); ``over``: what the
    ``repeats`` are, when not repeats of a setting (:attr:`Measurement.over`); ``samples``:
    each repeat's value, when kept (one per repeat)."""
    low, high = spread
    if samples and len(samples) != repeats:
        raise ValueError(f"{len(samples)} samples for {repeats} repeats of {quantity}")
    return Measurement(quantity, model, float(value), unit, (float(low), float(high)), int(repeats),
                       tuple(sorted((conditions or {}).items())), tuple(sorted((context or {}).items())),
                       over, tuple(float(x) for x in samples))


#: Significant digits a value is written to: seconds (in s, ms or µs) and every other unit but
#: shares and ratios, which have fixed decimals.
SECONDS_DIGITS, OTHER_DIGITS = 3, 4


def _show(value: float, unit: str, with_unit: bool = True, scale_of: float | None = None,
          decimals: int | None = None) -> str:
    """``value`` in ``unit``, a negative one with a true minus sign; seconds in s, ms or µs as
    ``scale_of`` (default: the value) needs, so that a range's low end is written in its high
    end's unit. ``decimals``: that many after the point (a range's, :func:`range_decimals`),
    else the value's own significant digits."""
    return signed(_unsigned_show(value, unit, with_unit, scale_of, decimals))


def _seconds_scale(size: float) -> tuple[float, str]:
    return (1, "s") if size >= 1 else (1e6, "µs") if size < 1e-3 else (1e3, "ms")


def _unsigned_show(value: float, unit: str, with_unit: bool, scale_of: float | None,
                   decimals: int | None = None) -> str:
    if unit == "share":
        return f"{value:.0%}" if with_unit else f"{value * 100:.0f}"
    if unit == "x":
        return f"{value:.2f}×" if with_unit else f"{value:.2f}"
    if unit == "s":
        scale, name = _seconds_scale(abs(value if scale_of is None else scale_of))
        value *= scale
        if decimals is None:   # its significant digits, trailing zeros kept: 1.00 s, never 1 s
            decimals = _significant_decimals(value, SECONDS_DIGITS)
        number = f"{value:.{decimals}f}"
        return f"{number} {name}" if with_unit else number
    number = f"{value:.{OTHER_DIGITS}g}" if decimals is None else f"{value:.{decimals}f}"
    return f"{number} {unit}" if with_unit else number


def range_decimals(low: float, high: float, unit: str, scale_of: float | None = None) -> int:
    """The decimals both ends of a range (and the value it surrounds) are written to: those of
    its larger end at its own significant digits, so that the ends line up (``287.0–297.7``,
    ``0.30–1.31 s``; never ``287–297.7``, nor ``0.0143–299 µs``, whose low end claims a
    precision its high end does not have). Whole numbers from 1000 on, as :func:`_show`'s."""
    larger = max(abs(low), abs(high))
    digits = OTHER_DIGITS
    if unit == "s":
        larger *= _seconds_scale(larger if scale_of is None else abs(scale_of))[0]
        digits = SECONDS_DIGITS
    return _significant_decimals(larger, digits)


def _significant_decimals(value: float, digits: int) -> int:
    """The decimals that write ``value`` to ``digits`` significant digits; whole numbers from
    1000 on (and for 0)."""
    magnitude = abs(value)
    if magnitude == 0 or magnitude >= 1000:
        return 0
    return max(0, digits - 1 - math.floor(math.log10(magnitude)))


def show_values(values: Sequence[float], unit: str, scale_of: float | None = None) -> list[str]:
    """Single readings set side by side in one sentence, written as a range's two ends are: to
    the decimals of the larger (:func:`range_decimals`), in one unit (``scale_of``: as
    :func:`show_range`'s): ``6.7 ms`` and ``21.2 ms``, never ``6.71 ms`` against ``21.2 ms``."""
    scale = max(abs(v) for v in values) if scale_of is None else scale_of
    decimals = range_decimals(min(values), max(values), unit, scale)
    return [_show(value, unit, scale_of=scale, decimals=decimals) for value in values]


def show_range(low: float, high: float, unit: str, scale_of: float | None = None,
               decimals: int | None = None) -> str:
    """A range as every printed sentence writes it: ``12–34%``, ``120–140 µs``, the unit once,
    both ends to the same decimals (:func:`range_decimals`, or ``decimals``); a range that
    crosses zero reads ``from −88% to 59%`` (a true minus sign), since ``−88–59%`` reads as a
    subtraction. ``scale_of``: as ``Measurement.shown``'s (default: the range's larger end)."""
    if scale_of is None:
        scale_of = max(abs(low), abs(high))   # from −1.34 ms to 0.57 ms; 120–140 µs
    if decimals is None:
        decimals = range_decimals(low, high, unit, scale_of)
    high_text = _show(high, unit, scale_of=scale_of, decimals=decimals)
    if low < 0:
        return f"from {_show(low, unit, scale_of=scale_of, decimals=decimals)} to {high_text}"
    return f"{_show(low, unit, False, scale_of=scale_of, decimals=decimals)}–{high_text}"


def signed(text: str) -> str:
    """A number's text with its leading sign as a minus (U+2212), not a hyphen: ``-0.75`` reads
    as a dash in prose, ``−0.75`` as a negative number."""
    return "−" + text[1:] if text.startswith("-") else text


def _spread(values: Sequence[float]) -> tuple[float, float]:
    return (min(values), max(values))


# -- the model alone -----------------------------------------------------------------------------


def profile_sizes(max_batch_size: int) -> tuple[int, ...]:
    """The batch sizes timed for a server capped at ``B``: every power of two below ``B``, and
    ``B``. The offline ceiling is a maximum over the sizes a server may run, so none of these
    may be skipped (notebook 08 once skipped 16 at ``B`` = 32); 2, 4 and 8 carry the line."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size!r}")
    sizes, b = [], 1
    while b < max_batch_size:
        sizes.append(b)
        b *= 2
    return tuple(sizes) + (max_batch_size,)


@dataclasses.dataclass(frozen=True)
class CallTimes:
    """What :func:`time_calls` timed: per size, the median seconds over every call
    (``medians``) and round by round (``rounds[r][i]``, for the spread)."""

    model: str
    clock: str
    threads: int
    batch_sizes: tuple[int, ...]
    medians: tuple[float, ...]
    rounds: tuple[tuple[float, ...], ...]

    def seconds(self, batch_size: int) -> float:
        return self.medians[self._index(batch_size)]

    def _index(self, batch_size: int) -> int:
        if batch_size not in self.batch_sizes:
            raise ValueError(f"batch size {batch_size} was not timed (timed: {self.batch_sizes})")
        return self.batch_sizes.index(batch_size)

    def conditions(self, **more) -> dict[str, Any]:
        return {"clock": self.clock, "threads": self.threads, **more}


def _load(model, device: str = "cpu") -> tuple[Any, str]:
    import torch

    if isinstance(model, (str, Path)):
        path = Path(model)
        path = path / "model.pt" if path.is_dir() else path
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)   # TorchScript's deprecation notice
            return torch.jit.load(str(path), map_location=device).eval(), str(path.parent.name or path)
    return model, getattr(model, "label", type(model).__name__)


def time_calls(model, row_shape: Sequence[int], max_batch_size: int, *, clock: str = "wall",
               rounds: int = 5, seconds_per_round: float = 0.2, warmup: int = 2,
               name: str | None = None, threads: int = 1, device: str = "cpu") -> CallTimes:
    """Time one model at every size of ``profile_sizes(max_batch_size)``.

    ``model``: a model folder or ``.pt`` path (the TorchScript file the server runs, loaded
    here onto ``device``), or a module (already on ``device``). Rows of ``row_shape`` (one row's shape, no batch dimension), random
    from seed 0. ``threads`` torch intra-op threads (the server gives a CPU model one) during
    the timing only. ``warmup`` untimed calls per size, then ``rounds`` passes over the sizes
    in turn (so a machine's drift falls on every size alike), each size timed for
    ``seconds_per_round`` of the clock and at least once per pass, in inference mode.
    ``clock``: ``"wall"`` or ``"cpu"`` (see the module docstring).

    Tolerance (``tests/test_instruments.py``): medians within 10 % of a simulated device's
    t(b) (wall) and of a known CPU burn (cpu), on a busy 2-core machine.
    """
    import torch

    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    read = CLOCKS[clock]
    module, label = _load(model, device)
    sizes = profile_sizes(max_batch_size)
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randn(b, *row_shape, generator=generator).to(device) for b in sizes]
    calls: list[list[float]] = [[] for _ in sizes]
    per_round: list[list[float]] = []

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for batch in batches:
                for _ in range(warmup):
                    module(batch)
            sync()
            for _ in range(rounds):
                this_round = []
                for batch, timed in zip(batches, calls):
                    spent, mine = 0.0, []
                    while not mine or spent < seconds_per_round:
                        started = read()
                        module(batch)
                        sync()
                        mine.append(read() - started)
                        spent += mine[-1]
                    timed += mine
                    this_round.append(statistics.median(mine))
                per_round.append(this_round)
    finally:
        torch.set_num_threads(threads_before)
    return CallTimes(name or label, clock, threads, sizes, tuple(statistics.median(t) for t in calls),
                     tuple(tuple(r) for r in per_round))


def _round_by_round(times: CallTimes, formula: Callable[[Sequence[float]], float]) -> tuple[float, ...]:
    """``formula`` of each round's medians: a record's samples, paired round by round with
    another record of the same timings (``verdicts.on_the_line`` divides them pass by pass)."""
    return tuple(formula(r) for r in times.rounds)


def _per_round(times: CallTimes, formula: Callable[[Sequence[float]], float]) -> tuple[float, tuple[float, float]]:
    value = formula(times.medians)
    return value, _spread([*_round_by_round(times, formula), value])


def call_time(times: CallTimes, batch_size: int) -> Measurement:
    """``t(b)``: the *measured* median seconds of one call on ``batch_size`` rows (never the
    line's value: a batch of one may lie off the line, and a model fed the line's t(1) predicts
    a batching-off server that does not exist), with each round's median as a sample.
    Tolerance: as :func:`time_calls`."""
    i = times._index(batch_size)
    value, spread = _per_round(times, lambda s: s[i])
    return measurement(f"t({batch_size})", times.model, value, "s", spread, len(times.rounds),
                       times.conditions(), samples=_round_by_round(times, lambda s: s[i]))


def _line(times: CallTimes, seconds: Sequence[float]) -> tuple[float, float]:
    return definitions.fit_cost_line(times.batch_sizes, seconds)


def cost_line(times: CallTimes) -> tuple[Measurement, Measurement]:
    """``(F, c)`` of ``t(b) = F + c·b`` through ``definitions.FIT_BATCH_SIZES`` (2, 4, 8), with
    each round's line as samples. Tolerance: within 10 % of a chosen linear t(b) on the
    simulated device (F and c of the order of milliseconds)."""
    fixed, fixed_spread = _per_round(times, lambda s: _line(times, s)[0])
    per_row, per_row_spread = _per_round(times, lambda s: _line(times, s)[1])
    where = times.conditions(fit_sizes=definitions.FIT_BATCH_SIZES)
    return (measurement("F", times.model, fixed, "s", fixed_spread, len(times.rounds), where,
                        samples=_round_by_round(times, lambda s: _line(times, s)[0])),
            measurement("c", times.model, per_row, "s", per_row_spread, len(times.rounds), where,
                        samples=_round_by_round(times, lambda s: _line(times, s)[1])))


def out_of_order(times: CallTimes) -> list[tuple[int, int]]:
    """Each pair of neighbouring timed sizes ``(b, b')``, ``b < b'``, whose median call of more
    rows took *less* time: ``t(b) > t(b')``. Among the sizes the line is fitted through, no
    model's call costs less for more rows, so such a pair is a disturbed median (another process
    had the core during passes), and the line through it is bent: F, c and the fixed share carry
    the disturbance. ``t(1) > t(2)`` may instead be batch 1's own kernels (appendix 10), which the
    line, fitted from b = 2, leaves out. Notebooks print it beside the line. Tolerance: exact (a
    comparison of the medians timed)."""
    pairs = zip(zip(times.batch_sizes, times.medians), zip(times.batch_sizes[1:], times.medians[1:]))
    return [(b, b_next) for (b, t), (b_next, t_next) in pairs if t > t_next]


def fixed_share(times: CallTimes) -> Measurement:
    """``F / (F + c)`` of :func:`cost_line`. Tolerance: 0.05 absolute on the simulated device."""
    value, spread = _per_round(times, lambda s: definitions.fixed_share(*_line(times, s)))
    return measurement("fixed share", times.model, value, "share", spread, len(times.rounds),
                       times.conditions(fit_sizes=definitions.FIT_BATCH_SIZES))


def _covered(times: CallTimes, max_batch_size: int) -> None:
    missing = [b for b in profile_sizes(max_batch_size) if b not in times.batch_sizes]
    if missing:
        raise ValueError(f"{times.model}: sizes {missing} up to B = {max_batch_size} were not timed; "
                         "the ceiling is a maximum over every size the server may run")


def offline_ceiling(times: CallTimes, max_batch_size: int) -> Measurement:
    """``max b / t(b)`` over every timed size ``b ≤ B`` (rows/s), the best size in context.
    Tolerance: 10 % of the truth on a simulated device whose best size is below ``B``."""
    _covered(times, max_batch_size)
    value, spread = _per_round(
        times, lambda s: definitions.offline_ceiling_rps(times.batch_sizes, s, max_batch_size)[0])
    _, best = definitions.offline_ceiling_rps(times.batch_sizes, times.medians, max_batch_size)
    return measurement("offline ceiling", times.model, value, "rows/s", spread, len(times.rounds),
                       times.conditions(max_batch_size=max_batch_size), {"best_batch": best})


def speedup(times: CallTimes, max_batch_size: int) -> Measurement:
    """The model's per-row speedup at ``B``: offline ceiling × ``t₁ = min(t(1), F + c)``
    (``definitions.speedup``). Not the served gain. Tolerance: 10 % on the simulated device."""
    _covered(times, max_batch_size)
    value, spread = _per_round(
        times, lambda s: definitions.speedup(times.batch_sizes, s, max_batch_size))
    return measurement("speedup", times.model, value, "x", spread, len(times.rounds),
                       times.conditions(max_batch_size=max_batch_size, gain="per-row, the model alone"))


def lone_call(times: CallTimes) -> Measurement:
    """``t₁ = min(t(1), F + c)`` (``definitions.lone_call_seconds``): what one row alone costs
    the model, the cheaper of the measured batch-1 call and the line's. Tolerance: 10 % on the
    simulated device (whose batch 1 is off the line, so ``t₁`` is the line's)."""
    value, spread = _per_round(times, lambda s: definitions.lone_call_seconds(times.batch_sizes, s))
    return measurement("t₁", times.model, value, "s", spread, len(times.rounds),
                       times.conditions(fit_sizes=definitions.FIT_BATCH_SIZES))


def speedup_over_t1(times: CallTimes, max_batch_size: int) -> Measurement:
    """The offline ceiling at ``B`` × the *measured* ``t(1)`` (``definitions.speedup_over_t1``):
    what the model alone predicts for the served gain, since a server with batching off pays
    the measured batch-1 call per request. Not the per-row :func:`speedup` (against ``t₁``),
    not the served gain. Tolerance: 10 % on the simulated device."""
    _covered(times, max_batch_size)
    value, spread = _per_round(
        times, lambda s: definitions.speedup_over_t1(times.batch_sizes, s, max_batch_size))
    return measurement("speedup over t(1)", times.model, value, "x", spread, len(times.rounds),
                       times.conditions(max_batch_size=max_batch_size,
                                        gain="the model alone, over the measured t(1)"))


def queueing_cost(times: CallTimes):
    """``loadtests.queueing``'s t(b): the line through 2, 4, 8, with the *measured* t(1) for a
    batch of one (the queueing model's batching-off service time). Tolerance: the queueing
    model's capacity at B = 1 within 5 % of a simulated server's with t(1) off the line."""
    from loadtests import queueing

    fixed, per_row = _line(times, times.medians)
    return queueing.BatchCost(a=fixed, c=per_row, t1=times.seconds(1))


# -- the server ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Window:
    """One measured window of one model: the server's counts and its process's CPU."""

    answered: float       #: 200s
    shed: float           #: 503s
    other: float          #: any other status
    server_cpu_s: float   #: the server process's CPU seconds (user + system, every thread)
    window_s: float       #: wall-clock seconds of the window
    rows: float           #: rows the model's calls held
    calls: float          #: model calls
    model_call_s: float   #: seconds inside model calls (``mmserver_compute_seconds``)
    queue_s: float = 0.0  #: seconds requests spent queued (``mmserver_queue_wait_seconds``)
    queued: float = 0.0   #: requests that left the queue for a call
    #: (name, CPU seconds) of each process counted in ``server_cpu_s``, when :func:`saturate`
    #: was given ``processes`` (an engine and its HTTP workers); empty for one process
    cpu_by_process: tuple[tuple[str, float], ...] = ()


class _Windows:
    """What a run of server :class:`Window` s sums: a field over its windows, its mean batch."""

    windows: tuple

    def total(self, field: str) -> float:
        return sum(getattr(w, field) for w in self.windows)

    @property
    def mean_batch(self) -> float:
        return self.total("rows") / self.total("calls") if self.total("calls") else 0.0


@dataclasses.dataclass(frozen=True)
class ServerRun(_Windows):
    """:func:`saturate`'s windows of one model, and how it was driven."""

    model: str
    max_batch_size: int
    connections: int
    body_bytes: int
    windows: tuple[Window, ...]
    #: who drove the load when not :func:`saturate`'s own clients (e.g. ``"locust SteadyUser"``)
    driver: str | None = None

    def conditions(self, **more) -> dict[str, Any]:
        driven = {"driver": self.driver} if self.driver else {}
        return {"max_batch_size": self.max_batch_size, "connections": self.connections,
                "body_bytes": self.body_bytes, **driven, **more}

    def context(self, **more) -> dict[str, Any]:
        return {"mean_batch": round(self.mean_batch, 1), **more}


async def _closed_loop(host: str, port: int, path: str, body: bytes, content_type: str,
                       connections: int, stop: asyncio.Event) -> None:
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body

    async def client():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while not stop.is_set():
                writer.write(head)
                await reader.readline()                          # the status line
                length = 0
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
        finally:
            writer.close()

    await asyncio.gather(*(client() for _ in range(connections)))


class _Load:
    """``connections`` closed-loop keep-alive clients (a minimal HTTP/1.1 loop over asyncio
    streams, lighter per request than a client library) on an event loop of their own, in a
    thread, so that a notebook whose kernel already runs a loop can use it too."""

    def __init__(self, url: str, path: str, body: bytes, content_type: str, connections: int):
        host, port = url.removeprefix("http://").split(":")
        self._args = (host, int(port), path, body, content_type, connections)
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            self._loop.run_until_complete(_closed_loop(*self._args, self._stop))
        except BaseException as error:  # noqa: BLE001 - reported by stop()
            self._error = error
        finally:
            self._loop.close()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        try:
            self._loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:      # the loop already closed: the clients failed (reported below)
            pass
        self._thread.join(timeout=30)
        if self._thread.is_alive():
            raise RuntimeError("the load's clients did not stop within 30 s")
        if self._error is not None and exc[0] is None:
            raise RuntimeError(f"the load failed: {self._error!r}") from self._error


def _cpu_seconds(processes: Mapping[str, Any]) -> dict[str, float]:
    return {label: sum(process.cpu_times()[:2]) for label, process in processes.items()}


def _window(server, processes: Mapping[str, Any], name: str, window_s: float) -> Window:
    from mmserver.harness.testing import histogram, sample_value

    before, cpu_before, began = server.metrics(), _cpu_seconds(processes), time.perf_counter()
    time.sleep(window_s)
    after, cpu_after, ended = server.metrics(), _cpu_seconds(processes), time.perf_counter()
    cpu = {label: cpu_after[label] - cpu_before[label] for label in processes}

    def delta(sample: str, **labels) -> float:
        return (sample_value(after, sample, model=name, **labels)
                - sample_value(before, sample, model=name, **labels))

    _, rows_after, calls_after = histogram(after, "mmserver_batch_size_rows", model=name)
    _, rows_before, calls_before = histogram(before, "mmserver_batch_size_rows", model=name)
    answered, shed = delta("mmserver_requests_total", status="200"), delta("mmserver_requests_total", status="503")
    return Window(answered, shed, delta("mmserver_requests_total") - answered - shed, sum(cpu.values()),
                  ended - began, rows_after - rows_before, calls_after - calls_before,
                  delta("mmserver_compute_seconds_sum"), delta("mmserver_queue_wait_seconds_sum"),
                  delta("mmserver_queue_wait_seconds_count"),
                  tuple(sorted(cpu.items())) if len(processes) > 1 else ())


def saturate(server, models: Mapping[str, int], body: bytes, content_type: str, *,
             connections: int, window_s: float = 2.0, lead_s: float = 0.5, warmup_s: float = 1.0,
             rounds: int = 3, answer_timeout_s: float = 60.0,
             processes: Mapping[str, int] | None = None) -> dict[str, ServerRun]:
    """Saturate each model of a running server in turn, ``rounds`` times; its own view of each.

    ``server``: a started ``ServerProcess`` (pinned to the server's core; this process drives
    the load and should sit on another core). ``models``: name -> the MAX_BATCH_SIZE it runs
    at (for the record). Per model, once, ``warmup_s`` of load not counted; then per round and
    model: ``connections`` closed-loop clients POST ``body``; after the first answer and
    ``lead_s`` more, a window of ``window_s`` wall-clock seconds reads ``/metrics`` and the
    server process's CPU (psutil) at both ends, while the load still runs. Rounds take the
    models in turn, so a machine's drift falls on each alike. Waits at most
    ``answer_timeout_s`` for a model's first answer. Keep ``connections`` at least twice the
    cap and at most the server's queue size (``definitions.capacity_rps`` asks both).
    ``processes``: label -> pid of every process whose CPU the server spends (``--http-workers``:
    the engine and each worker); their sum is the window's ``server_cpu_s`` and each part is
    kept (``Window.cpu_by_process``). By default, the server's one process.
    """
    import psutil

    process = {label: psutil.Process(pid) for label, pid in (processes or {"server": server.process.pid}).items()}
    windows: dict[str, list[Window]] = {name: [] for name in models}

    def drive(name: str, count: bool) -> None:
        from mmserver.harness.testing import sample_value

        path = f"/models/{name}/invoke"
        start = sample_value(server.metrics(), "mmserver_requests_total", model=name)
        with _Load(server.url, path, body, content_type, connections):
            deadline = time.monotonic() + answer_timeout_s
            while sample_value(server.metrics(), "mmserver_requests_total", model=name) == start:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no answer from {name} within {answer_timeout_s:g} s")
                time.sleep(0.02)
            if count:
                time.sleep(lead_s)
                windows[name].append(_window(server, process, name, window_s))
            else:
                time.sleep(warmup_s)

    for name in models:
        drive(name, count=False)
    for _ in range(rounds):
        for name in models:
            drive(name, count=True)
    return {name: ServerRun(name, models[name], connections, len(body), tuple(ws))
            for name, ws in windows.items()}


def observe(server, model: str, window_s: float, *, max_batch_size: int, connections: int,
            body_bytes: int, driver: str) -> ServerRun:
    """One window of ``window_s`` seconds of a load someone else drives (locust, say): the
    server's own counts and its process's CPU, read as :func:`saturate` reads them, as a
    :class:`ServerRun` of one window whose conditions name the ``driver`` and its
    ``connections`` (users). Start it once the load has reached the server. Tolerance: as
    :func:`capacity`, :func:`drain_rate` and :func:`batch_time`, which read it."""
    import psutil

    window = _window(server, {"server": psutil.Process(server.process.pid)}, model, window_s)
    return ServerRun(model, max_batch_size, connections, body_bytes, (window,), driver)


def _per_window(run: ServerRun, formula: Callable[[Window], float], whole: Callable[[ServerRun], float]
                ) -> tuple[float, tuple[float, float], tuple[float, ...]]:
    """The run's value (``whole``), its range over the windows and the whole, and each window's
    value (``formula``): the samples a rank test reads."""
    value = whole(run)
    samples = tuple(formula(w) for w in run.windows)
    return value, _spread([*samples, value]), samples


def t_http(run: ServerRun, process: str | None = None) -> Measurement:
    """``t_http``: the server's CPU seconds per request answered, with a model that computes
    nothing (``definitions.t_http_s``), at the run's MAX_BATCH_SIZE; the mean batch the server
    formed is in the record's context (per-call work is shared over it). Per CPU second, not
    per wall-clock second. Tolerance: a server path with a known added CPU cost per request
    (2 ms, both at MAX_BATCH_SIZE 1) is recovered as the difference of two ``t_http`` from
    10 % under to 35 % over (the known cost holds the interpreter lock; the server's threads
    switch around it: +6 % to +26 % measured); with a device that holds no CPU it stays a
    server path's CPU per request.

    ``process``: the label of one process of a run driven with ``processes`` (``saturate``):
    that process's CPU per request alone (e.g. the engine's, which no number of HTTP workers
    spreads). Without it, every counted process together. Tolerance (``--http-workers 2``):
    the same known added cost recovered from all processes together, as above, and the parts
    sum to the whole."""
    def cpu(w: Window) -> float:
        return w.server_cpu_s if process is None else dict(w.cpu_by_process)[process]

    value, spread, samples = _per_window(run, lambda w: definitions.t_http_s(cpu(w), w.answered),
                                lambda r: definitions.t_http_s(sum(cpu(w) for w in r.windows), r.total("answered")))
    processes = len(run.windows[0].cpu_by_process) if run.windows else 0
    where = run.conditions(clock=SERVER_CPU_CLOCK)
    if processes:
        where.update(processes=processes, cpu_of=process or "all")
    return measurement("t_http", run.model, value, "s", spread, len(run.windows), where, run.context(),
                       samples=samples)


def capacity(run: ServerRun) -> Measurement:
    """Capacity (requests/s, wall clock) of a saturated run that shed nothing
    (``definitions.capacity_rps`` refuses any other). Tolerance: 25 % of ``B / t(B)`` on a
    simulated device whose calls are long beside the server's work (a call is timed until the
    event loop takes its answers, and a sleeping device wakes late on a busy machine). A run in
    which the server answered anything but 200 or 503 is refused too: its count is no capacity."""
    if run.total("other"):
        raise ValueError(f"{run.model}: {run.total('other'):g} answers were neither 200 nor 503: "
                         "a run that fails requests does not measure capacity")

    fields = ("answered", "shed", "window_s", "rows", "calls", "queue_s", "queued", "model_call_s")

    def one(answered, shed, window_s, rows, calls, queue_s, queued, model_call_s):
        return definitions.capacity_rps(int(answered), window_s, shed=int(shed),
                                        mean_batch_rows=rows / calls if calls else 0.0,
                                        max_batch_size=run.max_batch_size,
                                        mean_queue_wait_s=queue_s / queued if queued else 0.0,
                                        mean_call_s=model_call_s / calls if calls else 0.0)

    value, spread, samples = _per_window(
        run, lambda w: one(*(getattr(w, f) for f in fields)), lambda r: one(*(r.total(f) for f in fields)))
    return measurement("capacity", run.model, value, "requests/s", spread, len(run.windows),
                       run.conditions(clock="wall"), run.context(), samples=samples)


def served(run: ServerRun) -> Measurement:
    """Requests answered per wall-clock second of the windows, saturated or not (where the
    batches did not fill, :func:`capacity` refuses; this is what was served). Refused for a run
    that failed requests, as :func:`capacity`. Tolerance: equal to :func:`capacity` on a
    saturated simulated device, whose batches fill."""
    if run.total("other"):
        raise ValueError(f"{run.model}: {run.total('other'):g} answers were neither 200 nor 503")
    value, spread, samples = _per_window(run, lambda w: w.answered / w.window_s,
                                lambda r: r.total("answered") / r.total("window_s"))
    return measurement("served", run.model, value, "requests/s", spread, len(run.windows),
                       run.conditions(clock="wall"), run.context(), samples=samples)


def served_per_cpu_second(run: ServerRun) -> Measurement:
    """Requests answered per second of the server process's CPU: the measured side of
    :func:`efficiency`. Tolerance: as :func:`efficiency`."""
    value, spread, samples = _per_window(run, lambda w: w.answered / w.server_cpu_s,
                                lambda r: r.total("answered") / r.total("server_cpu_s"))
    return measurement("served per CPU second", run.model, value, "requests/s", spread,
                       len(run.windows), run.conditions(clock=SERVER_CPU_CLOCK), run.context(), samples=samples)


def busy_fraction(run: ServerRun) -> Measurement:
    """Seconds inside model calls over the window (the device's view, ``definitions.busy_fraction``);
    never the server's CPU share (``core_share``). Tolerance: within 15 % of 1 on a saturated
    simulated device, whose server uses a small share of its core."""
    value, spread, samples = _per_window(run, lambda w: definitions.busy_fraction(w.model_call_s, w.window_s),
                                lambda r: definitions.busy_fraction(r.total("model_call_s"), r.total("window_s")))
    return measurement("busy fraction", run.model, value, "share", spread, len(run.windows),
                       run.conditions(clock="wall"), run.context(), samples=samples)


def core_share(run: ServerRun) -> Measurement:
    """The server process's CPU seconds over the window (``definitions.core_share``)."""
    value, spread, samples = _per_window(run, lambda w: definitions.core_share(w.server_cpu_s, w.window_s),
                                lambda r: definitions.core_share(r.total("server_cpu_s"), r.total("window_s")))
    return measurement("core share", run.model, value, "share", spread, len(run.windows),
                       run.conditions(clock=SERVER_CPU_CLOCK), run.context(), samples=samples)


def device_time_per_request(run: ServerRun) -> Measurement:
    """Seconds inside model calls per request answered (``definitions.device_seconds_per_request``).
    Tolerance: within 25 % of ``t(B)/B`` on a saturated simulated device (as :func:`capacity`)."""
    value, spread, samples = _per_window(
        run, lambda w: definitions.device_seconds_per_request(w.model_call_s, int(w.answered)),
        lambda r: definitions.device_seconds_per_request(r.total("model_call_s"), int(r.total("answered"))))
    return measurement("device time per request", run.model, value, "s", spread, len(run.windows),
                       run.conditions(clock="wall"), run.context(), samples=samples)


def serial_limit(t_http_record: Measurement, times: CallTimes, batch_size: int) -> Measurement:
    """``1 / (t_http + t(b)/b)`` (``definitions.serial_limit_rps``): requests per CPU second
    one core serves at batches of ``b``, from ``t_http`` and the model's *measured* t(b) on
    the CPU clock (a wall-clock t(b) would charge the core for time a device or another
    process spent). Tolerance: as :func:`efficiency`."""
    if times.clock != "cpu":
        raise ValueError(f"the serial limit needs call times on the CPU clock, got {times.clock!r}")
    if t_http_record.quantity != "t_http":
        raise ValueError(f"need a t_http record, got {t_http_record.quantity!r}")
    t_b = times.seconds(batch_size)
    low, high = t_http_record.spread
    limits = [definitions.serial_limit_rps(t, t_b, batch_size) for t in (low, high)]
    value = definitions.serial_limit_rps(t_http_record.value, t_b, batch_size)
    return measurement("serial limit", times.model, value, "requests/s", _spread(limits + [value]),
                       t_http_record.repeats, times.conditions(batch=batch_size),
                       {"t_http_s": t_http_record.value, "t_b_s": t_b,
                        "t_http_batch": t_http_record.observed.get("mean_batch")})


def efficiency(served: Measurement, limit: Measurement) -> Measurement:
    """Served per CPU second over the serial limit (``definitions.efficiency``). Tolerance:
    1 − 2 × NOISE_BAND to 1 + NOISE_BAND for a model of known CPU cost whose server work is a
    third of a request's core time (its spin holds the interpreter lock, which costs the
    server more than the no-op's ``t_http`` counts), and outside that without ``t_http``."""
    value = definitions.efficiency(served.value, limit.value)
    candidates = [definitions.efficiency(s, l) for s in served.spread for l in limit.spread]
    return measurement("efficiency", served.model, value, "ratio", _spread(candidates + [value]),
                       min(served.repeats, limit.repeats), {**limit.where},
                       {"served_rps_per_cpu_s": served.value, "limit_rps": limit.value,
                        **{k: v for k, v in limit.context}})


def served_gain(capacity_on: Measurement, capacity_off: Measurement) -> Measurement:
    """Capacity with batching on over capacity with it off (``definitions.served_gain``): the
    gain *through the server*, not the model's per-row :func:`speedup`."""
    value = definitions.served_gain(capacity_on.value, capacity_off.value)
    low = definitions.served_gain(capacity_on.spread[0], capacity_off.spread[1])
    high = definitions.served_gain(capacity_on.spread[1], capacity_off.spread[0])
    return measurement("served gain", capacity_on.model, value, "x", (low, high),
                       min(capacity_on.repeats, capacity_off.repeats),
                       {"max_batch_size": capacity_on.where.get("max_batch_size"),
                        "gain": "through the server"})


def server_added(capacity_record: Measurement, call: Measurement) -> Measurement:
    """``1/capacity − t(b)/b`` (``definitions.server_added_s``): the wall-clock time per request
    the saturated server spent beyond the model's share of a call, at the capacity's
    MAX_BATCH_SIZE ``b``, from :func:`capacity` and :func:`call_time` at that ``b`` on the wall
    clock. The spread combines both records' spreads: the extremes over the capacity's windows
    and the call's timing passes, which its count says. Recorded under the call's model and the
    capacity's conditions. Tolerance: as :func:`capacity` (the difference of two readings; it
    may come out a little negative where the server adds next to nothing)."""
    if capacity_record.quantity != "capacity":
        raise ValueError(f"need a capacity record, got {capacity_record.quantity!r}")
    b = capacity_record.where.get("max_batch_size")
    if call.quantity != f"t({b})":
        raise ValueError(f"the capacity is at MAX_BATCH_SIZE {b}: need t({b}), got {call.quantity}")
    if call.where.get("clock") != "wall":
        raise ValueError(f"the capacity is per wall-clock second: t({b}) must be on the wall clock, "
                         f"got {call.where.get('clock')!r}")
    value = definitions.server_added_s(capacity_record.value, call.value, b)
    candidates = [definitions.server_added_s(rps, t, b) for rps in capacity_record.spread for t in call.spread]
    return measurement("server added", call.model, value, "s", _spread(candidates + [value]),
                       capacity_record.repeats, capacity_record.where,
                       {**capacity_record.observed, "capacity_rps": capacity_record.value, "t_b_s": call.value},
                       over=f"{capacity_record.over} × {call.repeats} timing passes")

# -- text models: a call's padded tokens, and mixed-length texts through the server -------------


@dataclasses.dataclass(frozen=True)
class PaddedCallTimes:
    """What :func:`time_padded_calls` timed: per ``(rows, length)``, the median seconds over
    every call (``medians``) and round by round (``rounds[r][i]``, for the spread)."""

    model: str
    clock: str
    threads: int
    shapes: tuple[tuple[int, int], ...]
    medians: tuple[float, ...]
    rounds: tuple[tuple[float, ...], ...]

    def seconds(self, rows: int, length: int) -> float:
        return self.medians[self._index(rows, length)]

    def _index(self, rows: int, length: int) -> int:
        if (rows, length) not in self.shapes:
            raise ValueError(f"({rows}, {length}) was not timed (timed: {self.shapes})")
        return self.shapes.index((rows, length))


def text_model_call(model_dir: str | Path) -> tuple[Callable[[Mapping], Any], str]:
    """The call the server makes on a formed batch of a text model folder: its
    ``code/inference.py``'s ``model_fn`` once, then ``predict_fn(batch, model)``; and a name."""
    import importlib.util

    folder = Path(model_dir)
    spec = importlib.util.spec_from_file_location(f"_text_model_{abs(hash(str(folder)))}",
                                                  folder / "code" / "inference.py")
    code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(code)
    model = code.model_fn(str(folder))
    return (lambda batch: code.predict_fn(batch, model)), folder.parent.name or folder.name


def _padded_batch(rows: int, length: int, generator) -> dict:
    """A formed batch of ``rows`` token rows of ``length``: ``rows x length`` padded tokens (ids
    drawn in a range every small vocabulary has, no padding inside, so every token is real)."""
    import torch

    from mmserver.batching.sequences import ATTENTION_MASK, INPUT_IDS

    ids = torch.randint(1000, 2000, (rows, length), generator=generator, dtype=torch.int64)
    return {INPUT_IDS: ids, ATTENTION_MASK: torch.ones_like(ids)}


def time_padded_calls(call: Callable[[Mapping], Any], shapes: Sequence[tuple[int, int]], *,
                      name: str, clock: str = "cpu", rounds: int = 3,
                      seconds_per_round: float = 0.2, warmup: int = 1,
                      threads: int = 1) -> PaddedCallTimes:
    """``t(b, L)``: time a text model's call on formed batches of ``b`` rows of ``L`` tokens.

    ``call`` takes the dict a formed batch is (``input_ids``, ``attention_mask``, as
    ``mmserver.batching.sequences.collate`` builds it; :func:`text_model_call` gives the
    server's call of a model folder). Each ``(rows, length)`` of ``shapes`` is one batch of
    ``rows x length`` padded tokens. As :func:`time_calls`: ``warmup`` untimed calls per
    shape, then ``rounds`` passes over the shapes in turn, each shape timed for
    ``seconds_per_round`` of the ``clock`` and at least once a pass, in inference mode, with
    ``threads`` torch intra-op threads.

    Tolerance (``tests/test_instruments.py``): medians within 10 % of a stand-in whose call
    burns a known CPU time per padded token (cpu clock), on a busy 2-core machine.
    """
    import torch

    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}, got {clock!r}")
    if rounds < 1 or not shapes:
        raise ValueError("need at least one round and one shape")
    read = CLOCKS[clock]
    shapes = tuple((int(b), int(length)) for b, length in shapes)
    generator = torch.Generator().manual_seed(0)
    batches = [_padded_batch(b, length, generator) for b, length in shapes]
    calls: list[list[float]] = [[] for _ in shapes]
    per_round: list[list[float]] = []
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            for batch in batches:
                for _ in range(warmup):
                    call(batch)
            for _ in range(rounds):
                this_round = []
                for batch, timed in zip(batches, calls):
                    spent, mine = 0.0, []
                    while not mine or spent < seconds_per_round:
                        started = read()
                        call(batch)
                        mine.append(read() - started)
                        spent += mine[-1]
                    timed += mine
                    this_round.append(statistics.median(mine))
                per_round.append(this_round)
    finally:
        torch.set_num_threads(threads_before)
    return PaddedCallTimes(name, clock, threads, shapes, tuple(statistics.median(t) for t in calls),
                           tuple(tuple(r) for r in per_round))


def padded_call_time(times: PaddedCallTimes, rows: int, length: int) -> Measurement:
    """``t(b, L)`` of one timed shape: the median seconds of a call on ``rows x length`` padded
    tokens, spread over the rounds. Tolerance: as :func:`time_padded_calls`."""
    i = times._index(rows, length)
    return measurement("t(b, L)", times.model, times.medians[i], "s",
                       _spread([r[i] for r in times.rounds] + [times.medians[i]]), len(times.rounds),
                       {"clock": times.clock, "threads": times.threads, "rows": rows, "length": length},
                       {"padded_tokens": rows * length})


@dataclasses.dataclass(frozen=True)
class TextWindow:
    """One closed-loop window of texts sent to one model: what the clients saw (each
    request's latency) and what the server counted (``/metrics`` deltas)."""

    answered: int
    latencies: tuple[float, ...]   #: seconds, one per answered request
    window_s: float
    rows: float                    #: rows the model's calls held
    calls: float                   #: model calls
    real_tokens: float             #: the rows' own tokens
    padded_tokens: float           #: rows x longest, summed over calls


def drive_texts(server, name: str, pool: Sequence[str], clients: int, seconds: float) -> TextWindow:
    """``clients`` closed-loop clients (threads) send one text each per request to ``name``,
    in turn through ``pool``, for ``seconds``; ``/metrics`` read before and after. A status
    other than 200 raises."""
    import concurrent.futures

    from mmserver.harness.testing import histogram, sample_value

    def client(index: int) -> list[float]:
        latencies, position = [], index
        while time.perf_counter() < stop:
            started = time.perf_counter()
            status, _ = server.invoke(name, [pool[position % len(pool)]])
            if status != 200:
                raise RuntimeError(f"{name} answered {status}")
            latencies.append(time.perf_counter() - started)
            position += clients
        return latencies

    before, began = server.metrics(), time.perf_counter()
    stop = began + seconds
    with concurrent.futures.ThreadPoolExecutor(clients) as threads:
        latencies = [s for part in threads.map(client, range(clients)) for s in part]
    after, ended = server.metrics(), time.perf_counter()

    def delta(sample: str) -> float:
        return sample_value(after, sample, model=name) - sample_value(before, sample, model=name)

    _, rows_after, calls_after = histogram(after, "mmserver_batch_size_rows", model=name)
    _, rows_before, calls_before = histogram(before, "mmserver_batch_size_rows", model=name)
    return TextWindow(len(latencies), tuple(latencies), ended - began, rows_after - rows_before,
                      calls_after - calls_before, delta("mmserver_real_tokens_total"),
                      delta("mmserver_padded_tokens_total"))


def _text_record(quantity: str, model: str, unit: str, windows: Sequence[TextWindow],
                 formula: Callable[[Sequence[TextWindow]], float], conditions: Mapping[str, Any]) -> Measurement:
    rows, calls = sum(w.rows for w in windows), sum(w.calls for w in windows)
    real, padded = sum(w.real_tokens for w in windows), sum(w.padded_tokens for w in windows)
    value = formula(windows)
    return measurement(quantity, model, value, unit, _spread([formula([w]) for w in windows] + [value]),
                       len(windows), conditions,
                       {"mean_batch": round(rows / calls, 2) if calls else 0.0,
                        "padding_efficiency": round(real / padded, 3) if padded else None})


def text_throughput(model: str, windows: Sequence[TextWindow], conditions: Mapping[str, Any]) -> Measurement:
    """Texts answered per wall-clock second over the windows (each window's for the spread);
    the server's mean batch and padding efficiency in the context."""
    return _text_record("text throughput", model, "texts/s", windows,
                        lambda ws: sum(w.answered for w in ws) / sum(w.window_s for w in ws), conditions)


def text_latency(model: str, windows: Sequence[TextWindow], percentile: int,
                 conditions: Mapping[str, Any]) -> Measurement:
    """The ``percentile``-th latency (``p50``, ``p99``) of every request of the windows (each
    window's own for the spread), as the clients saw it."""
    def formula(ws):
        values = sorted(s for w in ws for s in w.latencies)
        return statistics.quantiles(values, n=100, method="inclusive")[percentile - 1]

    return _text_record(f"p{percentile}", model, "s", windows, formula, conditions)


def padding_efficiency(model: str, windows: Sequence[TextWindow], conditions: Mapping[str, Any]) -> Measurement:
    """Real tokens over padded tokens of the model's calls in the windows (the server's own
    counters, ``mmserver_real_tokens`` and ``mmserver_padded_tokens``): 1 means no padding."""
    return _text_record("padding efficiency", model, "ratio", windows,
                        lambda ws: sum(w.real_tokens for w in ws) / sum(w.padded_tokens for w in ws),
                        conditions)

# -- a batching runner alone, driven by scripted clients ------------------------------------------


@dataclasses.dataclass(frozen=True)
class ScriptedRequest:
    """What happened to one scripted client: times in seconds after the script's start."""

    client: int
    arrived: float
    done: float                    #: when it heard its answer (or its refusal)
    status: int                    #: 200, or the refusal's code (503: too busy)
    own_row: bool | None = None    #: whether the output was its own input's (None if refused)
    batch: int | None = None       #: index of the model call that held it
    launched: float | None = None  #: when that call started
    finished: float | None = None  #: when that call ended


@dataclasses.dataclass(frozen=True)
class Timeline:
    """:func:`scripted_clients`' record of one run: every client, every model call."""

    runner: str
    settings: tuple[tuple[str, Any], ...]
    requests: tuple[ScriptedRequest, ...]
    calls: tuple[tuple[float, float, tuple[int, ...]], ...]   #: (start, end, clients)

    def request(self, client: int) -> ScriptedRequest:
        for r in self.requests:
            if r.client == client:
                return r
        raise KeyError(f"no client {client} in the script")

    @property
    def answered(self) -> tuple[ScriptedRequest, ...]:
        return tuple(r for r in self.requests if r.status == 200)

    @property
    def refused(self) -> tuple[ScriptedRequest, ...]:
        return tuple(r for r in self.requests if r.status != 200)

    def conditions(self, **more) -> dict[str, Any]:
        return {**dict(self.settings), "clients": len(self.requests), **more}


async def scripted_clients(submit: Callable, arrivals: Sequence[tuple[int, float]],
                           make_input: Callable[[int], Any], is_own_output: Callable[[int, Any], bool],
                           calls: list, *, refusal: type[BaseException] | tuple = Exception,
                           runner: str = "runner", settings: Mapping[str, Any] | None = None,
                           lead_s: float = 0.05) -> Timeline:
    """Run a script of clients against a runner on this event loop; what happened to each.

    ``submit(input)`` is the runner's awaitable entry (the book's ``process_input``);
    ``arrivals`` (client number, seconds after the start) the script, started ``lead_s`` from
    now so that every client is waiting before the first arrives. A client that ``submit``
    answers with ``refusal`` is recorded with the error's ``handling_code`` (503 if it has
    none). ``calls`` is the list the model appends ``(started, ended, client numbers)`` to, on
    ``time.monotonic`` (the loop's clock); each answered client is matched to the call that
    held it. Tolerance (``tests/test_instruments.py``): a runner of known timing is recovered
    to a few milliseconds, within ``definitions.SCHEDULING_SLACK_S``.
    """
    loop = asyncio.get_running_loop()
    if abs(loop.time() - time.monotonic()) > definitions.TIMER_TOLERANCE_S:
        raise RuntimeError("the event loop's clock is not time.monotonic: model calls and clients "
                           "would not share one timeline")
    start = loop.time() + lead_s
    seen: dict[int, dict] = {}

    async def one(client: int, arrival: float) -> None:
        await asyncio.sleep(max(0.0, start + arrival - loop.time()))
        arrived = loop.time() - start
        try:
            output = await submit(make_input(client))
        except refusal as error:
            seen[client] = dict(client=client, arrived=arrived, done=loop.time() - start,
                                status=getattr(error, "handling_code", 503))
            return
        seen[client] = dict(client=client, arrived=arrived, done=loop.time() - start, status=200,
                            own_row=bool(is_own_output(client, output)))

    first_call = len(calls)
    await asyncio.gather(*(one(client, arrival) for client, arrival in arrivals))
    relative = tuple((s - start, e - start, tuple(clients)) for s, e, clients in calls[first_call:])
    for index, (launched, finished, clients) in enumerate(relative):
        for client in clients:
            if client in seen:
                seen[client].update(batch=index, launched=launched, finished=finished)
    return Timeline(runner, tuple(sorted((settings or {}).items())),
                    tuple(ScriptedRequest(**seen[c]) for c in sorted(seen)), relative)


def _client_queue_wait(timeline: Timeline, client: int) -> Measurement:
    """One answered client's queue wait (``definitions.queue_wait_s``): arrival to the start of
    the call that held it. Tolerance: as :func:`scripted_clients`."""
    r = timeline.request(client)
    if r.launched is None:
        raise ValueError(f"client {client} was not answered by a model call (status {r.status})")
    value = definitions.queue_wait_s(r.arrived, r.launched)
    return measurement("queue wait", timeline.runner, value, "s", (value, value), 1,
                       timeline.conditions(client=client), {"batch": r.batch}, over="clients")


def refusal_time(timeline: Timeline) -> Measurement:
    """How soon a refused client heard it: the longest of arrival to refusal over the refused
    (spread over them); which clients, and whether each arrived while the model was running a
    call, in the context. Tolerance: as :func:`scripted_clients`."""
    refused = timeline.refused
    if not refused:
        raise ValueError(f"{timeline.runner} refused no client")
    times = [r.done - r.arrived for r in refused]
    while_busy = all(any(s <= r.arrived <= e for s, e, _ in timeline.calls) for r in refused)
    return measurement("longest time to refuse", timeline.runner, max(times), "s", _spread(times), len(times),
                       timeline.conditions(), {"refused": tuple(r.client for r in refused),
                                               "while_busy": while_busy}, over="refused clients")


def latency(timeline: Timeline) -> Measurement:
    """The answered clients' latency, arrival to answer: the median, spread over the clients.
    Tolerance: as :func:`scripted_clients`."""
    times = [r.done - r.arrived for r in timeline.answered]
    if not times:
        raise ValueError(f"{timeline.runner} answered no client")
    return measurement("latency", timeline.runner, statistics.median(times), "s", _spread(times),
                       len(times), timeline.conditions(), over="answered clients")


def own_rows(timeline: Timeline) -> Measurement:
    """Share of the answered clients that got their own input's output back (1 when the runner
    hands every row to its request). Exact."""
    answered = timeline.answered
    if not answered:
        raise ValueError(f"{timeline.runner} answered no client")
    value = sum(bool(r.own_row) for r in answered) / len(answered)
    return measurement("own rows", timeline.runner, value, "share", (value, value), len(answered),
                       timeline.conditions(), over="answered clients")


def batch_sizes(timeline: Timeline) -> Measurement:
    """Rows per model call: the mean over the calls, spread smallest to largest; which clients
    each call held, in order, in the context (``grouping``). Exact."""
    sizes = [len(clients) for _, _, clients in timeline.calls]
    if not sizes:
        raise ValueError(f"{timeline.runner} made no model call")
    return measurement("batch size", timeline.runner, statistics.fmean(sizes), "rows", _spread(sizes),
                       len(sizes), timeline.conditions(),
                       {"grouping": tuple(tuple(sorted(c)) for _, _, c in timeline.calls)}, over="calls")


async def timer_delay(armed_s: float, repeats: int = 5) -> Measurement:
    """When a ``loop.call_at`` timer armed ``armed_s`` ahead sets an ``asyncio.Event``, as seen
    by the coroutine waiting on it: median over ``repeats`` timers, each armed afresh. One more
    timer is armed and cancelled at once; whether it set its event within ``2 × armed_s`` is in
    the context (``cancelled_fired``). Tolerance: within ``definitions.TIMER_TOLERANCE_S``
    before and ``definitions.SCHEDULING_SLACK_S`` after ``armed_s`` on an idle loop."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    loop = asyncio.get_running_loop()
    delays = []
    for _ in range(repeats):
        event = asyncio.Event()
        armed_at = loop.time()
        loop.call_at(armed_at + armed_s, event.set)
        await event.wait()
        delays.append(loop.time() - armed_at)
    event = asyncio.Event()
    loop.call_at(loop.time() + armed_s, event.set).cancel()
    try:
        await asyncio.wait_for(event.wait(), timeout=2 * armed_s)
        cancelled_fired = True
    except TimeoutError:
        cancelled_fired = False
    return measurement("timer delay", "asyncio event loop", statistics.median(delays), "s",
                       _spread(delays), repeats, {"armed_s": armed_s},
                       {"cancelled_fired": cancelled_fired})


@dataclasses.dataclass(frozen=True)
class OpenLoopRun:
    """:func:`open_loop`'s record of one runner at one offered rate."""

    policy: str
    rate: float                 #: the Poisson rate asked for (requests/s)
    offered_rps: float          #: requests sent over the span of their arrivals
    settings: tuple[tuple[str, Any], ...]
    latencies: tuple[float, ...]   #: seconds, sent to answered, per request in arrival order
    queue_waits: tuple[float, ...]  #: seconds, per request, as the runner reports them
    window_s: float             #: first arrival to last answer
    answered: int
    calls: int
    rows: int
    model_call_s: float         #: seconds inside model calls

    def conditions(self, **more) -> dict[str, Any]:
        return {**dict(self.settings), "policy": self.policy, "offered_rps": self.rate, **more}

    def context(self, **more) -> dict[str, Any]:
        return {"mean_batch": round(self.rows / self.calls, 2) if self.calls else 0.0,
                "measured_offered_rps": round(self.offered_rps, 1), **more}


async def open_loop(runners: Mapping[str, Any], rate: float, requests: int, row, *, seed: int,
                    settings: Mapping[str, Any] | None = None) -> dict[str, OpenLoopRun]:
    """Poisson arrivals at ``rate`` (``requests`` of them, from ``seed``), each sent at the same
    moment to every runner of ``runners`` (name -> an unstarted ``mmserver.batching.ModelRunner``),
    whether or not earlier ones were answered: an open loop. Each runner is started before
    and stopped after; its own counts (calls, rows, seconds inside the model) and each
    request's latency and queue wait make its :class:`OpenLoopRun`. Tolerance
    (``tests/test_instruments.py``): a model of known cost at a rate far below it is recovered
    (one row per call, device time per request) within ``definitions.NOISE_BAND``."""
    import random

    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    offsets = [0.0]
    for _ in range(requests - 1):
        offsets.append(offsets[-1] + rng.expovariate(rate))
    latencies = {name: [0.0] * requests for name in runners}
    waits = {name: [] for name in runners}
    last_answer = dict.fromkeys(runners, 0.0)

    async def one(name, index):
        sent = loop.time()
        await runners[name].submit(row)
        last_answer[name] = loop.time()
        latencies[name][index] = last_answer[name] - sent

    for name, runner in runners.items():
        runner.add_listener(lambda record, name=name: waits[name].extend(record.queue_wait_seconds))
        await runner.start()
    start, in_flight = loop.time(), []
    for index, offset in enumerate(offsets):
        await asyncio.sleep(max(0.0, start + offset - loop.time()))
        in_flight += [asyncio.create_task(one(name, index)) for name in runners]
    await asyncio.gather(*in_flight)
    out = {}
    for name, runner in runners.items():
        await runner.stop()
        stats = runner.stats
        out[name] = OpenLoopRun(name, rate, requests / offsets[-1] if offsets[-1] else float("inf"),
                                tuple(sorted((settings or {}).items())), tuple(latencies[name]),
                                tuple(waits[name]), last_answer[name] - start, stats.requests_completed,
                                stats.batches, stats.rows, stats.compute_seconds_total)
    return out


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    position = q / 100 * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def open_loop_latency(run: OpenLoopRun, percentile: float) -> Measurement:
    """A latency percentile (linear interpolation, as numpy's default) of an :class:`OpenLoopRun`."""
    value = _percentile(run.latencies, percentile)
    return measurement(f"p{percentile:g}", run.policy, value, "s", (value, value), 1,
                       run.conditions(), run.context())


def backlog_growth(run: OpenLoopRun) -> Measurement:
    """Backlog growth of an :class:`OpenLoopRun` (``definitions.backlog_growth_s``): how much
    longer the last quarter of its arrivals took than the first. Tolerance
    (``tests/test_instruments.py``): under a quarter of a call far below capacity; at twice the
    capacity, the ``0.75 T (λ/μ − 1)`` of its definition within 25 %."""
    value = definitions.backlog_growth_s(run.latencies)
    return measurement("backlog growth", run.policy, value, "s", (value, value), 1, run.conditions(),
                       run.context())


def open_loop_device_time(run: OpenLoopRun) -> Measurement:
    """Device time per request of an :class:`OpenLoopRun` (``definitions.device_seconds_per_request``);
    its busy fraction, served rate and mean queue wait in the context."""
    value = definitions.device_seconds_per_request(run.model_call_s, run.answered)
    return measurement("device time per request", run.policy, value, "s", (value, value), 1, run.conditions(),
                       run.context(busy=round(definitions.busy_fraction(run.model_call_s, run.window_s), 3),
                                   served_rps=round(run.answered / run.window_s, 1),
                                   queue_wait_s=round(statistics.fmean(run.queue_waits), 5)))


def mean_batch(run) -> Measurement:
    """Rows per model call over the run (the server's ``mmserver_batch_size_rows``), of a
    :class:`ServerRun` or a :class:`BurstRun`. Tolerance: exactly 1 for bursts of one
    request, and never above the burst (``tests/test_instruments.py``)."""
    value, spread, samples = _per_window(run, lambda w: w.rows / w.calls if w.calls else 0.0,
                                lambda r: r.total("rows") / r.total("calls") if r.total("calls") else 0.0)
    return measurement("mean batch", run.model, value, "rows", spread, len(run.windows), run.conditions(),
                       samples=samples)


def queue_wait(run, client: int | None = None) -> Measurement:
    """The queue wait: seconds from a request's arrival to the start of the call that held it.

    Of a :class:`Timeline` (a runner driven by scripted clients), ``client``'s own wait,
    measured by the clients' clock (:func:`_client_queue_wait`). Of a :class:`ServerRun` or a
    :class:`BurstRun`, the mean over the run's requests, as the server reports it
    (``mmserver_queue_wait_seconds``). Tolerance: under a quarter of one call for lone
    requests; for a burst behind one call of a simulated device, between a quarter of that
    call and the burst's last answer."""
    if isinstance(run, Timeline):
        if client is None:
            raise TypeError("a timeline's queue wait is one client's: name the client")
        return _client_queue_wait(run, client)
    value, spread, samples = _per_window(run, lambda w: w.queue_s / w.queued if w.queued else 0.0,
                                lambda r: r.total("queue_s") / r.total("queued") if r.total("queued") else 0.0)
    return measurement("queue wait", run.model, value, "s", spread, len(run.windows),
                       run.conditions(clock="wall"), run.context(), samples=samples)


# -- bursts far below capacity ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BurstRun(_Windows):
    """:func:`bursts`' record of one model on one server: per burst, the server's counts (a
    :class:`Window`, ``server_cpu_s`` not read) and every request's latency at the client."""

    model: str
    max_batch_size: int
    max_wait_ms: float
    burst_size: int
    body_bytes: int
    pause_s: float
    windows: tuple[Window, ...]
    latencies: tuple[tuple[float, ...], ...]   #: seconds, [burst][request]
    batch_buckets: tuple[tuple[float, float], ...]   #: (le, calls) cumulative over the run

    def conditions(self, **more) -> dict[str, Any]:
        return {"max_batch_size": self.max_batch_size, "max_wait_ms": self.max_wait_ms,
                "burst_size": self.burst_size, "body_bytes": self.body_bytes,
                "load": f"bursts of {self.burst_size} to an idle model, {self.pause_s:g} s apart", **more}

    def context(self, **more) -> dict[str, Any]:
        return {"mean_batch": round(self.mean_batch, 1), **more}


def _one_burst(server, name: str, body: bytes, content_type: str, size: int) -> list[float]:
    from mmserver.harness.testing import http_request

    barrier = threading.Barrier(size)
    latencies, statuses = [float("nan")] * size, [None] * size

    def one(k: int) -> None:
        barrier.wait()
        began = time.perf_counter()
        statuses[k] = http_request(server.url, "POST", f"/models/{name}/invoke", body,
                                   {"Content-Type": content_type, "Accept": "application/json"})[0]
        latencies[k] = time.perf_counter() - began

    threads = [threading.Thread(target=one, args=(k,)) for k in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if statuses != [200] * size:
        raise RuntimeError(f"a burst to {name} was answered {statuses}")
    return latencies


def _counts(before, after, name: str) -> Window:
    from mmserver.harness.testing import histogram, sample_value

    def delta(sample: str, **labels) -> float:
        return sample_value(after, sample, model=name, **labels) - sample_value(before, sample, model=name, **labels)

    _, rows_a, calls_a = histogram(after, "mmserver_batch_size_rows", model=name)
    _, rows_b, calls_b = histogram(before, "mmserver_batch_size_rows", model=name)
    answered = delta("mmserver_requests_total", status="200")
    return Window(answered, delta("mmserver_requests_total", status="503"),
                  delta("mmserver_requests_total") - answered - delta("mmserver_requests_total", status="503"),
                  0.0, 0.0, rows_a - rows_b, calls_a - calls_b, delta("mmserver_compute_seconds_sum"),
                  delta("mmserver_queue_wait_seconds_sum"), delta("mmserver_queue_wait_seconds_count"))


def bursts(targets: Mapping[Any, tuple[Any, str, bytes]], content_type: str, *, burst_size: int,
           bursts: int, pause_s: float = 0.1, warmup: int = 3,
           settings: Mapping[Any, Mapping[str, float]] | None = None) -> dict[Any, BurstRun]:
    """Bursts of ``burst_size`` concurrent requests, each on a fresh connection, released
    together by a barrier, to models that are idle when each burst begins.

    ``targets``: key -> (a started ``ServerProcess``, model name, one request's body).
    ``settings``: key -> ``{"max_batch_size": B, "max_wait_ms": W}``, the server's settings for
    the record (read from the server's ``GET /models/{name}`` when not given). ``warmup`` bursts
    per target first, not counted; then ``bursts`` rounds in which the targets take turns (so a
    machine's drift falls on each alike), each burst followed by ``pause_s`` of idleness and a
    ``/metrics`` scrape: the burst's counts. Every request must be answered 200.
    """
    from mmserver.harness.testing import histogram

    settings = dict(settings or {})
    for key, (server, name, _) in targets.items():
        if key not in settings:
            batching = server.json("GET", f"/models/{name}")[1]["batching"]
            settings[key] = {"max_batch_size": batching["maxBatchSize"],
                             "max_wait_ms": batching.get("maxWaitMs", float("nan"))}
    for _ in range(warmup):
        for server, name, body in targets.values():
            _one_burst(server, name, body, content_type, burst_size)
            time.sleep(pause_s)
    scraped = {key: server.metrics() for key, (server, _, _) in targets.items()}
    first = dict(scraped)
    windows: dict[Any, list[Window]] = {key: [] for key in targets}
    latencies: dict[Any, list[tuple[float, ...]]] = {key: [] for key in targets}
    for _ in range(bursts):
        for key, (server, name, body) in targets.items():
            latencies[key].append(tuple(_one_burst(server, name, body, content_type, burst_size)))
            time.sleep(pause_s)
            now = server.metrics()
            windows[key].append(_counts(scraped[key], now, name))
            scraped[key] = now
    out = {}
    for key, (server, name, body) in targets.items():
        after, _, _ = histogram(scraped[key], "mmserver_batch_size_rows", model=name)
        before, _, _ = histogram(first[key], "mmserver_batch_size_rows", model=name)
        buckets = tuple(sorted((le, n - before.get(le, 0.0)) for le, n in after.items()))
        out[key] = BurstRun(name, int(settings[key]["max_batch_size"]), float(settings[key]["max_wait_ms"]),
                            burst_size, len(body), pause_s, tuple(windows[key]), tuple(latencies[key]), buckets)
    return out


ANSWERS = {"first": min, "median": statistics.median, "last": max}


def answer_latency(run: BurstRun, which: str) -> Measurement:
    """The ``which`` (``"first"``, ``"median"`` or ``"last"``) answer of a burst, at the client
    (seconds from the burst's release to that answer on a fresh connection): the median over
    bursts, its spread the lowest and highest burst. Tolerance: a lone request to a simulated
    device of known t(1) from its t(1) to 10 % + 5 ms over it (the client's connection, the
    server's HTTP work and a sleeper's late wake-up); first ≤ median ≤ last."""
    if which not in ANSWERS:
        raise ValueError(f"which must be one of {sorted(ANSWERS)}, got {which!r}")
    per_burst = [ANSWERS[which](lat) for lat in run.latencies]
    return measurement(f"{which} answer", run.model, statistics.median(per_burst), "s", _spread(per_burst),
                       len(per_burst), run.conditions(clock="wall"), run.context(), samples=per_burst)


def drain_rate(run: ServerRun) -> Measurement:
    """Requests answered (200) per wall-clock second, whatever was shed alongside: the rate at
    which a server working through a full queue empties it (``X`` of
    ``definitions.full_queue_wait_s``). Unlike :func:`capacity` it accepts a run that shed.
    Tolerance: within 25 % of ``B / t(B)`` on a simulated device overloaded past its queue
    (as :func:`capacity`; the 503s cost a device that holds no CPU nothing)."""
    value, spread, samples = _per_window(run, lambda w: w.answered / w.window_s,
                                lambda r: r.total("answered") / r.total("window_s"))
    return measurement("drain rate", run.model, value, "requests/s", spread, len(run.windows),
                       run.conditions(clock="wall"),
                       run.context(shed_rps=round(run.total("shed") / run.total("window_s"), 1)), samples=samples)


def batch_time(run: ServerRun) -> Measurement:
    """Mean seconds of one model call in the server (``mmserver_compute_seconds`` over its
    count), at the mean batch in the record's context. Tolerance: within 25 % of ``t(B)`` on a
    saturated simulated device (as :func:`capacity`: a call is timed until the event loop
    takes its answers)."""
    value, spread, samples = _per_window(run, lambda w: w.model_call_s / w.calls,
                                lambda r: r.total("model_call_s") / r.total("calls"))
    return measurement("batch time", run.model, value, "s", spread, len(run.windows),
                       run.conditions(clock="wall"), run.context(), samples=samples)


# -- a client's view: the latency of requests sent one at a time ---------------------------------


def probe(url: str, path: str, body: bytes, headers: Mapping[str, str], stop: threading.Event, *,
          clients: int = 8, pause_s: float = 0.02, timeout_s: float = 30.0) -> list[tuple[int | None, float]]:
    """``clients`` threads each send ``body`` to ``path`` one request at a time, ``pause_s``
    apart, until ``stop`` is set: every request's (status, seconds) on ``time.perf_counter``
    (status ``None`` where the connection failed). Runs in the caller's thread until stopped."""
    from mmserver.harness.testing import http_request

    samples: list[tuple[int | None, float]] = []

    def one_client():
        while not stop.is_set():
            began = time.perf_counter()
            try:
                status = http_request(url, "POST", path, body, dict(headers), timeout=timeout_s)[0]
            except OSError:
                status = None
            samples.append((status, time.perf_counter() - began))
            time.sleep(pause_s)

    threads = [threading.Thread(target=one_client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return samples


def accepted_latency(samples: Sequence[tuple[int | None, float]], model: str, *, clients: int,
                     **conditions) -> Measurement:
    """The median seconds of :func:`probe`'s accepted (200) requests: one measurement (one
    probe), not a range over repeats; the p1 and p99 of the requests, how many were accepted,
    and the counts shed and failed in context. Tolerance: within ``within_late`` of ``t(1)`` on
    an idle simulated device with batching off."""
    import numpy as np

    ok = [s for status, s in samples if status == 200]
    if not ok:
        raise ValueError("the probe had no request accepted")
    low, median, high = np.percentile(ok, [1, 50, 99])
    return measurement("accepted latency", model, float(median), "s", (float(median), float(median)), 1,
                       {"clients": clients, "clock": "wall", **conditions},
                       {"accepted": len(ok), "p1_s": round(float(low), 4), "p99_s": round(float(high), 4),
                        "shed": sum(st == 503 for st, _ in samples),
                        "failed": sum(st not in (200, 503) for st, _ in samples)})


# -- a point of python -m loadtests.sweep ------------------------------------------------------------

#: What :func:`sweep_point` reads from a row of ``sweep.csv``: quantity -> (column, unit, scale).
SWEEP_QUANTITIES = {"mean batch": ("mean_batch_size", "rows", 1.0),
                    "device time per request": ("device_seconds_per_request", "s", 1.0),
                    "busy fraction": ("device_busy_fraction", "share", 1.0),
                    "queue wait": ("mean_queue_wait_ms", "s", 1e-3),
                    "p50": ("p50_ms", "s", 1e-3), "p99": ("p99_ms", "s", 1e-3),
                    "throughput": ("achieved_rps", "requests/s", 1.0)}


def sweep_point(row: Mapping[str, Any]) -> dict[str, Measurement]:
    """The records of one open-loop point of ``python -m loadtests.sweep`` (one repeat; also a
    row of ``loadtests.shared_device``): the server's window (mean batch, and where the row has
    them device time per request and busy fraction, by the definitions of
    :func:`device_time_per_request` and :func:`busy_fraction`; the mean queue wait) and
    locust's p50 and p99; where the row has what reached the server, the served share
    (:func:`definitions.served_share`). Each record's context carries the window's calls
    (``batches``) where the row has them.
    Conditions: the point's model, policy, MAX_WAIT as the server ran it
    (``effective_max_wait_ms`` where the row has it), MAX_BATCH_SIZE and offered load: a
    verdict compares two points only at the same load. Refused: a point whose requests failed.
    Tested (``tests/test_instruments.py``) on rows of known values: each record carries its
    column, in seconds where the row holds milliseconds."""
    if row["failures"]:
        raise ValueError(f"the point at {row['offered_rps']} requests/s failed {row['failures']} requests")
    where = {"policy": row["policy"], "max_wait_ms": row.get("effective_max_wait_ms", row["max_wait_ms"]),
             "max_batch_size": row["max_batch_size"], "offered_rps": row["offered_rps"], "clock": "wall"}
    context = {"requests": row["requests"], "shed": row["shed_503"]}
    if row.get("batches"):
        context["batches"] = int(row["batches"])   # the calls the server's window counted: what its mean batch rests on
    if row.get("device_seconds_per_request"):
        context["served_rps"] = round(row["device_busy_fraction"] / row["device_seconds_per_request"], 1)
    records = {}
    for quantity, (column, unit, scale) in SWEEP_QUANTITIES.items():
        if column in row:
            value = float(row[column]) * scale
            records[quantity] = measurement(quantity, str(row["model"]), value, unit, (value, value), 1,
                                            where, context)
    if float(row.get("sent_rps") or 0) > 0:
        share = definitions.served_share(float(row["achieved_rps"]), float(row["sent_rps"]))
        records["served share"] = measurement("served share", str(row["model"]), share, "share", (share, share), 1,
                                              where, context)
    return records


def over_repeats(records: Sequence[Measurement]) -> Measurement:
    """One quantity over repeats of the same point (the same model, quantity and conditions):
    the median, with the lowest and highest repeat as its spread."""
    first = records[0]
    for record in records:
        if (record.quantity, record.model, record.conditions) != (first.quantity, first.model, first.conditions):
            raise ValueError(f"{record.describe()} is not a repeat of {first.describe()}")
    values = [r.value for r in records]
    return measurement(first.quantity, first.model, statistics.median(values), first.unit, _spread(values),
                       len(records), first.where, samples=values)
