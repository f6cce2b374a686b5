"""The quantities the lesson names, each defined once: what it means, how it is measured.

Every notebook computes these from the numbers it measured, through these functions, so that
a word means one thing in all of them. Inputs are plain numbers (seconds, counts), never a server
or a model; units are in the names (``_s`` seconds, ``_rps`` requests or rows per second).

Settled here, once (each function's docstring gives the reason):

* **The cost line** ``t(b) = F + c·b`` is fitted by ordinary least squares through the median
  call times at ``FIT_BATCH_SIZES`` = 2, 4, 8 only. Batch 1 is left out: on a CPU it need not be a
  point of the same line (appendix 10 counts the other kernels it runs and times whether they are
  the reason). Batches past 8 are left out: there the per-row part itself changes
  (activations outgrow the caches).
* **Fixed share** and **speedup** therefore exclude batch 1 from the line. The *lone call*
  ``t₁ = min(t(1) measured, F + c)`` is the cheaper of the two readings of a one-row call, so
  that neither a slow batch-1 call nor a fast one is credited to batching.
* **Offline ceiling**, **speedup** and **capacity** are always *at a MAX_BATCH_SIZE*: a server
  capped at ``B`` can never run a larger batch, so a ceiling over larger batches is no bound
  for it.
* **Capacity** is measured, never predicted: the server's own count of answers (200s) per
  second while saturated (mean batch at least ``SATURATED_BATCH_SHARE`` of the cap) and with
  nothing shed, because shedding takes core time from the answers (notebook 06 measures
  how much less it serves while shedding). What a model predicts is the **serial limit**.
* **t_http** is per second of the server's CPU, not per wall-clock second: the two agree only
  when the server keeps its core busy, which a client need not make it do.
* **Busy fraction** is the device's view (time inside model calls over the window); how busy the
  server's *core* was is another quantity, ``core_share``.
* Two notebooks that measure the same quantity agree when they are within ``NOISE_BAND`` of
  each other (``agree``); a smaller difference is not a finding on a shared 2-core machine.
  Beyond the band they *contradict* only when their ranges over the repeats miss each other and
  that could hardly happen by chance: ``chance_apart`` of their repeat counts at most
  ``CHANCE_LEVEL``.
* Two *settings* measured in one run are **told apart** (``told_apart``) only when their ranges
  miss each other by more than ``NOISE_BAND``, or their repeats are ordered so consistently that
  chance alone would order them so at most ``CHANCE_LEVEL`` of the time (``rank_chance``; for
  ranges that miss, ``chance_apart``); otherwise a verdict says it cannot rank them.
"""

from __future__ import annotations

import collections
import functools
import math
import statistics
from collections.abc import Sequence

#: Relative difference under which two measurements of one quantity, taken in different runs
#: (or notebooks) of a shared 2-core machine, are the same number: the 15 % that
#: ``loadtests.plots.recommend`` already uses to tie single repeats.
NOISE_BAND = 0.15

#: The largest chance (``chance_apart``) at which two measurements whose ranges miss each other
#: still count as a contradiction: 1 in 100, so a run of the lesson's dozen or so comparisons
#: seldom fails on noise alone.
CHANCE_LEVEL = 0.01

#: The batch sizes the cost line ``t(b) = F + c·b`` goes through (see ``fit_cost_line``).
FIT_BATCH_SIZES = (2, 4, 8)

#: A run measures capacity only if its mean batch is at least this share of MAX_BATCH_SIZE
#: (batches back to back, nearly full): the share notebooks 01 and 06 already check.
SATURATED_BATCH_SHARE = 0.75


#: How early the event loop may run a ``call_at`` timer: its clock's resolution and the
#: loop's own rounding (asyncio runs a callback up to one clock tick before its time).
TIMER_TOLERANCE_S = 0.01

#: How long the event loop may take to act on something that is due (wake the runner after
#: its event is set, answer a refusal) and still count as "at once" on a busy 2-core machine.
SCHEDULING_SLACK_S = 0.05

def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0 or math.isinf(value):
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _pairs(batch_sizes: Sequence[int], call_seconds: Sequence[float]) -> list[tuple[int, float]]:
    if len(batch_sizes) != len(call_seconds) or not batch_sizes:
        raise ValueError("need one call time per batch size, and at least one")
    for b, t in zip(batch_sizes, call_seconds):
        _positive(batch_size=b, call_seconds=t)
    return list(zip(batch_sizes, call_seconds))


# -- the model alone ---------------------------------------------------------------------------


def fit_cost_line(batch_sizes: Sequence[int], call_seconds: Sequence[float],
                  fit_sizes: Sequence[int] = FIT_BATCH_SIZES) -> tuple[float, float]:
    """``(fixed_s, per_row_s)``: the line ``t(b) = F + c·b`` through the measured calls.

    ``call_seconds[i]`` is the median wall-clock seconds of one model call on a batch of
    ``batch_sizes[i]`` rows, in inference mode, with the threads the server gives the model
    (one on a CPU), after warm-up, the batch sizes interleaved. The line is the ordinary
    least-squares fit through the sizes in ``fit_sizes`` (2, 4, 8) only: batch 1 is left out
    because on a CPU it need not lie on the line through larger batches (other kernels run it,
    and the call time bends between 1 and 2), larger batches because their per-row cost changes.
    ``F`` is what a call of 2 rows or more costs once, ``c`` what each row adds.
    """
    points = [(b, t) for b, t in _pairs(batch_sizes, call_seconds) if b in set(fit_sizes)]
    if len({b for b, _ in points}) < 2:
        raise ValueError(f"need call times at two or more of the sizes {tuple(fit_sizes)}")
    n = len(points)
    mean_b = sum(b for b, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    per_row = (sum((b - mean_b) * (t - mean_t) for b, t in points)
               / sum((b - mean_b) ** 2 for b, _ in points))
    return mean_t - per_row * mean_b, per_row


def lone_call_seconds(batch_sizes: Sequence[int], call_seconds: Sequence[float],
                      fit_sizes: Sequence[int] = FIT_BATCH_SIZES) -> float:
    """``t₁ = min(t(1) measured, F + c)``: what one row alone costs the model, in seconds.

    The cheaper of the measured batch-1 call and a one-row call on the line of
    ``fit_cost_line``: a slow batch-1 call is not credited to batching, a fast one is not
    ignored. Needs a measured batch of 1.
    """
    measured = dict(_pairs(batch_sizes, call_seconds))
    if 1 not in measured:
        raise ValueError("the lone call needs a measured batch of 1")
    fixed_s, per_row_s = fit_cost_line(batch_sizes, call_seconds, fit_sizes)
    return min(measured[1], fixed_s + per_row_s)


def fixed_share(fixed_s: float, per_row_s: float) -> float:
    """``F / (F + c)``: the share of a one-row call, on the line, that a batch shares out.

    From ``fit_cost_line``'s ``F`` and ``c`` (batch 1 not in the fit). 0 means every second of a
    call grows with its rows (batching buys nothing), near 1 that a call costs about the same
    whatever it holds (a GPU at small batches).
    """
    if per_row_s <= 0 or fixed_s + per_row_s <= 0:
        raise ValueError(f"the line must rise with the batch: F={fixed_s!r}, c={per_row_s!r}")
    return fixed_s / (fixed_s + per_row_s)


def offline_ceiling_rps(batch_sizes: Sequence[int], call_seconds: Sequence[float],
                        max_batch_size: int | None = None) -> tuple[float, int]:
    """``(rows/s, best batch size)``: ``max b / t(b)`` over the measured batches ``b ≤ B``.

    The most rows per second the model alone serves (this process, the server's threads, no
    HTTP, no queue) over the measured batch sizes up to ``max_batch_size`` (all of them when
    None): no server capped at ``B`` can beat it on the same core or device. Measure every
    size the server may run, up to ``B``.
    """
    pairs = [(b, t) for b, t in _pairs(batch_sizes, call_seconds)
             if max_batch_size is None or b <= max_batch_size]
    if not pairs:
        raise ValueError(f"no measured batch size is within max_batch_size={max_batch_size}")
    best_b, best_t = max(pairs, key=lambda p: (p[0] / p[1], -p[0]))
    return best_b / best_t, best_b


def speedup(batch_sizes: Sequence[int], call_seconds: Sequence[float],
            max_batch_size: int | None = None,
            fit_sizes: Sequence[int] = FIT_BATCH_SIZES) -> float:
    """Speedup from batching: offline ceiling (at ``max_batch_size``) × the lone call ``t₁``.

    How many times the rows/s of one-row calls the model alone reaches in its best batch up to
    ``B``. Against ``t₁`` (``lone_call_seconds``), not the measured batch 1: the smaller of the
    two readings, so that another kernel at batch 1 is not counted as batching's gain. The
    gain *through a server* is another quantity: ``served_gain``.
    """
    ceiling, _ = offline_ceiling_rps(batch_sizes, call_seconds, max_batch_size)
    return ceiling * lone_call_seconds(batch_sizes, call_seconds, fit_sizes)


def speedup_over_t1(batch_sizes: Sequence[int], call_seconds: Sequence[float],
                    max_batch_size: int | None = None) -> float:
    """The offline ceiling (at ``max_batch_size``) × the *measured* ``t(1)``.

    What the model alone predicts for the served gain: a server with batching off pays the
    measured batch-1 call per request, not ``t₁``, so a server that added nothing to a request
    would gain this much. It is ``speedup`` × ``t(1)/t₁``: the same where batch 1 lies on or
    below the line, larger where it runs slower kernels. Needs a measured batch of 1.
    """
    measured = dict(_pairs(batch_sizes, call_seconds))
    if 1 not in measured:
        raise ValueError("the speedup over t(1) needs a measured batch of 1")
    ceiling, _ = offline_ceiling_rps(batch_sizes, call_seconds, max_batch_size)
    return ceiling * measured[1]


# -- the server --------------------------------------------------------------------------------


def t_http_s(server_cpu_s: float, answered: int) -> float:
    """``t_http``: seconds of the server's CPU per request answered, for all but the model.

    Measured with a no-op model (it computes nothing and answers as many numbers per row as
    the real one) at the MAX_BATCH_SIZE and with the request body of the comparison, driven by
    closed-loop keep-alive clients on another core: the server process's CPU seconds (user +
    system, every thread) over the window, divided by the requests it answered (200) in it.
    Per CPU second, not per wall-clock second (``1 / requests/s``): the two agree only when the
    server kept its core busy, which the client need not make it do.
    """
    _positive(server_cpu_s=server_cpu_s, answered=answered)
    return server_cpu_s / answered


def cores_to_feed(device_ceiling_rps: float, t_http: float) -> float:
    """Cores of server work that serving a device's ceiling takes: ``ceiling × t_http``.

    ``device_ceiling_rps`` is the device's ``offline_ceiling_rps`` at the server's
    MAX_BATCH_SIZE; ``t_http`` the CPU seconds one process (or one of a server's processes)
    spent per request, measured with a model that holds no CPU (``t_http_s``). Arithmetic,
    not a measurement: under 1, one core can keep the device busy; over 1, a process doing
    that work is the limit, not the device, however idle the device is.
    """
    _positive(device_ceiling_rps=device_ceiling_rps, t_http=t_http)
    return device_ceiling_rps * t_http


def serial_limit_rps(t_http: float, call_s: float, batch_rows: float) -> float:
    """``1 / (t_http + t(b)/b)``: requests/s one core can serve at batches of ``b`` rows.

    A prediction from two separate measurements, ``t_http_s`` and the model's call on ``b``
    rows (``call_s``, in this process), for a server whose HTTP work and model calls take turns
    on one core. An estimate, not a bound: a run may exceed it a little. With ``b`` the cap
    ``B`` and full batches it is the queueing model's capacity (``loadtests.queueing.capacity``).
    """
    _positive(t_http=t_http, call_s=call_s, batch_rows=batch_rows)
    return 1.0 / (t_http + call_s / batch_rows)


def served_share(served_rps: float, sent_rps: float) -> float:
    """Served share: the requests a server answered over those that reached it and were
    answered or refused (503), in one window of an open-loop run: ``served / sent``.

    Why not the served rate itself: under random (Poisson) arrivals at one offered rate, each
    run brings its own count of requests, so two settings that both answered everything serve
    different rates by chance alone (notebook 07's served 232 against 215 requests/s at 221
    offered, nothing shed). The share cancels each run's own arrivals: 1 when the server kept up,
    less by what it refused.
    """
    _positive(sent_rps=sent_rps)
    if served_rps < 0 or served_rps > sent_rps * (1 + 1e-9):
        raise ValueError(f"served {served_rps!r} must lie between 0 and sent {sent_rps!r}")
    return min(1.0, served_rps / sent_rps)


def backlog_growth_s(latencies_in_arrival_order: Sequence[float]) -> float:
    """Backlog growth: the median latency of the last quarter of an open loop's arrivals less
    that of its first quarter, in seconds.

    Why: a runner that keeps up answers the last arrivals as fast as the first; one that falls
    behind leaves each arrival to wait for the backlog before it, and that backlog grows
    through the run. Served at ``μ`` against arrivals at ``λ > μ`` for ``T`` seconds, the k-th
    arrival waits about ``k (1/μ − 1/λ)``, so the quarters' middles (the 1/8 and 7/8 points)
    lie ``0.75 T (λ/μ − 1)`` apart: half a second for a run of 2 s at a third over capacity.
    A p99 cannot show this as plainly: a run that kept up can still have a slow tail, and a
    short run that fell behind can still have a small one.
    """
    latencies = list(latencies_in_arrival_order)
    if len(latencies) < 8:
        raise ValueError(f"need at least 8 arrivals for two quarters of two, got {len(latencies)}")
    quarter = len(latencies) // 4
    return statistics.median(latencies[-quarter:]) - statistics.median(latencies[:quarter])


def capacity_rps(answered: int, window_s: float, *, shed: int, mean_batch_rows: float,
                 max_batch_size: int, mean_queue_wait_s: float | None = None,
                 mean_call_s: float | None = None) -> float:
    """Capacity: requests answered (200) per second by a saturated server that shed nothing.

    Measured, not predicted: closed-loop clients without think time, at least twice
    MAX_BATCH_SIZE and at most the server's queue size of them (so nothing can be shed), drive
    one model; the server's own count of 200s over a window inside the run (``/metrics``
    deltas) divided by the window's seconds. It is a capacity only if the batches ran back to
    back nearly full (mean batch ≥ ``SATURATED_BATCH_SHARE`` × MAX_BATCH_SIZE) and nothing was
    shed: a ValueError says which condition failed. What a server serves while shedding is
    less (the 503s take core time), and is not its capacity.

    With batching off (MAX_BATCH_SIZE 1) every call is full, so fullness proves nothing; there
    a saturated server has requests waiting behind each call, and the check is that the mean
    queue wait was at least the mean call (``mean_queue_wait_s``, ``mean_call_s``: required).
    """
    _positive(window_s=window_s, max_batch_size=max_batch_size)
    if shed:
        raise ValueError(f"{shed} requests were shed: a run that sheds does not measure capacity")
    if mean_batch_rows < SATURATED_BATCH_SHARE * max_batch_size:
        raise ValueError(f"mean batch {mean_batch_rows:g} < {SATURATED_BATCH_SHARE:g} × "
                         f"{max_batch_size}: the server was not saturated")
    if max_batch_size == 1:
        if mean_queue_wait_s is None or mean_call_s is None:
            raise ValueError("batching off: saturation needs the mean queue wait and the mean call")
        if not mean_queue_wait_s >= mean_call_s > 0:
            raise ValueError(f"mean queue wait {mean_queue_wait_s * 1e3:.3g} ms < one call "
                             f"({mean_call_s * 1e3:.3g} ms): with batching off the server was not saturated")
    return answered / window_s


def full_queue_wait_s(max_queue_size: int, max_batch_size: int, drain_rps: float) -> float:
    """The queue bound: ``(Q + B) / X``, the most a request admitted into a full queue waits.

    ``Q`` is the server's ``max_queue_size``, ``B`` its ``max_batch_size`` (the batch in flight
    when the request is admitted), ``X`` the requests/s the server answers while the queue stays
    full (``drain_rps``). Admitted at the back of a full queue just after a batch left it, a
    request waits for that batch, then for the ``Q/B`` batches the queue holds (its own among
    them); admitted as that batch ends, only for those, ``Q / X``: the least it waits. Under overload ``X`` is the accepted throughput while shedding, which is less than
    ``capacity_rps`` (the 503s take core time): divided by the capacity, the bound is a
    prediction made before the overload, and too short by shedding's cost. HTTP work before and
    after the queue, and batches slower than the average, come on top.
    """
    _positive(max_queue_size=max_queue_size, max_batch_size=max_batch_size, drain_rps=drain_rps)
    return (max_queue_size + max_batch_size) / drain_rps


def least_queue_wait_s(max_queue_size: int, drain_rps: float) -> float:
    """The queue's lower bound: ``Q / X``, what a request admitted into a full queue waits
    when it arrives as a batch ends, for the ``Q / B`` batches the queue holds, its own among
    them (:func:`full_queue_wait_s` has the symbols, and the upper bound)."""
    _positive(max_queue_size=max_queue_size, drain_rps=drain_rps)
    return max_queue_size / drain_rps


def refill_s(max_batch_size: int, arriving_rps: float) -> float:
    """How long arrivals take to fill the ``B`` places a batch frees in a full queue: ``B``
    divided by the requests/s that reach the server, accepted and shed together. Far shorter
    than a batch, the queue stays full, and an admitted request enters it just after a batch
    left (:func:`full_queue_wait_s`'s upper case, less half of this)."""
    _positive(max_batch_size=max_batch_size, arriving_rps=arriving_rps)
    return max_batch_size / arriving_rps


def shed_cost_s(capacity_rps: float, accepted_rps: float, shed_rps: float) -> float:
    """Server core seconds one shed request (503) costs: ``(1 − accepted/capacity) / shed``.

    ``capacity_rps`` from ``capacity_rps`` (nothing shed), ``accepted_rps`` the 200s per second
    of a run that shed ``shed_rps`` 503s per second, both the server's own counts, both runs
    with the server's core busy (``core_share`` near 1): the share of the core's answering that
    the shedding run lost, spread over its 503s. Two runs of a shared machine: read it as an
    order of magnitude. Negative when the shedding run answered more than the capacity (noise).
    """
    _positive(capacity_rps=capacity_rps, shed_rps=shed_rps)
    if accepted_rps < 0:
        raise ValueError(f"accepted_rps must not be negative, got {accepted_rps!r}")
    return (1.0 - accepted_rps / capacity_rps) / shed_rps


def served_gain(capacity_batched_rps: float, capacity_unbatched_rps: float) -> float:
    """Gain through the server: capacity with batching on over capacity with it off.

    Both ``capacity_rps`` of one model on one core, at MAX_BATCH_SIZE ``B`` and at 1. It differs
    from the model's ``speedup``: batching divides the model's fixed part and the server's
    per-call work, not the server's per-request work.
    """
    _positive(capacity_batched_rps=capacity_batched_rps, capacity_unbatched_rps=capacity_unbatched_rps)
    return capacity_batched_rps / capacity_unbatched_rps


def server_added_s(capacity_rps: float, call_s: float, batch_rows: float) -> float:
    """``1/capacity − t(b)/b``: wall-clock seconds per request the saturated server spent
    beyond the model's share of a call.

    ``capacity_rps`` from ``capacity_rps`` at MAX_BATCH_SIZE ``b`` (full batches), ``call_s``
    the model's measured ``t(b)`` in process on the same kind of core: what the server's own
    work (HTTP, decoding, queueing, stacking rows, waking threads) added to each request. It
    falls with batching where a batch shares the server's per-call work; it can come out a
    little negative when the two measurements' noise exceeds it.
    """
    _positive(capacity_rps=capacity_rps, call_s=call_s, batch_rows=batch_rows)
    return 1.0 / capacity_rps - call_s / batch_rows


def efficiency(measured_rps: float, limit_rps: float) -> float:
    """Measured throughput over the serial limit (``serial_limit_rps``), both per CPU second.

    Near 1: the two-part account (``t_http`` + the model's share of a call) explains what the
    server served. Well under 1: the server pays for something the account leaves out.
    """
    _positive(limit_rps=limit_rps)
    if measured_rps < 0:
        raise ValueError(f"measured_rps must not be negative, got {measured_rps!r}")
    return measured_rps / limit_rps


def busy_fraction(model_call_s: float, window_s: float) -> float:
    """Busy fraction: seconds inside model calls over the window's seconds (the device's view).

    From the server's ``mmserver_compute_seconds`` (its ``_sum`` delta over the window). On a
    GPU that is the device's time; on a CPU the time the model's thread spent in calls, which
    on one shared core includes the event loop's turns. A call that straddles the window's
    start counts whole, so a saturated device may read a few per cent over 1. Busy is not
    needed: ``device_seconds_per_request`` says what the load needs.
    """
    _positive(window_s=window_s)
    if model_call_s < 0:
        raise ValueError(f"model_call_s must not be negative, got {model_call_s!r}")
    return model_call_s / window_s


def core_share(server_cpu_s: float, window_s: float) -> float:
    """How busy the server's *core* was: its process's CPU seconds over the window's seconds.

    Not the busy fraction (``busy_fraction`` counts model calls): a server can keep its core
    busy with HTTP work while the device idles, and a simulated device idles no core at all.
    """
    _positive(window_s=window_s)
    if server_cpu_s < 0:
        raise ValueError(f"server_cpu_s must not be negative, got {server_cpu_s!r}")
    return server_cpu_s / window_s


def device_seconds_per_request(model_call_s: float, answered: int) -> float:
    """Device time per request: seconds inside model calls over requests answered (200).

    The same window and the same ``mmserver_compute_seconds`` as ``busy_fraction``. What the
    load needs of the device: its inverse is the requests/s the device could carry at the
    batches that formed. MAX_WAIT below capacity lowers it (fuller batches), at a price in
    latency.
    """
    _positive(answered=answered)
    if model_call_s < 0:
        raise ValueError(f"model_call_s must not be negative, got {model_call_s!r}")
    return model_call_s / answered


def device_time_saved(greedy_s_per_request: float, waiting_s_per_request: float) -> float:
    """Share of greedy's device time per request that a MAX_WAIT saves at the same load.

    ``1 − waiting / greedy``, both ``device_seconds_per_request`` at one offered load below
    capacity. The saved time is worth something only when something else uses the device
    (another model, a bill for the device's busy seconds); it is not headroom for the same model, whose
    batches fill at saturation under greedy anyway.
    """
    _positive(greedy_s_per_request=greedy_s_per_request)
    if waiting_s_per_request < 0:
        raise ValueError(f"waiting_s_per_request must not be negative, got {waiting_s_per_request!r}")
    return 1.0 - waiting_s_per_request / greedy_s_per_request


def queue_wait_s(arrived_s: float, launched_s: float) -> float:
    """Queue wait: from a request's arrival to the start of the model call that holds it.

    Both on one clock. The time a request spends waiting for company or for the model, not
    the call itself; a refused request has none.
    """
    if launched_s < arrived_s:
        raise ValueError(f"a call cannot hold a request before it arrived: {arrived_s!r} > {launched_s!r}")
    return launched_s - arrived_s


# -- comparing measurements ----------------------------------------------------------------------


def value_gap(a: float, b: float) -> float:
    """How far apart two positive values are: the larger over the smaller, less one. Symmetric,
    so neither value is the reference; it is what :func:`agree` holds to the band, and what a
    sentence prints as "the larger N% above the smaller"."""
    return max(a, b) / min(a, b) - 1.0


def agree(a: float, b: float, band: float = NOISE_BAND) -> bool:
    """Whether two positive measurements of one quantity are the same number within ``band``.

    Symmetric: the larger is at most ``1 + band`` times the smaller (a band's edge agrees,
    whatever the last bit of its float product says).
    """
    _positive(a=a, b=b)
    return value_gap(a, b) <= band + 1e-9


def indistinguishable(range_a: tuple[float, float], range_b: tuple[float, float],
                      band: float = NOISE_BAND) -> bool:
    """Whether two p99s, each a (lowest, highest) over its repeats, cannot be ranked.

    Two ranges over repeats that overlap cannot be told apart; a single repeat (lowest ==
    highest) is widened to ``band`` above it, as ``loadtests.plots.recommend`` widens it.
    """
    def widened(r):
        low, high = r
        if low > high:
            raise ValueError(f"a range is (lowest, highest), got {r!r}")
        return (low, high * (1.0 + band)) if low == high else (low, high)

    (low_a, high_a), (low_b, high_b) = widened(range_a), widened(range_b)
    return low_a <= high_b and low_b <= high_a


def chance_apart(repeats_a: int, repeats_b: int) -> float:
    """The chance that ``repeats_a`` and ``repeats_b`` repeats of one and the same measurement
    fall into two ranges that miss each other: ``2 / C(a + b, a)``.

    Why: if nothing differs between the two runs, every order of the ``a + b`` values is equally
    likely, and only two orders (all of one below all of the other) leave the ranges apart.
    Three repeats against three miss each other one time in ten by chance alone, so such a pair
    cannot show a contradiction at ``CHANCE_LEVEL``; five against five (0.8 %) can.
    """
    if repeats_a < 1 or repeats_b < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats_a!r} and {repeats_b!r}")
    return min(1.0, 2 / math.comb(repeats_a + repeats_b, repeats_a))


def rank_chance(samples_a: Sequence[float], samples_b: Sequence[float]) -> float:
    """The chance that two sets of repeats of one and the same measurement come out ordered at
    least as consistently as ``samples_a`` against ``samples_b``: the exact two-sided rank test
    (Mann and Whitney's), exact over ties too.

    Why: a range is its two most extreme repeats, so over many repeats one odd repeat (a burst
    that happened to arrive as one call) makes two ranges touch although every other repeat
    ranks them. Count the pairs, one repeat of each, in which ``a``'s repeat is the larger, a
    tie as half a pair: ``U``. If nothing differs, every way of dealing the ``a + b`` values out
    to the two sides is equally likely, and the chance is twice the share of deals whose ``U``
    lies at least as far out, on the nearer side. Ties are counted as they fell: a mean batch
    pinned at its cap (every burst with a wait ran as one call) ties with each greedy burst that
    happened to run as one call too, and a test that counted each such tie as a whole pair
    against the order would refuse an ordering that chance alone rarely deals. With ``U = 0``
    (ranges that miss each other) it is ``chance_apart``; twenty against twenty with no ties stay
    within ``CHANCE_LEVEL`` with up to 105 of their 400 pairs against the order.
    """
    a, b = list(samples_a), list(samples_b)
    if not a or not b:
        raise ValueError(f"need repeats on both sides, got {len(a)} and {len(b)}")
    above = sum(2 * (x > y) + (x == y) for x in a for y in b)       # in half pairs
    ties = tuple(count for _, count in sorted(collections.Counter(a + b).items()))
    deals = _deals_by_half_pairs(ties, len(a))
    nearer = min(sum(n for u, n in deals.items() if u <= above), sum(n for u, n in deals.items() if u >= above))
    return min(1.0, 2 * nearer / math.comb(len(a) + len(b), len(a)))


@functools.lru_cache(maxsize=None)
def _deals_by_half_pairs(ties: tuple[int, ...], m: int) -> dict[int, int]:
    """How many ways of dealing ``m`` of the pooled values to the first side give each ``U``
    (in half pairs): ``ties`` holds how many values share each distinct value, smallest first.
    Taking ``j`` of a group puts each of them above every second-side value dealt before it
    and level with the ``size - j`` left to the second side."""
    deals = {(0, 0): 1}                         # (dealt to the first side, U) -> ways
    seen, pooled = 0, sum(ties)
    for size in ties:
        after: dict[tuple[int, int], int] = {}
        for (dealt, u), ways in deals.items():
            for j in range(max(0, m - dealt - (pooled - seen - size)), min(size, m - dealt) + 1):
                key = (dealt + j, u + 2 * j * (seen - dealt) + j * (size - j))
                after[key] = after.get(key, 0) + ways * math.comb(size, j)
        deals, seen = after, seen + size
    return {u: ways for (dealt, u), ways in deals.items() if dealt == m}


def range_gap(range_a: tuple[float, float], range_b: tuple[float, float]) -> float:
    """How far two ranges (lowest, highest) miss each other: the higher range's low end over the
    lower range's high end, less one (negative where they overlap; not a number where the lower
    range ends at zero or below, where no ratio says how far, so no comparison with it holds)."""
    lower, upper = sorted((range_a, range_b))
    return upper[0] / lower[1] - 1.0 if lower[1] > 0 else math.nan


def told_apart(range_a: tuple[float, float], repeats_a: int, range_b: tuple[float, float], repeats_b: int,
               band: float = NOISE_BAND, samples_a: Sequence[float] = (),
               samples_b: Sequence[float] = ()) -> bool:
    """Whether two settings' measurements, each a (lowest, highest) over its repeats, rank them.

    Either their ranges miss each other (not ``indistinguishable``) by a gap between the nearer
    ends wider than ``band``, or chance alone would order their repeats so at most
    ``CHANCE_LEVEL`` of the time: ``rank_chance`` over the repeats themselves (``samples_a``,
    ``samples_b``) when both records kept them, else ``chance_apart`` when the ranges miss.

    Why both: two repeats against two miss each other one time in three with nothing behind
    it, so missing alone ranks nothing; but a range of two repeats also understates how far a
    repeat can move, and a gap wider than the band is beyond what repeats of one measurement
    do on this machine. A narrow gap over few repeats is not told apart.
    """
    apart = not indistinguishable(range_a, range_b, band)
    if apart and range_gap(range_a, range_b) > band + 1e-9:
        return True
    if samples_a and samples_b:
        return rank_chance(samples_a, samples_b) <= CHANCE_LEVEL
    return apart and chance_apart(repeats_a, repeats_b) <= CHANCE_LEVEL
