"""Notebook 07's sweep reader: each point merges its repeats through the instruments (median,
lowest, highest), counts what every repeat shed, and is set beside the queueing model with the
t_http measured at its own MAX_BATCH_SIZE."""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT

if str(ROOT) not in sys.path:  # loadtests/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

from loadtests import queueing, setting_sweep  # noqa: E402


def row(policy: str, b: int, wait_ms: float, load: float, p99_ms: float, served: float, shed: int = 0,
        repeat: int = 0, sent: float | None = None) -> dict:
    return {"policy": policy, "max_batch_size": b, "max_wait_ms": wait_ms, "effective_max_wait_ms": wait_ms,
            "offered_rps": load, "repeat": repeat, "failures": 0, "shed_503": shed, "requests": 500,
            "model": "resnet18", "mean_batch_size": 2.0, "mean_queue_wait_ms": 5.0, "p50_ms": p99_ms / 3,
            "p99_ms": p99_ms, "achieved_rps": served, "device_seconds_per_request": 0.004,
            "device_busy_fraction": 0.5, "sent_rps": served if sent is None else sent}


def test_a_point_is_its_repeats_merged_and_its_shed_summed():
    rows = [row("timer", 16, 50, 140, 90, 139, shed=0, repeat=0), row("timer", 16, 50, 140, 110, 138, shed=3, repeat=1),
            row("greedy", 16, 0, 140, 40, 140)]
    points = {p["p99"].where["policy"]: p for p in setting_sweep.points(rows)}
    timer = points["timer"]
    assert timer["p99"].value == pytest.approx(0.100) and timer["p99"].spread == pytest.approx((0.090, 0.110))
    assert timer["throughput"].value == pytest.approx(138.5) and timer["p99"].repeats == 2
    assert timer["shed"] == 3 and points["greedy"]["shed"] == 0
    assert timer["sent"] == pytest.approx(138.5)


def test_the_table_shows_what_locust_sent_beside_the_offered_load(capsys):
    """07's run: greedy 1 at 84 requests/s offered served 55 and shed 6 over two repeats: its 84
    users each waited about a second on an answer, so locust sent far less than it offered, and
    the table did not say so."""
    cost = queueing.BatchCost(a=0.006, c=0.0016, t1=0.012)
    rows = [row("greedy", 1, 0, 84, 1200, 55, shed=3, sent=56.0, repeat=r) for r in (0, 1)]
    setting_sweep.print_points(setting_sweep.points(rows), cost, {1: 200e-6})
    header, units, line = capsys.readouterr().out.splitlines()[1:4]
    assert header.split()[1:4] == ["offered", "sent", "served"] and units.split()[:3] == ["req/s"] * 3
    assert line.split()[2:5] == ["84", "56", "55"]


def test_the_model_takes_the_t_http_of_the_points_own_size():
    cost = queueing.BatchCost(a=0.006, c=0.0016, t1=0.012)
    t_http = {16: 100e-6, 1: 200e-6}
    off, on = (setting_sweep.points([row("greedy", b, 0, 40, 50, 40)])[0] for b in (1, 16))
    assert setting_sweep.predicted(off, cost, t_http) == queueing.predict(cost, 200e-6, 1, 40)
    assert setting_sweep.predicted(on, cost, t_http) == queueing.predict(cost, 100e-6, 16, 40)
    four = setting_sweep.points([row("greedy", 4, 0, 40, 50, 40)])[0]
    assert setting_sweep.predicted(four, cost, t_http) == queueing.predict(cost, 100e-6, 4, 40)


def test_model_errors_leave_out_points_past_capacity_or_that_shed():
    cost = queueing.BatchCost(a=0.006, c=0.0016, t1=0.012)
    t_http = {16: 100e-6, 1: 200e-6}
    rows = [row("greedy", 1, 0, 40, 50, 40), row("greedy", 1, 0, 400, 900, 80, shed=900),
            row("greedy", 16, 0, 100, 60, 100, shed=2)]
    errors = setting_sweep.model_errors(setting_sweep.points(rows), cost, t_http)
    expected = 50 / queueing.predict(cost, 200e-6, 1, 40).p99_ms
    assert errors == {"greedy 1": [pytest.approx(expected)]}


def test_a_point_the_model_put_below_capacity_that_shed_is_a_miss():
    """07's committed run: greedy 16 at 410 requests/s, predicted p99 67 ms and no shedding,
    shed 387; its ratio had been left out of the model's error without a word."""
    cost = queueing.BatchCost(a=0.006, c=0.0016, t1=0.012)
    t_http = {16: 100e-6, 1: 200e-6}
    rows = [row("greedy", 16, 0, 100, 60, 100, shed=2), row("greedy", 16, 0, 40, 50, 40),
            row("greedy", 1, 0, 400, 900, 80, shed=900)]   # past capacity by the model: not a miss
    (miss,) = setting_sweep.model_misses(setting_sweep.points(rows), cost, t_http)
    assert (miss["p99"].where["offered_rps"], miss["shed"]) == (100, 2)


def test_a_ratio_is_within_the_band_or_on_one_side():
    """07's run: a ratio of 0.87 read as pessimistic at two decimals but lay within the band."""
    assert setting_sweep.side(0.87) == "within"      # 1 / 0.87 = 1.149, inside the 15% band
    assert setting_sweep.side(0.86) == "pessimistic"
    assert setting_sweep.side(1.15) == "within"
    assert setting_sweep.side(1.16) == "optimistic"


def test_a_ratio_whose_repeats_reach_the_band_is_unsettled():
    """07's run judged each point by its median: several optimistic or pessimistic points had
    repeats on both sides of the model's p99."""
    assert setting_sweep.side(1.6, (0.9, 2.3)) == "unsettled"     # repeats on both sides of 1
    assert setting_sweep.side(1.3, (1.1, 1.5)) == "unsettled"     # the lowest repeat within the band
    assert setting_sweep.side(1.6, (1.3, 1.9)) == "optimistic"    # every repeat above the band
    assert setting_sweep.side(0.6, (0.5, 0.7)) == "pessimistic"
    assert setting_sweep.side(1.05, (0.5, 2.0)) == "within"       # the median decides first


def test_model_sides_judge_each_point_with_its_repeats():
    cost = queueing.BatchCost(a=0.006, c=0.0016, t1=0.012)
    t_http = {16: 100e-6, 1: 200e-6}
    predicted_ms = queueing.predict(cost, 200e-6, 1, 40).p99_ms
    apart = [row("greedy", 1, 0, 40, 2.0 * predicted_ms, 40, repeat=r) for r in (0, 1)]
    both = [row("greedy", 1, 0, 40, f * predicted_ms, 40, repeat=r) for r, f in ((0, 0.5), (1, 3.5))]
    assert setting_sweep.model_sides(setting_sweep.points(apart), cost, t_http) == {"greedy 1": ["optimistic"]}
    assert setting_sweep.model_sides(setting_sweep.points(both), cost, t_http) == {"greedy 1": ["unsettled"]}
