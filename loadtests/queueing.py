"""A model of the batching trade-off: capacity and latency of each setting, from two costs.

The two measured costs:

``t(b) = a + c*b``
    seconds of one model call on a batch of ``b`` rows (``fit_batch_cost`` fits ``a``, the
    fixed part paid once per call, and ``c``, the part paid per row, to timings as
    notebook 01 takes them);
``t_http``
    seconds of the server's core per request for everything but the model (HTTP, decoding,
    the runner, encoding), measured with a no-op model as ``bench/server_efficiency.py`` does.

The queueing model (``predict``) is a *mean-value* approximation of a single server that
serves requests in batches, under these assumptions:

* Poisson arrivals at ``rate`` requests/s (what the sweep's open-loop users send);
* one core does everything: the HTTP work of every request and the model calls take turns on
  it, so a batch of ``b`` occupies the core for ``t(b) + b * t_http``: the *cycle*;
* ``greedy``: when the model becomes free it takes everything queued, up to
  ``max_batch_size``; MAX_WAIT does not enter (greedy waits only for requests already
  admitted and still being decoded, which this model does not see);
* ``timer``: a batch that is not full waits up to MAX_WAIT for company.

Then:

* **capacity** (the most a setting can serve) is reached with full batches:
  ``1 / (t_http + c + a / max_batch_size)`` requests/s;
* **mean batch** below capacity: a batch holds what arrived during the previous cycle,
  ``b = rate * (a + b * (c + t_http))``, i.e. ``b = rate * a / (1 - rate * (c + t_http))``,
  clipped to ``[1, max_batch_size]`` (plus, for ``timer``, what arrives during its wait);
* **latency**: with batches of one and spare time the server is an M/D/1 queue with service
  ``S = t_http + t(1)`` (mean wait ``rho * S / (2 (1 - rho))``); once batches form, the core
  is always busy and a request waits on average half a cycle for the running batch, then a
  whole cycle for its own: ``1.5 * cycle``, plus, near capacity, an M/D/1 wait with
  service ``1 / capacity`` at utilisation ``rate / capacity`` (the knee). We take the lower of the two
  estimates (batching starts exactly where the single-request queue would build up). p99
  uses the M/G/1 tail approximation ``P(W > x) ~ rho * exp(-rho * x / E[W])`` for the
  queueing parts, and ``2 * cycle`` (a request that just missed a batch) once batches form;
* **past capacity** the queue is full: the server serves ``capacity`` requests/s, sheds the
  rest with 503, and every answered request waited about ``max_queue_size / capacity``.

What it leaves out (and why measured points can differ): the cost of answering 503s (past
capacity it takes core time from the served requests, so measured throughput falls as
offered load rises: the frontier folds back), the load generator's own limits, the spread
of batch sizes around the mean (Poisson arrivals make some batches bigger, which raises the
tail), and a machine shared with other work (a slower core shifts every point).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class BatchCost:
    """``t(b) = a + c*b`` seconds; ``t1``, when given, is the *measured* one-row call.

    On a CPU a batch of one need not lie on the line through larger batches (resnet18's t(1)
    is well above ``a + c``), and with batching off every call is a batch of one: fed the
    line's t(1), the model predicts a batching-off server faster than the one measured.
    ``loadtests.instruments.queueing_cost`` builds it from measured call times.
    """

    a: float
    c: float
    t1: float | None = None

    def __call__(self, b: float) -> float:
        if b == 1 and self.t1 is not None:
            return self.t1
        return self.a + self.c * b

    def per_request(self, mean_batch: float) -> float:
        """Seconds of calls a request costs when the calls held ``mean_batch`` rows on average,
        taken to be of the two whole sizes around it (1.43 rows: 57 % ones and 43 % twos), the
        narrowest mix with that mean: a lightly loaded greedy server's calls are mostly ones.
        Why not ``t(mean_batch) / mean_batch``: with the measured t(1) off the line, a mix of
        ones and twos costs what its calls cost, not what a call of 1.43 rows on the line would."""
        if mean_batch < 1:
            raise ValueError(f"a call holds at least one row, got a mean of {mean_batch!r}")
        low = math.floor(mean_batch)
        larger = mean_batch - low          # the share of calls one row larger
        return ((1 - larger) * self(low) + larger * self(low + 1)) / mean_batch

    def offline_ceiling(self, b: float) -> float:
        """Rows/s the model alone serves at batch ``b`` (no HTTP): ``b / t(b)``."""
        return b / self(b)


def fit_batch_cost(batch_sizes: Sequence[float], seconds: Sequence[float]) -> BatchCost:
    """Least-squares ``a`` and ``c`` of ``t(b) = a + c*b``, each weighted by ``1/t(b)`` so
    that small batches (the latencies that matter at low load) fit as well as big ones."""
    if len(batch_sizes) != len(seconds) or len(batch_sizes) < 2:
        raise ValueError("need at least two (batch size, seconds) pairs")
    weights = [1.0 / t for t in seconds]  # relative error, not absolute
    sw = sum(w * w for w in weights)
    sx = sum(w * w * b for w, b in zip(weights, batch_sizes))
    sy = sum(w * w * t for w, t in zip(weights, seconds))
    sxx = sum(w * w * b * b for w, b in zip(weights, batch_sizes))
    sxy = sum(w * w * b * t for w, b, t in zip(weights, batch_sizes, seconds))
    det = sw * sxx - sx * sx
    if det == 0:
        raise ValueError("need at least two different batch sizes")
    c = (sw * sxy - sx * sy) / det
    a = (sy - c * sx) / sw
    return BatchCost(a=a, c=c)


def capacity(cost: BatchCost, t_http: float, max_batch_size: int) -> float:
    """Requests/s one core serves with full batches: ``1 / (t_http + t(B)/B)``."""
    return 1.0 / (t_http + cost(max_batch_size) / max_batch_size)


@dataclasses.dataclass(frozen=True)
class Prediction:
    rate: float           #: offered requests/s
    served: float         #: requests/s answered 200
    mean_batch: float     #: rows per model call
    cycle_ms: float       #: one batch's time on the core, t(b) + b * t_http
    mean_ms: float        #: mean latency of a served request
    p99_ms: float         #: 99th percentile latency of a served request
    saturated: bool       #: past capacity (503s expected)


def predict(cost: BatchCost, t_http: float, max_batch_size: int, rate: float,
            max_wait_s: float = 0.0, policy: str = "greedy",
            max_queue_size: int = 64) -> Prediction:
    """The model's view of one sweep point (see the module docstring)."""
    big_b = max(1, int(max_batch_size))
    cap = capacity(cost, t_http, big_b)
    if rate >= cap:  # past capacity: full batches, a full queue, the rest shed
        cycle = cost(big_b) + big_b * t_http
        queued = max_queue_size / cap
        return Prediction(rate, cap, float(big_b), cycle * 1e3, (queued + cycle) * 1e3,
                          (queued + 2 * cycle) * 1e3, True)
    per_row = cost.c + t_http
    b = rate * cost.a / (1 - rate * per_row) if rate * per_row < 1 else float(big_b)
    timer_wait = 0.0
    if policy == "timer" and big_b > 1 and max_wait_s > 0:
        # the oldest request waits until the batch is full or MAX_WAIT has passed
        timer_wait = min(max_wait_s, (big_b - 1) / rate) if rate > 0 else max_wait_s
        b = max(b, 1 + rate * timer_wait)
    b = min(float(big_b), max(1.0, b))
    cycle = cost(b) + b * t_http
    # batches of one with spare time: M/D/1 on S = t_http + t(1)
    service = t_http + cost(1)
    rho = rate * service
    if rho < 1:
        queue_wait = rho * service / (2 * (1 - rho))
        single_mean = service + queue_wait
        tail = (queue_wait / rho) * math.log(100 * rho) if rho > 0.01 else 0.0
        single_p99 = service + max(0.0, tail)
    else:
        single_mean = single_p99 = math.inf
    # batches forming: half a cycle for the running batch, a whole one for our own, and near
    # capacity the M/D/1 wait at utilisation rate / capacity, per request of 1 / capacity
    rho_full = rate / cap
    near_cap = rho_full / cap / (2 * (1 - rho_full))
    near_cap_tail = (near_cap / rho_full) * math.log(100 * rho_full) if rho_full > 0.01 else 0.0
    batched_mean = 1.5 * cycle + near_cap
    batched_p99 = 2.0 * cycle + max(0.0, near_cap_tail)
    if big_b == 1:
        mean, p99 = single_mean, single_p99
    else:
        mean, p99 = min(single_mean, batched_mean), min(single_p99, batched_p99)
    if policy == "timer":
        mean, p99 = mean + timer_wait / 2, p99 + timer_wait
    # a request never waits longer than a full queue takes to drain
    bound = max_queue_size / cap + cost(big_b) + big_b * t_http
    mean, p99 = min(mean, bound), min(p99, bound + cost(big_b) + big_b * t_http)
    return Prediction(rate, rate, b, cycle * 1e3, mean * 1e3, p99 * 1e3, False)


def predict_curve(cost: BatchCost, t_http: float, max_batch_size: int,
                  rates: Sequence[float], **kwargs) -> list[Prediction]:
    return [predict(cost, t_http, max_batch_size, rate, **kwargs) for rate in rates]
