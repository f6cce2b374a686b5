"""Calibration: each instrument of ``loadtests.instruments``, run against a system whose truth
is known, recovers that truth within the tolerance its docstring states.

The systems: the simulated device with a chosen t(b) (a wall-clock truth, no CPU held), a model
that burns a known CPU time per call and then waits a known time (so the CPU clock and the wall
clock have different truths), a served path with a known added CPU cost per request, and a
discrete-event simulation of one core serving batches with known service times (the queueing
model's truth). Tolerances come from the method, not from one run: medians over rounds of many
calls; the server's quantities are ratios of its own counters over windows of hundreds of
requests. A broken instrument (a skipped batch size, the wrong clock, the line's t(1) for the
measured one) fails here.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import json
import random
import sys
import threading
import time

import pytest
import torch
from conftest import ROOT

if str(ROOT) not in sys.path:  # loadtests/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

from loadtests import definitions, instruments, queueing  # noqa: E402
from mmserver.harness import known_cost, simulated_device  # noqa: E402
from mmserver.harness.known_cost import KnownCost, spin  # noqa: E402
from mmserver.harness.simulated_device import SimulatedDevice  # noqa: E402
from mmserver.harness.testing import ServerProcess  # noqa: E402

_streams = itertools.count()
FEATURES = 16
ROW = (FEATURES,)


def within(measured: float, truth: float, tolerance: float) -> bool:
    return abs(measured - truth) <= tolerance * abs(truth)


#: How late a sleeping thread may wake on a busy 2-core machine (about a scheduler's time
#: slice). A simulated call runs late by up to this, never early; medians over rounds absorb
#: most of it, not when other work holds both cores for seconds.
LATE_S = 0.002


def within_late(measured: float, truth: float, late_s: float = LATE_S, early_s: float = 0.0) -> bool:
    """A wall-clock reading of a sleeping device: 3 % below (timer granularity, ``early_s`` where
    a fit subtracts late points) to 10 % above the truth, plus ``late_s``."""
    return truth * 0.97 - early_s <= measured <= truth * 1.10 + late_s


# -- the model alone: a simulated device with a chosen t(b) (wall clock) --------------------------

#: t(b) chosen so that every rule shows: batch 1 off the line (20 ms against F + c = 11.25 ms),
#: the line 10 ms + 1.25 ms·b through 2, 4, 8, and rows/s best at 16, not at B = 32 (past 16
#: each row costs 2.5 ms more), so a ceiling that skips 16 is wrong. Milliseconds, not tenths:
#: each call's one sleep overshoots by a scheduler's wake-up (about 0.05 ms a call), a few
#: tenths of a per cent of the shortest call here.
F_S, C_S, T1_S, BENT_FROM = 0.010, 0.00125, 0.020, 16
B_SIM = 32


def bent(batch_size: float) -> float:
    if batch_size == 1:
        return T1_S
    return F_S + C_S * batch_size + (0.0025 * (batch_size - BENT_FROM) if batch_size > BENT_FROM else 0.0)


TRUE_CEILING = BENT_FROM / bent(BENT_FROM)                 # 533 rows/s at b = 16
TRUE_SPEEDUP = TRUE_CEILING * min(T1_S, F_S + C_S)       # against t₁ = F + c


@pytest.fixture(scope="module")
def simulated_times() -> instruments.CallTimes:
    device = SimulatedDevice(bent, stream=f"calibration-{next(_streams)}")
    return instruments.time_calls(device, ROW, B_SIM, clock="wall", rounds=5, seconds_per_round=0.04,
                                  name="simulated")


def test_profile_covers_every_size_the_ceiling_needs():
    assert instruments.profile_sizes(32) == (1, 2, 4, 8, 16, 32)
    assert instruments.profile_sizes(12) == (1, 2, 4, 8, 12)
    assert instruments.profile_sizes(1) == (1,)
    assert set(definitions.FIT_BATCH_SIZES) <= set(instruments.profile_sizes(16))


def test_call_times_recover_the_simulated_t_of_b_on_the_wall_clock(simulated_times):
    assert simulated_times.batch_sizes == instruments.profile_sizes(B_SIM)
    for b in simulated_times.batch_sizes:
        record = instruments.call_time(simulated_times, b)
        assert within_late(record.value, bent(b)), record.describe()
        assert record.where["clock"] == "wall"
        low, high = record.spread
        assert low <= record.value <= high


def test_the_measured_t1_is_not_the_lines(simulated_times):
    t1 = instruments.call_time(simulated_times, 1)
    assert within_late(t1.value, T1_S), t1.describe()
    cost = instruments.queueing_cost(simulated_times)
    assert cost(1) == t1.value and within_late(cost(2), bent(2), 1.5 * LATE_S, 0.5 * LATE_S)


def test_cost_line_and_fixed_share(simulated_times):
    fixed, per_row = instruments.cost_line(simulated_times)
    # the fit through 2, 4, 8 weighs t(2), t(4), t(8) by 1, 1/2, -1/2 for F and by about
    # -1/7, -1/28, 5/28 per ms for c: how far a late point can move each
    assert within_late(fixed.value, F_S, 1.5 * LATE_S, 0.5 * LATE_S), fixed.describe()
    assert within_late(per_row.value, C_S, 0.18 * LATE_S, 0.18 * LATE_S), per_row.describe()
    share = instruments.fixed_share(simulated_times)
    assert abs(share.value - F_S / (F_S + C_S)) <= 0.05, share.describe()


def test_offline_ceiling_and_speedup_find_the_best_size_below_b(simulated_times):
    ceiling = instruments.offline_ceiling(simulated_times, B_SIM)
    assert within_late(BENT_FROM / ceiling.value, bent(BENT_FROM)), ceiling.describe()
    assert ceiling.observed["best_batch"] == BENT_FROM
    assert ceiling.where["max_batch_size"] == B_SIM
    capped = instruments.offline_ceiling(simulated_times, 8)     # a server capped at 8 runs no 16
    assert within_late(8 / capped.value, bent(8)) and capped.observed["best_batch"] == 8, capped.describe()
    gain = instruments.speedup(simulated_times, B_SIM)
    fixed, per_row = instruments.cost_line(simulated_times)
    assert gain.value == pytest.approx(ceiling.value * min(simulated_times.seconds(1), fixed.value + per_row.value))
    assert within(gain.value, TRUE_SPEEDUP, 0.20), gain.describe()
    assert "per-row" in gain.where["gain"]


def test_lone_call_and_the_speedup_over_the_measured_t1(simulated_times):
    """Batch 1 is off the simulated line (20 ms against F + c = 11.25 ms): t₁ is the line's,
    and the speedup over the measured t(1) exceeds the per-row speedup by t(1)/t₁."""
    lone = instruments.lone_call(simulated_times)
    assert lone.quantity == "t₁" and within_late(lone.value, F_S + C_S, 1.5 * LATE_S, 0.5 * LATE_S), lone.describe()
    over_t1 = instruments.speedup_over_t1(simulated_times, B_SIM)
    ceiling = instruments.offline_ceiling(simulated_times, B_SIM)
    assert over_t1.value == pytest.approx(ceiling.value * simulated_times.seconds(1))
    assert within(over_t1.value, TRUE_CEILING * T1_S, 0.10), over_t1.describe()
    per_row = instruments.speedup(simulated_times, B_SIM)
    assert over_t1.value == pytest.approx(per_row.value * simulated_times.seconds(1) / lone.value)
    assert over_t1.quantity != per_row.quantity and over_t1.where["gain"] != per_row.where["gain"]


def test_a_ceiling_over_sizes_that_skip_one_is_refused(simulated_times):
    skipped = instruments.CallTimes("skips 16", "wall", 1, (1, 2, 4, 8, 32),
                                    tuple(bent(b) for b in (1, 2, 4, 8, 32)), ())
    with pytest.raises(ValueError, match="16"):
        instruments.offline_ceiling(skipped, 32)


# -- the model alone: known CPU, then a known wait (CPU clock against wall clock) ------------------

BURN_F_S, BURN_C_S, WAIT_S = 0.003, 0.0005, 0.002


class BurnThenWait(torch.nn.Module):
    """A call burns ``F + c·b`` of its thread's CPU, then waits ``WAIT_S`` without any."""

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        spin(BURN_F_S + BURN_C_S * rows.shape[0])
        time.sleep(WAIT_S)
        return rows[:, :2]


def test_the_cpu_clock_counts_the_burn_and_not_the_wait():
    """The CPU clock's truth is the burn (10 % holds: the call's own overhead is ~0.1 ms of
    3.5 ms or more); the wall clock reads at least burn + wait on any machine, and more on a
    busy one, so it cannot stand in for the CPU clock."""
    model = BurnThenWait()
    on_cpu = instruments.time_calls(model, ROW, 8, clock="cpu", rounds=3, seconds_per_round=0.01, name="burn")
    on_wall = instruments.time_calls(model, ROW, 8, clock="wall", rounds=1, seconds_per_round=0.01, name="burn")
    for b in on_cpu.batch_sizes:
        burn = BURN_F_S + BURN_C_S * b
        assert within(on_cpu.seconds(b), burn, 0.10), (b, on_cpu.seconds(b), burn)
        assert on_wall.seconds(b) >= burn + 0.9 * WAIT_S, (b, on_wall.seconds(b))
    assert instruments.call_time(on_cpu, 8).where["clock"] == "cpu"
    assert instruments.call_time(on_wall, 8).where["clock"] == "wall"


def test_time_calls_runs_the_file_the_server_runs(tmp_path):
    module = torch.nn.Linear(FEATURES, 2).eval()
    folder = tmp_path / "linear"
    folder.mkdir()
    torch.jit.trace(module, torch.zeros(1, FEATURES)).save(str(folder / "model.pt"))
    times = instruments.time_calls(folder, ROW, 4, clock="cpu", rounds=1, seconds_per_round=0.001)
    assert times.model == "linear" and times.batch_sizes == (1, 2, 4)
    with pytest.raises(ValueError, match="clock"):
        instruments.time_calls(folder, ROW, 4, clock="monotonic")


# -- a text model's t(b, L): a stand-in whose call burns a known CPU time per padded token --------

#: The stand-in's truth: a call on a batch of ``rows`` rows of ``length`` tokens burns
#: TOKEN_F_S + TOKEN_C_S * rows * length of its thread's CPU, whatever its rows.
TOKEN_F_S, TOKEN_C_S = 0.0005, 2e-6
#: Two shapes of the same padded tokens (4 × 256 and 16 × 64), the rest all different.
TOKEN_SHAPES = ((1, 16), (4, 256), (16, 64), (16, 16), (16, 256))


def burn_per_padded_token(batch) -> None:
    rows, length = batch["input_ids"].shape
    spin(TOKEN_F_S + TOKEN_C_S * rows * length)


def calibrated(times: instruments.PaddedCallTimes) -> bool:
    """Every timed shape within 10 % of the stand-in's burn (the instrument's tolerance)."""
    return all(within(times.seconds(b, length), TOKEN_F_S + TOKEN_C_S * b * length, 0.10)
               for b, length in times.shapes)


def test_padded_call_times_recover_a_known_cost_per_padded_token():
    times = instruments.time_padded_calls(burn_per_padded_token, TOKEN_SHAPES, name="burn per token",
                                          clock="cpu", rounds=2, seconds_per_round=0.01)
    assert calibrated(times), list(zip(times.shapes, times.medians))
    record = instruments.padded_call_time(times, 16, 64)
    assert record.quantity == "t(b, L)" and record.where == {"clock": "cpu", "threads": 1, "rows": 16, "length": 64}
    assert record.observed["padded_tokens"] == 1024 and record.spread[0] <= record.value <= record.spread[1]
    with pytest.raises(ValueError, match="was not timed"):
        instruments.padded_call_time(times, 2, 64)


def test_an_instrument_that_ignores_the_length_fails_the_calibration(monkeypatch):
    """A broken instrument: its batches have the asked rows but always 16 tokens, so every
    length reads as 16. The same check fails it."""
    honest = instruments._padded_batch
    monkeypatch.setattr(instruments, "_padded_batch",
                        lambda rows, length, generator: honest(rows, 16, generator))
    times = instruments.time_padded_calls(burn_per_padded_token, TOKEN_SHAPES, name="burn per token",
                                          clock="cpu", rounds=1, seconds_per_round=0.005)
    assert not calibrated(times)


def test_a_simulated_token_device_charges_padded_tokens_on_the_wall_clock():
    from loadtests.texts import FlatThenLinear, SimulatedTokenDevice

    cost = FlatThenLinear(fixed_seconds=0.004, flat_tokens=1024, per_token_seconds=4e-6)
    device = SimulatedTokenDevice(cost, stream=f"calibration-{next(_streams)}")
    times = instruments.time_padded_calls(device, ((4, 64), (16, 64), (16, 256)), name="simulated",
                                          clock="wall", rounds=2, seconds_per_round=0.02)
    for b, length in times.shapes:
        assert within_late(times.seconds(b, length), cost(b * length)), (b, length, times.seconds(b, length))
    assert "simulated" in device.label and "not a real GPU" in device.label


# -- the queueing model against a simulated server with known service times -----------------------


def simulate_server(cost, t_http: float, max_batch_size: int, rate: float, *, requests: int,
                    max_queue_size: int = 64, seed: int = 0) -> dict[str, float]:
    """One core serving Poisson arrivals in greedy batches: a batch of ``b`` occupies it
    ``cost(b) + b·t_http``; a request arriving to a full queue is shed. Served rate, mean
    latency and mean batch of the served requests."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(requests):
        t += rng.expovariate(rate)
        arrivals.append(t)
    queue: collections.deque[float] = collections.deque()
    now, i, served, latency_sum, calls = 0.0, 0, 0, 0.0, 0
    while i < len(arrivals) or queue:
        if not queue:                       # the core idles until the next arrival
            now = max(now, arrivals[i])
        while i < len(arrivals) and arrivals[i] <= now:
            if len(queue) < max_queue_size:
                queue.append(arrivals[i])
            i += 1
        batch = [queue.popleft() for _ in range(min(max_batch_size, len(queue)))]
        now += cost(len(batch)) + len(batch) * t_http
        served, calls = served + len(batch), calls + 1
        latency_sum += sum(now - a for a in batch)
    return {"served_rps": served / now, "mean_s": latency_sum / served, "mean_batch": served / calls}


T_HTTP_S = 0.0015


@pytest.mark.parametrize("max_batch_size", [1, 16])
def test_queueing_capacity_matches_a_saturated_simulated_server(simulated_times, max_batch_size):
    cost = instruments.queueing_cost(simulated_times)
    predicted = queueing.predict(cost, T_HTTP_S, max_batch_size, rate=1000.0)
    truth = simulate_server(bent, T_HTTP_S, max_batch_size, rate=1000.0, requests=20000)
    assert predicted.saturated
    assert within(predicted.served, truth["served_rps"], 0.05), (predicted, truth)


def test_queueing_latency_with_batching_off_matches_m_d_1(simulated_times):
    cost = instruments.queueing_cost(simulated_times)
    rate = 0.5 / (T_HTTP_S + T1_S)
    predicted = queueing.predict(cost, T_HTTP_S, 1, rate=rate)
    truth = simulate_server(bent, T_HTTP_S, 1, rate=rate, requests=20000)
    assert within(predicted.mean_ms / 1e3, truth["mean_s"], 0.10), (predicted, truth)


# -- the server: a known added cost per request, known CPU per call, a simulated device ------------

B_SERVED = 8
PER_REQUEST_S = 0.002
SERVED_F_S, SERVED_C_S = 0.0008, 0.0001   # the burner: t(8) = 1.6 ms, 0.2 ms a row, near t_http
DEVICE_F_S, DEVICE_C_S = 0.020, 0.001


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """One server (core 0, one torch thread, greedy, MAX_BATCH_SIZE 8) with five models, each
    saturated by 16 closed-loop clients in 2 rounds of 1 s windows: the known-cost model with
    nothing to do at MAX_BATCH_SIZE 1 and 8 (``plain1``, ``plain8``), the same with 2 ms of CPU
    per request at 1 (``burdened1``), with a known CPU cost per call (``burner``), and a
    simulated device with t(b) = 20 ms + 1 ms·b (``device``)."""
    root = tmp_path_factory.mktemp("calibration")
    known_cost.write_model_folder(root / "plain1", fixed_seconds=0.0)
    known_cost.write_model_folder(root / "plain8", fixed_seconds=0.0)
    known_cost.write_model_folder(root / "burdened1", fixed_seconds=0.0, per_request_seconds=PER_REQUEST_S)
    for name in ("plain1", "burdened1"):
        (root / name / "mmserver.json").write_text(json.dumps({"max_batch_size": 1}))
    known_cost.write_model_folder(root / "burner", fixed_seconds=SERVED_F_S, per_row_seconds=SERVED_C_S)
    simulated_device.write_model_folder(root / "device", fixed_seconds=DEVICE_F_S, per_row_seconds=DEVICE_C_S,
                                        input_features=FEATURES, stream=f"calibration-{next(_streams)}")
    caps = {"plain1": 1, "burdened1": 1, "plain8": B_SERVED, "burner": B_SERVED, "device": B_SERVED}
    args = ["--model-root", str(root), "--no-access-log", "--log-level", "WARNING",
            "--max-batch-size", str(B_SERVED), "--max-wait-ms", "0", "--max-queue-size", "64"]
    for name in caps:
        args += ["--preload", f"{name}={root / name}"]
    body = json.dumps([[0.5] * FEATURES]).encode()
    with ServerProcess(args, env={"OMP_NUM_THREADS": "1"}, cpus="0", cwd=ROOT) as server:
        return instruments.saturate(server, caps, body, "application/json", connections=2 * B_SERVED,
                                    window_s=1.0, lead_s=0.3, warmup_s=0.5, rounds=2)


def test_t_http_recovers_a_known_added_cost_per_request(served):
    """Both at MAX_BATCH_SIZE 1, so the per-call work is the same: the difference of the two
    ``t_http`` is the 2 ms of CPU added per request, from 10 % under (each ``t_http`` carries
    about ±0.1 ms over two 1 s windows) to 35 % over: the spin holds the interpreter lock for
    2 ms at a time and the server's other threads wait and switch around it. On a 2-core machine
    15 runs gave +6 % to +26 % (most +12 % to +23 %), the same whether the spin asks the clock
    at every turn or every 200th, so the surplus is the server's, not the clock's."""
    plain, burdened = instruments.t_http(served["plain1"]), instruments.t_http(served["burdened1"])
    added = burdened.value - plain.value
    assert 0.90 * PER_REQUEST_S <= added <= 1.35 * PER_REQUEST_S, (plain.describe(), burdened.describe())
    assert plain.where["clock"] == instruments.SERVER_CPU_CLOCK
    assert plain.where["max_batch_size"] == 1 and plain.observed["mean_batch"] == 1.0


def test_t_http_is_per_cpu_second(served):
    """With a device that holds no CPU the server's core idles; its CPU per request is still a
    server path's (at most twice the no-op's at batch 1), not the 3.5 ms of wall clock per
    request the device sets."""
    device, plain = instruments.t_http(served["device"]), instruments.t_http(served["plain1"])
    assert device.value <= 2 * plain.value, (device.describe(), plain.describe())


def test_the_account_with_t_http_explains_a_known_cpu_cost(served):
    """The serial limit from the no-op's ``t_http`` (MAX_BATCH_SIZE 8) and the burner's t(8) on
    the CPU clock against what one core served of it. Tolerance 1 − 2·NOISE_BAND to
    1 + NOISE_BAND: the burner's spin holds the interpreter lock for 1.6 ms a call, so the
    server's loop waits for it and switches threads more than with the no-op; the account errs
    low by that. Without ``t_http`` the same account must fall outside it: the calibration tells
    the account from one that ignores HTTP. The burner's share of a row is kept near ``t_http``
    so that the two accounts stay apart on a fast machine too (with 0.5 ms a row, a machine whose
    ``t_http`` is small put the account without it at 0.76, inside the band)."""
    times = instruments.time_calls(KnownCost(SERVED_F_S, SERVED_C_S), ROW, B_SERVED, clock="cpu",
                                   rounds=2, seconds_per_round=0.01, name="burner")
    t_http = instruments.t_http(served["plain8"])
    limit = instruments.serial_limit(t_http, times, B_SERVED)
    true_limit = 1 / (t_http.value + (SERVED_F_S + SERVED_C_S * B_SERVED) / B_SERVED)
    assert within(limit.value, true_limit, 0.05), limit.describe()
    measured = instruments.served_per_cpu_second(served["burner"])
    account = instruments.efficiency(measured, limit)
    low, high = 1 - 2 * definitions.NOISE_BAND, 1 + definitions.NOISE_BAND
    assert low <= account.value <= high, (account.describe(), measured.describe(), t_http.describe())
    without_http = measured.value * times.seconds(B_SERVED) / B_SERVED
    assert not low <= without_http <= high, without_http
    with pytest.raises(ValueError, match="CPU clock"):
        instruments.serial_limit(t_http, dataclasses.replace(times, clock="wall"), B_SERVED)


def test_the_device_view_of_a_saturated_simulated_device(served):
    """Capacity, busy fraction and device time per request of a saturated simulated device,
    within 25 % of B/t(B), 1 and t(B)/B: the server times a call until its event loop has
    taken the answers, and on a busy machine the sleeping device wakes late (about +13 %
    measured). The core's share stays small: the device holds no CPU (by construction)."""
    run = served["device"]
    t_b = DEVICE_F_S + DEVICE_C_S * B_SERVED
    cap = instruments.capacity(run)
    assert within(cap.value, B_SERVED / t_b, 0.25), cap.describe()
    busy = instruments.busy_fraction(run)
    assert within(busy.value, 1.0, 0.15), busy.describe()
    per_request = instruments.device_time_per_request(run)
    assert within(per_request.value, t_b / B_SERVED, 0.25), per_request.describe()
    core = instruments.core_share(run)
    assert core.value < 0.5 * busy.value, core.describe()


# -- records combined without a server: what the server added, and a run that failed requests ------


def _capacity_record(rps: float, b: int, spread=None):
    return instruments.measurement("capacity", "m", rps, "requests/s", spread or (rps, rps), 3,
                                   {"max_batch_size": b, "clock": "wall"}, {"mean_batch": float(b)})


def _call_record(b: int, seconds: float, clock: str = "wall"):
    return instruments.measurement(f"t({b})", "m", seconds, "s", (seconds, seconds), 5, {"clock": clock})


def test_a_range_reads_in_its_high_ends_unit():
    record = instruments.measurement("queue wait", "m", 1.35e-3, "s", (22.8e-6, 3.84e-3), 20)
    assert "(0.02–3.84 ms over 20 repeats" in record.describe(), record.describe()


def test_both_ends_of_a_range_and_its_value_share_the_decimals_of_its_larger_end():
    """Notebooks printed "287–297.7 requests/s" and "0.0143–299 µs": each end at its own digits."""
    served = instruments.measurement("capacity", "m", 296, "requests/s", (287, 297.7), 3)
    assert served.shown() == "296.0 requests/s (287.0–297.7 requests/s over 3 repeats)"
    assert instruments.show_range(0.0143e-6, 299e-6, "s") == "0–299 µs"
    assert instruments.show_range(52.1e-3, 59e-3, "s") == "52.1–59.0 ms"
    assert instruments.show_range(1.2, 1800.5, "s") == "1–1800 s"      # whole numbers from 1000 on
    alike = instruments.measurement("p99", "m", 0.092, "s", (0.092, 0.092), 2)
    assert alike.shown() == "92.0 ms (92.0 ms in each of 2 repeats)"     # no range: its own digits
    lone = instruments.measurement("queue wait", "m", 1.0033, "s", (1.0033, 1.0033), 1)
    assert lone.shown() == "1.00 s"   # 02 printed "1 s" beside a verdict's 1.003 s: zeros are digits too


def test_single_readings_side_by_side_share_the_decimals_of_the_larger():
    """08 printed "6.71 ms against 21.2 ms": each reading at its own significant digits."""
    assert instruments.show_values([6.71e-3, 21.2e-3], "s") == ["6.7 ms", "21.2 ms"]
    assert instruments.show_values([0.768, 1.057], "s", 0.768) == ["768 ms", "1057 ms"]
    assert instruments.show_values([287.04, 297.7], "requests/s") == ["287.0 requests/s", "297.7 requests/s"]


def test_a_range_across_zero_reads_from_minus_to_in_one_unit():
    """01 printed "(from −1.34 ms to 569 µs ..." and, before that, "(-0.30 to 1.23 ms ..."."""
    added = instruments.measurement("server added", "m", -0.47e-3, "s", (-1.34e-3, 0.569e-3), 3)
    assert added.describe().startswith("server added of m: −0.47 ms (from −1.34 ms to 0.57 ms over 3 repeats")
    assert instruments.show_range(-0.04, 0.44, "share") == "from −4% to 44%"
    assert instruments.signed("-0.75") == "−0.75" and instruments.signed("+0.75") == "+0.75"


def test_a_value_is_written_in_its_ranges_unit():
    """02 printed "401 ms (0.301–1.31 s over ...)": the value and its range in two units."""
    latency = instruments.measurement("latency", "m", 0.401, "s", (0.301, 1.31), 9)
    assert latency.shown() == "0.40 s (0.30–1.31 s over 9 repeats)"
    assert latency.describe().startswith("latency of m: 0.40 s (0.30–1.31 s over 9 repeats")
    alone = instruments.measurement("latency", "m", 0.401, "s", (0.401, 0.401), 1)
    assert alone.shown() == "401 ms"


def test_a_range_whose_ends_print_the_same_is_one_value():
    """08 printed "fixed share ...: 98% (98–98% over 3 repeats ...)"."""
    share = instruments.measurement("fixed share", "m", 0.981, "share", (0.978, 0.983), 3)
    assert "98% (98% in each of 3 repeats" in share.describe(), share.describe()
    apart = instruments.measurement("fixed share", "m", 0.981, "share", (0.97, 0.983), 3)
    assert "(97–98% over 3 repeats" in apart.describe(), apart.describe()


def test_server_added_is_a_request_beyond_the_models_share():
    added = instruments.server_added(_capacity_record(320.0, 16, (300.0, 330.0)), _call_record(16, 0.040))
    assert added.value == pytest.approx(1 / 320 - 0.040 / 16) and added.model == "m"
    assert added.spread == pytest.approx((1 / 330 - 0.0025, 1 / 300 - 0.0025))
    assert added.where["max_batch_size"] == 16
    assert added.counted().endswith(f"repeats × {_call_record(16, 0.040).repeats} timing passes")   # not one count for both
    with pytest.raises(ValueError, match=r"t\(16\)"):      # the call at another size than the capacity's
        instruments.server_added(_capacity_record(320.0, 16), _call_record(1, 0.015))
    with pytest.raises(ValueError, match="wall clock"):
        instruments.server_added(_capacity_record(320.0, 16), _call_record(16, 0.040, clock="cpu"))


def test_a_run_that_failed_requests_measures_no_capacity():
    full = instruments.Window(answered=800, shed=0, other=0, server_cpu_s=1.9, window_s=2.0, rows=800,
                              calls=50, model_call_s=1.8)
    run = instruments.ServerRun("m", 16, 32, 100, (full, full))
    assert instruments.capacity(run).value == pytest.approx(400.0)
    failed = instruments.ServerRun("m", 16, 32, 100, (full, dataclasses.replace(full, other=3)))
    with pytest.raises(ValueError, match="neither 200 nor 503"):
        instruments.capacity(failed)

# -- a batching runner alone, driven by scripted clients -------------------------------------------

#: The known runner: a request waits KNOWN_WAIT_S, then runs alone in a call of KNOWN_CALL_S;
#: clients in KNOWN_REFUSED are refused at once; client KNOWN_WRONG gets another client's row.
KNOWN_WAIT_S, KNOWN_CALL_S = 0.12, 0.06
KNOWN_REFUSED, KNOWN_WRONG = (3,), 4
KNOWN_SCRIPT = [(0, 0.0), (1, 0.02), (2, 0.30), (3, 0.31), (4, 0.40)]


class Refused(Exception):
    handling_code = 503


def known_runner(calls: list):
    """A runner whose every timing is chosen: each request alone, after a known wait."""
    async def submit(client: int):
        if client in KNOWN_REFUSED:
            raise Refused()
        await asyncio.sleep(KNOWN_WAIT_S)
        started = time.monotonic()
        await asyncio.sleep(KNOWN_CALL_S)
        calls.append((started, time.monotonic(), [client]))
        return client + 1 if client == KNOWN_WRONG else client
    return submit


def run_known_script():
    calls: list = []
    return asyncio.run(instruments.scripted_clients(
        known_runner(calls), KNOWN_SCRIPT, lambda client: client, lambda client, out: out == client,
        calls, refusal=Refused, runner="known", settings={"max_wait": KNOWN_WAIT_S}))


def test_scripted_clients_recover_a_runner_of_known_timing():
    """Queue wait, latency and time to refuse within SCHEDULING_SLACK_S of the known runner's;
    the grouping, the batch sizes and the own rows exactly. A reader that times the wrong
    interval (arrival to answer for the queue wait) fails here."""
    timeline = run_known_script()
    slack = definitions.SCHEDULING_SLACK_S
    for client in (0, 1, 2, 4):
        wait = instruments.queue_wait(timeline, client)
        assert KNOWN_WAIT_S - 0.005 <= wait.value < KNOWN_WAIT_S + slack, wait.describe()
        assert wait.where["client"] == client and wait.where["max_wait"] == KNOWN_WAIT_S
    took = instruments.latency(timeline)
    assert KNOWN_WAIT_S + KNOWN_CALL_S - 0.005 <= took.spread[0] <= took.spread[1] < KNOWN_WAIT_S + KNOWN_CALL_S + slack
    refusal = instruments.refusal_time(timeline)
    assert refusal.value < slack and refusal.observed["refused"] == KNOWN_REFUSED, refusal.describe()
    assert refusal.observed["while_busy"] is False   # client 3 arrived while no call ran
    batches = instruments.batch_sizes(timeline)
    assert batches.value == 1.0 and batches.observed["grouping"] == ((0,), (1,), (2,), (4,))
    rows = instruments.own_rows(timeline)
    assert rows.value == 3 / 4 and rows.repeats == 4
    # a spread over one run's clients or calls says so: they are not repeats of the run
    assert "4 answered clients" in took.describe() and "repeats" not in took.describe()
    assert "in each of 4 calls" in batches.describe(), batches.describe()
    assert "(one client; " in instruments.queue_wait(timeline, 0).describe()
    assert instruments.Measurement.from_json(took.as_json()) == took
    with pytest.raises(ValueError, match="not answered"):
        instruments.queue_wait(timeline, 3)


def test_a_refusal_while_a_call_runs_is_seen_as_such():
    timeline = run_known_script()
    calls = timeline.calls + ((0.30, 0.35, ()),)    # a call that covers client 3's arrival
    busy = dataclasses.replace(timeline, calls=calls)
    assert instruments.refusal_time(busy).observed["while_busy"] is True


def test_timer_delay_recovers_the_armed_delay_and_sees_a_cancelled_timer():
    """A timer armed 50 ms ahead sets its event within TIMER_TOLERANCE_S before and
    SCHEDULING_SLACK_S after; a cancelled one never (an instrument that forgot to cancel, or
    that timed the arming instead of the event, fails here)."""
    delay = asyncio.run(instruments.timer_delay(0.05, repeats=3))
    low, high = delay.spread
    assert 0.05 - definitions.TIMER_TOLERANCE_S <= low <= high < 0.05 + definitions.SCHEDULING_SLACK_S, delay.describe()
    assert delay.repeats == 3 and delay.observed["cancelled_fired"] is False


class KnownCallModel:
    """Sleeps KNOWN_F_S + KNOWN_C_S per row and returns its input. It also clocks its own
    calls (``spent_s``): a loaded machine wakes a sleeper late, by a millisecond or more, and
    the device's truth is the time it really spent, never less than the time asked for."""

    def __init__(self):
        self.spent_s = 0.0

    def __call__(self, batch):
        begin = time.perf_counter()
        time.sleep(KNOWN_F_S + KNOWN_C_S * batch.shape[0])
        self.spent_s += time.perf_counter() - begin
        return batch


KNOWN_F_S, KNOWN_C_S = 0.004, 0.001


def test_open_loop_recovers_a_model_of_known_cost_far_below_its_capacity():
    """At 20 requests/s a greedy runner of a 5 ms model runs each request alone: one row per
    call, and per request the device time the model itself clocked (at least 5 ms), within the
    noise band; a timer runner with a MAX_WAIT far longer than the gaps gathers more per call
    and spends less per request. A reader that divided by calls instead of answers, or timed
    the wall clock, fails here."""
    from mmserver.batching import BatchSettings, ModelRunner

    models = {p: KnownCallModel() for p in ("greedy", "timer")}

    def runner(policy):
        return ModelRunner(models[policy], BatchSettings(max_batch_size=8, max_wait=0.2, max_queue_size=1000,
                                                         policy=policy), device="cpu", name=policy)

    runs = asyncio.run(instruments.open_loop({p: runner(p) for p in models}, 20.0, 40,
                                             torch.zeros(1, 4), seed=0, settings={"max_batch_size": 8}))
    greedy = instruments.open_loop_device_time(runs["greedy"])
    assert runs["greedy"].answered == 40 and greedy.observed["mean_batch"] == 1.0
    truth_s = models["greedy"].spent_s / 40
    assert truth_s >= KNOWN_F_S + KNOWN_C_S
    assert definitions.agree(greedy.value, truth_s), (greedy.describe(), truth_s)
    timer = instruments.open_loop_device_time(runs["timer"])
    assert timer.observed["mean_batch"] > 1.5 and timer.value < greedy.value / 1.5, timer.describe()
    p50 = instruments.open_loop_latency(runs["greedy"], 50)
    assert KNOWN_F_S + KNOWN_C_S <= p50.value < KNOWN_F_S + KNOWN_C_S + definitions.SCHEDULING_SLACK_S
    assert greedy.where["policy"] == "greedy" and greedy.where["offered_rps"] == 20.0


def test_backlog_growth_is_flat_below_capacity_and_grows_as_predicted_above_it():
    """Far below capacity the last quarter of the arrivals waits no longer than the first; at
    twice the capacity of a greedy runner of batch 1 (a known 5 ms call: 200 requests/s) the
    backlog grows by 0.75 T (λ/μ − 1) between the quarters' middles. A reader that kept the
    latencies in the order they were answered, or read a p99, fails here."""
    from mmserver.batching import BatchSettings, ModelRunner

    def runner():
        return ModelRunner(KnownCallModel(), BatchSettings(max_batch_size=1, max_wait=0.0, max_queue_size=10_000,
                                                           policy="greedy"), device="cpu", name="greedy")

    call_s = KNOWN_F_S + KNOWN_C_S
    calm = asyncio.run(instruments.open_loop({"greedy": runner()}, 20.0, 40, torch.zeros(1, 4), seed=1))["greedy"]
    assert abs(instruments.backlog_growth(calm).value) < call_s / 4 + definitions.SCHEDULING_SLACK_S / 5
    rate = 2 / call_s                                     # twice what one call after another serves
    over = asyncio.run(instruments.open_loop({"greedy": runner()}, rate, 400, torch.zeros(1, 4), seed=2))["greedy"]
    arrivals_s = 400 / over.offered_rps
    served_rps = over.answered / over.window_s            # the runner's own rate, the model's sleeps included
    predicted = 0.75 * arrivals_s * (over.offered_rps / served_rps - 1)
    growth = instruments.backlog_growth(over)
    assert 0.75 * predicted <= growth.value <= 1.25 * predicted, (growth.describe(), predicted)
    assert growth.unit == "s" and growth.where["offered_rps"] == rate


# -- bursts far below capacity: a simulated device of known t(b) --------------------------------

BURST_F_S, BURST_C_S, BURST = 0.020, 0.001, 6


@pytest.fixture(scope="module")
def burst_runs(tmp_path_factory):
    """One server (core 0, greedy, MAX_BATCH_SIZE 8, max_wait 0) with a simulated device of
    t(b) = 20 ms + 1 ms·b, sent lone requests and bursts of 6, 6 of each, taking turns."""
    root = tmp_path_factory.mktemp("bursts")
    simulated_device.write_model_folder(root / "device", fixed_seconds=BURST_F_S, per_row_seconds=BURST_C_S,
                                        input_features=FEATURES, stream=f"calibration-{next(_streams)}")
    args = ["--model-root", str(root), "--no-access-log", "--log-level", "WARNING", "--policy", "greedy",
            "--max-batch-size", str(B_SERVED), "--max-wait-ms", "0", "--preload", f"device={root / 'device'}"]
    body = json.dumps([[0.5] * FEATURES]).encode()
    with ServerProcess(args, env={"OMP_NUM_THREADS": "1"}, cpus="0", cwd=ROOT) as server:
        runs = {size: instruments.bursts({size: (server, "device", body)}, "application/json", burst_size=size,
                                         bursts=6, pause_s=0.05, warmup=1)[size] for size in (1, BURST)}
    return runs


def test_a_lone_request_to_a_known_device(burst_runs):
    """A burst of one: one call of t(1) per request, so the device time per request is t(1)
    (as a sleeping device reads, ``within_late``), the mean batch exactly 1, the queue wait
    under a quarter of the call, and every answer from t(1) to 10 % + 5 ms over it."""
    lone = burst_runs[1]
    call = BURST_F_S + BURST_C_S
    assert instruments.mean_batch(lone).value == 1.0
    assert within_late(instruments.device_time_per_request(lone).value, call)
    assert instruments.queue_wait(lone).value < call / 4, instruments.queue_wait(lone).describe()
    for which in instruments.ANSWERS:
        answer = instruments.answer_latency(lone, which)
        assert call <= answer.value <= call * 1.10 + 0.005, answer.describe()
    assert instruments.answer_latency(lone, "first").where["max_wait_ms"] == 0


def test_a_burst_behind_a_call_of_a_known_device(burst_runs):
    """Bursts of 6 at max_wait 0: the device time per request is the known t(b) summed over the
    calls the server counted, over the answers; batches between 1 and the burst; the queue wait
    at least a quarter of one call (most of the burst waits for the first call) and less than
    the burst's last answer; first ≤ median ≤ last, and the last at least two calls."""
    run = burst_runs[BURST]
    truth = (BURST_F_S * run.total("calls") + BURST_C_S * run.total("rows")) / run.total("answered")
    assert within_late(instruments.device_time_per_request(run).value, truth)
    assert 1.0 < instruments.mean_batch(run).value <= BURST
    first, median, last = (instruments.answer_latency(run, w).value for w in ("first", "median", "last"))
    assert first <= median <= last
    assert last >= 2 * BURST_F_S, last
    queued = instruments.queue_wait(run).value
    assert (BURST_F_S + BURST_C_S) / 4 <= queued < last, (queued, last)


# -- a load driven from elsewhere: overload past the queue of a simulated device -----------------

QUEUE_OVER = 16


@pytest.fixture(scope="module")
def overloaded(tmp_path_factory):
    """A simulated device with t(b) = 20 ms + 1 ms·b at MAX_BATCH_SIZE 8 behind a queue of 16,
    driven by 48 closed-loop clients (more than the queue and a batch hold, so it sheds), read
    by :func:`instruments.observe`; then, the load stopped, one probe client alone."""
    root = tmp_path_factory.mktemp("overload")
    simulated_device.write_model_folder(root / "device", fixed_seconds=DEVICE_F_S, per_row_seconds=DEVICE_C_S,
                                        input_features=FEATURES, stream=f"calibration-{next(_streams)}")
    args = ["--model-root", str(root), "--no-access-log", "--log-level", "WARNING",
            "--max-batch-size", str(B_SERVED), "--max-wait-ms", "0", "--max-queue-size", str(QUEUE_OVER),
            "--preload", f"device={root / 'device'}"]
    body = json.dumps([[0.5] * FEATURES]).encode()
    headers = {"Content-Type": "application/json"}
    with ServerProcess(args, env={"OMP_NUM_THREADS": "1"}, cpus="0", cwd=ROOT) as server:
        with instruments._Load(server.url, "/models/device/invoke", body, "application/json", 3 * QUEUE_OVER):
            time.sleep(1.0)
            run = instruments.observe(server, "device", 1.5, max_batch_size=B_SERVED,
                                      connections=3 * QUEUE_OVER, body_bytes=len(body), driver="calibration")
        time.sleep(0.5)
        stop = threading.Event()
        timer = threading.Timer(1.5, stop.set)
        timer.start()
        samples = instruments.probe(server.url, "/models/device/invoke", body, headers, stop, clients=1)
    return run, samples


def test_drain_rate_and_batch_time_of_an_overloaded_simulated_device(overloaded):
    """Shedding past a full queue, the device still runs full batches back to back: the drain
    rate is B/t(B) and a call t(B), within 25 % (as ``capacity``); the record says who drove
    the load and what was shed alongside. ``capacity`` refuses the same run."""
    run, _ = overloaded
    t_b = DEVICE_F_S + DEVICE_C_S * B_SERVED
    assert run.total("shed") > 0
    drain = instruments.drain_rate(run)
    assert within(drain.value, B_SERVED / t_b, 0.25), drain.describe()
    assert drain.where["driver"] == "calibration" and drain.observed["shed_rps"] > 0
    call = instruments.batch_time(run)
    assert within(call.value, t_b, 0.25), call.describe()
    with pytest.raises(ValueError, match="shed"):
        instruments.capacity(run)


def test_accepted_latency_of_a_lone_probe_is_t1(overloaded):
    """One probe client on an idle server: each request is a batch of one, so its median is
    t(1) = 21 ms plus the server's and a fresh connection's few milliseconds (3 % under to
    10 % + 6 ms over)."""
    _, samples = overloaded
    wait = instruments.accepted_latency(samples, "device", clients=1)
    t1 = DEVICE_F_S + DEVICE_C_S
    assert within_late(wait.value, t1, late_s=0.006), wait.describe()
    assert wait.observed["shed"] == 0 and wait.observed["failed"] == 0


# -- a server of several processes: every process's CPU counted, each on its own ------------------


WORKERS_PER_REQUEST_S = 0.010


@pytest.fixture(scope="module")
def served_by_workers(tmp_path_factory):
    """``--http-workers 2`` over one engine, the known-cost model with nothing to do and with
    10 ms of CPU added per request (both at MAX_BATCH_SIZE 1), saturated by 16 closed-loop
    clients in 3 rounds of 1 s windows (3 s per model, so a disturbed moment weighs less),
    the CPU of every process of the server counted."""
    from loadtests.device_lesson import engine_and_workers
    from mmserver.harness.testing import wait_for_http_workers
    from mmserver.http.app import WORKER_HEADER

    root = tmp_path_factory.mktemp("workers")
    known_cost.write_model_folder(root / "plain1", fixed_seconds=0.0)
    known_cost.write_model_folder(root / "burdened1", fixed_seconds=0.0, per_request_seconds=WORKERS_PER_REQUEST_S)
    args = ["--model-root", str(root), "--no-access-log", "--log-level", "WARNING", "--http-workers", "2",
            "--max-batch-size", "1", "--max-wait-ms", "0", "--max-queue-size", "64"]
    for name in ("plain1", "burdened1"):
        args += ["--preload", f"{name}={root / name}"]
    body = json.dumps([[0.5] * FEATURES]).encode()
    with ServerProcess(args, env={"OMP_NUM_THREADS": "1"}, cwd=ROOT) as server:
        wait_for_http_workers(server.url, 2, WORKER_HEADER)
        processes = engine_and_workers(server, "plain1")
        runs = instruments.saturate(server, {"plain1": 1, "burdened1": 1}, body, "application/json",
                                    connections=16, window_s=1.0, lead_s=0.3, warmup_s=0.5, rounds=3,
                                    processes=processes)
    return runs, processes


def test_t_http_counts_every_process_of_http_workers(served_by_workers):
    """The 10 ms of CPU added per request is recovered from all the server's processes together,
    from 10 % under to 25 % over; each process's part is kept and the parts sum to the whole; the
    engine's part alone is less than the whole. Counting one process alone loses what the
    others spent. The surplus is the server's own: the spin runs in the engine's codec threads
    and holds the interpreter lock, so its loop thread waits and switches around it, and the
    workers, answered more slowly, amortise less per message. With 2 ms added it was +13 % to
    +47 % over ten runs on a 2-core machine (about 0.3 ms plus 8 % of the spin), too wide to
    tell a lost process from noise; with 10 ms, +7 % to +13 % over nine."""
    runs, processes = served_by_workers
    assert "engine" in processes and len(processes) >= 3      # the engine, the parent and two workers
    plain, burdened = instruments.t_http(runs["plain1"]), instruments.t_http(runs["burdened1"])
    added = burdened.value - plain.value
    assert 0.90 * WORKERS_PER_REQUEST_S <= added <= 1.25 * WORKERS_PER_REQUEST_S, (plain.describe(),
                                                                                 burdened.describe())
    assert plain.where["processes"] == len(processes) and plain.where["cpu_of"] == "all"
    for run in runs.values():
        for window in run.windows:
            assert {label for label, _ in window.cpu_by_process} == set(processes)
            assert sum(cpu for _, cpu in window.cpu_by_process) == pytest.approx(window.server_cpu_s, rel=1e-9)
    engine = instruments.t_http(runs["plain1"], "engine")
    assert 0 < engine.value < plain.value and engine.where["cpu_of"] == "engine"


def test_served_is_the_capacity_of_a_saturated_device(served):
    """Requests per wall-clock second of the windows: on a saturated simulated device, whose
    batches fill, the same number as :func:`instruments.capacity`."""
    run = served["device"]
    assert instruments.served(run).value == pytest.approx(instruments.capacity(run).value)
    assert instruments.served(run).where["clock"] == "wall"


def _sweep_row(**more):
    row = {"policy": "timer", "max_batch_size": 32, "max_wait_ms": 124.0, "effective_max_wait_ms": 124.0,
           "offered_rps": 36.0, "failures": 0, "shed_503": 0, "requests": 208, "model": "sim",
           "mean_batch_size": 6.21, "mean_queue_wait_ms": 79.6, "p50_ms": 120.0, "p99_ms": 180.0,
           "device_seconds_per_request": 0.00557, "device_busy_fraction": 0.21, "achieved_rps": 35.2,
           "batches": 34}
    return {**row, **more}


def test_sweep_point_reads_each_column_in_its_unit():
    records = instruments.sweep_point(_sweep_row())
    assert records["p50"].value == pytest.approx(0.120) and records["p50"].unit == "s"
    assert records["queue wait"].value == pytest.approx(0.0796)
    assert records["device time per request"].value == pytest.approx(0.00557)
    assert records["busy fraction"].value == pytest.approx(0.21) and records["mean batch"].value == 6.21
    assert records["throughput"].value == pytest.approx(35.2) and records["throughput"].unit == "requests/s"
    assert records["p50"].where == {"policy": "timer", "max_wait_ms": 124.0, "max_batch_size": 32,
                                    "offered_rps": 36.0, "clock": "wall"}
    assert records["p50"].observed["served_rps"] == pytest.approx(0.21 / 0.00557, abs=0.1)
    assert records["mean batch"].observed["batches"] == 34   # what the window's mean batch rests on
    assert "served share" not in records   # the row holds no count of what reached the server
    shed = instruments.sweep_point(_sweep_row(achieved_rps=30.0, sent_rps=40.0, shed_503=40))
    assert shed["served share"].value == pytest.approx(0.75) and shed["served share"].unit == "share"
    assert shed["served share"].where == shed["p99"].where
    with pytest.raises(ValueError, match="between 0 and sent"):   # more answered than reached it
        instruments.sweep_point(_sweep_row(achieved_rps=41.0, sent_rps=40.0))
    shared = _sweep_row()
    del shared["device_seconds_per_request"], shared["device_busy_fraction"], shared["effective_max_wait_ms"]
    assert "busy fraction" not in instruments.sweep_point(shared)
    with pytest.raises(ValueError, match="failed"):
        instruments.sweep_point(_sweep_row(failures=3))


def test_over_repeats_takes_the_median_and_refuses_another_point():
    records = [instruments.sweep_point(_sweep_row(p50_ms=v))["p50"] for v in (120.0, 150.0, 130.0)]
    combined = instruments.over_repeats(records)
    assert combined.value == pytest.approx(0.130) and combined.spread == pytest.approx((0.120, 0.150))
    assert combined.repeats == 3
    with pytest.raises(ValueError, match="not a repeat"):
        instruments.over_repeats(records + [instruments.sweep_point(_sweep_row(offered_rps=271.0))["p50"]])


def test_real_gpu_reads_the_accelerators_file_and_names_a_flat_cost_line(tmp_path):
    """A real GPU's small batches can cost the same whatever their rows (the H200 in results/cuda):
    the cell must say so rather than fail on a line that does not rise."""
    from loadtests.device_lesson import real_gpu

    assert real_gpu(8, tmp_path).startswith("No real GPU was measured")
    (tmp_path / "results" / "cuda").mkdir(parents=True)
    rising = {1: 1.0, 2: 1.2, 4: 1.4, 8: 1.8}
    flat = {1: 3.4, 2: 3.8, 4: 3.7, 8: 3.6}
    rows = ["model,device,device_name,batch_size,compute_ms,torch_version"] + [
        f"{name},cuda,NVIDIA H200,{b},{ms},2.11.0+cu130" for name, times in (("rising", rising), ("flat", flat))
        for b, ms in times.items()]
    (tmp_path / "results" / "cuda" / "inprocess.csv").write_text("\n".join(rows) + "\n")
    lines = real_gpu(8, tmp_path).splitlines()
    assert lines[0] == ("real GPU, NVIDIA H200 (results/cuda/inprocess.csv, measured elsewhere with torch "
                        "2.11.0+cu130), flat: fixed share 100% (the cost line "
                        "through t(2) 3.80 ms, t(4) 3.70 ms, t(8) 3.60 ms does not rise: a call there "
                        "is all fixed cost), speedup at 8 7.56×")
    assert lines[1] == ("real GPU, NVIDIA H200 (results/cuda/inprocess.csv, measured elsewhere with torch "
                        "2.11.0+cu130), rising: fixed share 91%, "
                        "speedup at 8 4.44×")
    assert len(lines) == 2
    (tmp_path / "results" / "cuda" / "efficiency.txt").write_text(
        "$ python bench/accelerator_efficiency.py --model flat --seconds 10 (16 CPUs)\n"
        "flat on cuda (NVIDIA H200); load: aiohttp closed loop, 64 connections, 10 s\n"
        "mmserver:     586.3 requests/s, mean batch 17.1 rows\n"
        "raw model:   7200.2 rows/s at batch 17.1 (t_raw = 2.38 ms per batch)\nefficiency=0.081\n")
    assert real_gpu(8, tmp_path).splitlines()[2] == (
        "through one mmserver process (results/cuda/efficiency.txt), flat: 586 requests/s at a mean "
        "batch of 17.1 rows, 0.08 of the raw model's rate at that batch")


def test_out_of_order_names_a_larger_batch_timed_faster():
    """01's run timed resnet18's t(4) at 56.12 ms and t(8) at 54.29 ms (passes 31-68 ms at 4):
    a disturbed median, which bent the line through 2, 4 and 8 (F above t(1))."""
    disturbed = instruments.CallTimes("resnet18", "wall", 1, (1, 2, 4, 8, 16),
                                      (0.0126, 0.02347, 0.05612, 0.05429, 0.08287), ((0.0126,) * 5,))
    assert instruments.out_of_order(disturbed) == [(4, 8)]
    steady = instruments.CallTimes("resnet18", "wall", 1, (1, 2, 4, 8, 16),
                                   (0.0126, 0.02347, 0.0312, 0.0542, 0.08287), ((0.0126,) * 5,))
    assert instruments.out_of_order(steady) == []


def test_call_times_and_the_line_keep_each_pass_so_a_verdict_can_pair_them():
    """``verdicts.on_the_line`` divides each pass's t(1) by that pass's F + c: the records must
    keep the passes in one order, each pass's own value (not the medians')."""
    rounds = ((0.020, 0.024, 0.038, 0.066), (0.022, 0.020, 0.032, 0.056))
    times = instruments.CallTimes("m", "cpu", 1, (1, 2, 4, 8), (0.021, 0.022, 0.035, 0.061), rounds)
    t1 = instruments.call_time(times, 1)
    fixed, per_row = instruments.cost_line(times)
    assert t1.samples == (0.020, 0.022)
    lines = [definitions.fit_cost_line((1, 2, 4, 8), r) for r in rounds]
    assert fixed.samples == pytest.approx([f for f, _ in lines])
    assert per_row.samples == pytest.approx([c for _, c in lines])
    assert fixed.samples[0] != pytest.approx(fixed.samples[1])   # the passes' own lines differ
