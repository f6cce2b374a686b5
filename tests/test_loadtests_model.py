"""The sweep's helpers on their own, without servers: the grid rules, the queueing model, the
plots' arithmetic, the stand-in model and the published figures. Fast (no locust, no server)."""

from __future__ import annotations

import json
import math
import sys
import warnings

import pytest
import torch
from conftest import ROOT

if str(ROOT) not in sys.path:  # loadtests/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

from loadtests import plots, published, queueing, sweep
from loadtests._payload import PAYLOADS, ROW_SHAPES

COMMITTED = ROOT / "results" / "cpu" / "sweep.csv"


# -- the grid ----------------------------------------------------------------------------------


def test_grid_runs_batch_size_one_at_one_wait_and_timer_where_asked():
    grid = sweep.Grid(policies=("greedy", "timer"), batch_sizes=(1, 8, 16), waits_ms=(0, 5, 20),
                      loads_rps=(10,), duration_s=1, timer_batch_sizes=(16,))
    settings = grid.settings()
    assert [s for s in settings if s[1] == 1] == [("greedy", 1, 0)]
    assert {s for s in settings if s[0] == "timer"} == {("timer", 16, 5), ("timer", 16, 20)}
    # greedy waits only for bodies decoded in a thread: with inline bodies its waits are one
    # configuration, run once; with large bodies each wait is its own
    assert [s for s in settings if s[:2] == ("greedy", 8)] == [("greedy", 8, 0)]
    assert ("greedy", 8, 20) in grid.settings(greedy_waits=True)


def test_shared_device_models_are_the_simulated_sweep_model():
    from loadtests import shared_device

    assert shared_device.TIME_SCALE == sweep.SIMULATED_TIME_SCALE
    assert {shared_device.MODEL_A, shared_device.MODEL_B} <= set(PAYLOADS)
    assert all(name.startswith(sweep.SIMULATED) for name in (shared_device.MODEL_A, shared_device.MODEL_B))


def test_greedy_wait_is_effective_only_for_bodies_decoded_in_a_thread():
    from mmserver.config import DEFAULT_DECODE_IN_THREAD_BYTES as THRESHOLD

    assert sweep.effective_wait_ms("greedy", 20.0, THRESHOLD - 1) == 0.0
    assert sweep.effective_wait_ms("greedy", 20.0, THRESHOLD) == 20.0
    assert sweep.effective_wait_ms("timer", 20.0, 10) == 20.0


@pytest.mark.parametrize("model", sorted(sweep.GRIDS))
def test_every_model_has_a_body_and_its_full_grid_holds_the_shipped_defaults(model):
    full, quick = sweep.GRIDS[model]
    assert model in PAYLOADS and model in ROW_SHAPES
    assert quick.settings() and len(quick.settings()) * len(quick.loads_rps) == 4
    if model in ("resnet18", "standin"):  # greedy's 5 ms is its 0 ms with these bodies
        assert ("greedy", 16, 0) in full.settings() and ("timer", 16, 5) in full.settings()


# -- the queueing model ------------------------------------------------------------------------


def test_fit_recovers_a_line():
    sizes = [1, 2, 4, 8, 16, 32]
    cost = queueing.fit_batch_cost(sizes, [0.004 + 0.002 * b for b in sizes])
    assert cost.a == pytest.approx(0.004, rel=1e-6) and cost.c == pytest.approx(0.002, rel=1e-6)
    assert cost.offline_ceiling(32) == pytest.approx(32 / 0.068)
    with pytest.raises(ValueError):
        queueing.fit_batch_cost([4, 4], [0.01, 0.01])


def test_capacity_grows_with_the_batch_cap_and_stops_at_c_plus_t_http():
    cost = queueing.BatchCost(a=0.010, c=0.001)
    caps = [queueing.capacity(cost, 0.0005, b) for b in (1, 8, 32, 10_000)]
    assert caps == sorted(caps)
    assert caps[0] == pytest.approx(1 / 0.0115)
    assert caps[-1] == pytest.approx(1 / 0.0015, rel=0.01)


def test_predictions_below_and_past_capacity():
    cost, t_http = queueing.BatchCost(a=0.010, c=0.001), 0.0005
    cap = queueing.capacity(cost, t_http, 16)
    low, mid, past = (queueing.predict(cost, t_http, 16, rate) for rate in (5, 0.8 * cap, 1.5 * cap))
    assert low.served == 5 and low.mean_batch == 1 and not low.saturated
    assert mid.served == pytest.approx(0.8 * cap) and mid.mean_batch > 2
    assert past.saturated and past.served == pytest.approx(cap) and past.mean_batch == 16
    assert low.p99_ms < mid.p99_ms <= past.p99_ms
    assert low.mean_ms >= (cost(1) + t_http) * 1e3  # never below one call and its HTTP work
    # the timer policy waits for company at low load; greedy does not
    timer = queueing.predict(cost, t_http, 16, 5, max_wait_s=0.020, policy="timer")
    assert timer.p99_ms >= low.p99_ms + 19


def test_unbatched_setting_is_an_md1_queue_that_saturates_at_one_over_service():
    cost, t_http = queueing.BatchCost(a=0.008, c=0.002), 0.001
    service = t_http + cost(1)
    assert queueing.predict(cost, t_http, 1, 0.5 / service).mean_ms == pytest.approx(
        (service + 0.5 * service / (2 * 0.5)) * 1e3)
    assert queueing.predict(cost, t_http, 1, 1.01 / service).saturated


# -- plots' arithmetic ---------------------------------------------------------------------------


def _row(size, hist, mean, batches, **extra):
    return {"policy": "greedy", "max_batch_size": size, "max_wait_ms": 0.0, "offered_rps": 10.0,
            "batch_size_hist": hist, "mean_batch_size": mean, "batches": batches,
            "p99_ms": 50.0, "shed_503": 0, **extra}


def test_share_of_requests_weights_batches_by_their_rows():
    # 10 batches of 1 and 2 batches in 5–8 (say 8 rows each): 26 rows in all
    row = _row(8, {"1": 10, "2": 0, "4": 0, "8": 2}, mean=26 / 12, batches=12)
    shares = dict(plots.requests_by_bucket(row))
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["1"] < 0.5 < shares["5–8"]  # most batches are single, most requests are not


def test_the_histograms_bins_are_labelled_once_for_every_figure_and_sentence():
    assert plots.batch_bins(["4", "1", "2", "+Inf", "8"]) == [
        (1, 1, "1"), (2, 2, "2"), (3, 4, "3–4"), (5, 8, "5–8"), (9, float("inf"), ">8")]
    from loadtests.locust_bench import largest_bin
    assert largest_bin({1.0: 3, 2.0: 0, 4.0: 5, 8.0: 0, float("inf"): 0}) == "3–4"
    assert largest_bin({1.0: 3, 2.0: 0}) == "1"
    # the open bin above MAX_BATCH_SIZE (4 here) can hold no batch of this server: left out
    row = _row(4, {"1": 0, "2": 0, "4": 1, "+Inf": 1}, mean=4.5, batches=2)
    assert [label for label, _ in plots.requests_by_bucket(row)] == ["1", "2", "3–4"]


def test_a_log_axis_under_two_decades_carries_more_than_three_labels():
    """08's per-row cost (2.6 to 31 ms) was labelled 5, 10 and 20 only."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def labels(low, high):
        fig, ax = plt.subplots()
        ax.plot([1, 2], [low, high])
        ax.set_yscale("log")
        plots._plain_log_ticks(ax.yaxis)
        fig.canvas.draw()
        shown = {float(t.get_text()) for t in ax.yaxis.get_ticklabels(which="both")
                 if t.get_text() and low <= float(t.get_text()) <= high}
        plt.close(fig)
        return shown

    assert labels(2.6, 31) == {3, 5, 10, 20, 30}
    assert labels(0.5, 5000) == {0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000}   # wide: 1, 2, 5 only


def test_heatmap_fills_the_unbatched_row_across_greedy_waits():
    rows = [_row(1, {}, 1, 1, p99_ms=30.0),
            {**_row(8, {}, 2, 1, p99_ms=40.0), "max_wait_ms": 0.0},
            {**_row(8, {}, 2, 1, p99_ms=45.0), "max_wait_ms": 5.0}]
    sizes, columns, grid = plots.heatmap_grid(rows, 10.0)
    assert sizes == [1, 8] and columns == [("greedy", 0.0), ("greedy", 5.0)]
    assert list(grid[0]) == [30.0, 30.0] and list(grid[1]) == [40.0, 45.0]


def test_committed_sweep_plots_and_explanation():
    rows = plots.load_rows(COMMITTED)
    assert any((r["policy"], r["max_batch_size"], r["max_wait_ms"]) == ("greedy", 16, 5.0)
               for r in rows), "the shipped defaults must be in the committed grid"
    cost = queueing.BatchCost(a=0.005, c=0.003)
    figures = [plots.plot_frontier(rows, budget_ms=100),
               plots.plot_batch_size_distribution(rows, share="requests"),
               plots.plot_p99_heatmaps(rows, budget_ms=100),
               plots.plot_model_vs_measured(rows, cost, 0.0005)]
    for figure in figures:
        assert figure.get_suptitle()
        for ax in figure.axes:
            if ax.get_visible() and ax.get_label() != "<colorbar>":
                assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title(), ax
    assert "share of requests" in figures[1].axes[0].get_ylabel()
    text = plots.explain_recommendation(rows, 100)
    pick = plots.recommend(rows, 100)
    assert f"--max-batch-size {pick['max_batch_size']}" in text
    assert "No setting" in plots.explain_recommendation(rows, 0.001)


# -- repeats and recommend()'s rule -----------------------------------------------------------


def _point(policy, size, wait, load, p99, device_ms, repeat=0, shed=0, effective=None):
    row = {"policy": policy, "max_batch_size": size, "max_wait_ms": float(wait),
           "effective_max_wait_ms": float(wait if effective is None else effective),
           "offered_rps": float(load), "achieved_rps": float(load), "p50_ms": p99 / 2,
           "p99_ms": float(p99), "shed_503": shed, "failures": 0, "requests": 100,
           "mean_batch_size": 2.0, "batches": 50, "batch_size_hist": {}, "repeat": repeat,
           "device_seconds_per_request": device_ms / 1000, "device_busy_fraction": 0.5}
    for column in plots.MEASURED:
        row.setdefault(column, 1.0)
    return row


def test_identical_configurations_are_one_point_with_repeats():
    # greedy at 0, 5 and 20 ms with inline bodies: one configuration, three repeats
    rows = [_point("greedy", 16, wait, 100, p99, 3.0, effective=0)
            for wait, p99 in ((0, 40), (5, 90), (20, 50))]
    (point,) = plots.points(rows)
    assert point["repeats"] == 3 and point["p99_ms"] == 50  # the median, not one draw
    assert (point["p99_min_ms"], point["p99_max_ms"]) == (40, 90)
    assert plots.setting_label(point) == "greedy, batch≤16, wait 0 ms"


def _repeated(policy, size, wait, load, p99, device_ms, **extra):
    return [_point(policy, size, wait, load, p99 + 5 * repeat, device_ms, repeat, **extra)
            for repeat in range(3)]


def test_recommend_takes_the_highest_load_held():
    rows = (_repeated("greedy", 32, 0, 100, 60, 8.0) + _repeated("greedy", 32, 0, 200, 150, 5.0)
            + _repeated("greedy", 32, 0, 300, 400, 4.0))          # 300: over budget
    rows += [_point("greedy", 16, 0, 300, 180, 4.0, shed=1)]       # shed once: not held
    pick = plots.recommend(rows, budget_ms=250)
    assert (plots.config_key(pick), pick["offered_rps"]) == (("greedy", 32, 0.0), 200.0)
    assert pick["p99_ms"] == 155 and pick["repeats"] == 3          # the median of 150/155/160
    assert plots.recommend(rows, budget_ms=10) is None


def test_a_measurably_lower_p99_wins_over_less_device_time():
    rows = _repeated("greedy", 16, 0, 200, 140, 6.0) + _repeated("timer", 32, 120, 200, 190, 2.0)
    assert [plots.config_key(r) for r in plots.tied_points(rows, 250)] == [("greedy", 16, 0.0)]
    assert plots.config_key(plots.recommend(rows, 250)) == ("greedy", 16, 0.0)


def test_a_tie_goes_to_the_setting_that_degrades_least_at_the_next_load():
    rows = (_repeated("greedy", 16, 0, 200, 140, 6.0) + _repeated("timer", 32, 60, 200, 150, 3.0)
            + _repeated("greedy", 16, 0, 300, 280, 4.0) + _repeated("timer", 32, 60, 300, 450, 2.5))
    assert len(plots.tied_points(rows, 250)) == 2                  # 140-150 overlaps 150-160
    assert plots.config_key(plots.recommend(rows, 250)) == ("greedy", 16, 0.0)
    # shedding at the next load is worse than any p99 that did not shed
    shed = [dict(r, shed_503=5) if r["policy"] == "greedy" and r["offered_rps"] == 300 else r
            for r in rows]
    assert plots.config_key(plots.recommend(shed, 250)) == ("timer", 32, 60.0)
    text = plots.explain_recommendation(rows, 250)
    assert "--policy greedy --max-batch-size 16 --max-wait-ms 0" in text
    assert "over 3 repeats" in text and "tied (step 3)" in text


def test_without_a_next_load_a_tie_goes_to_the_least_device_time():
    rows = _repeated("greedy", 16, 0, 200, 140, 6.0) + _repeated("timer", 32, 60, 200, 150, 3.0)
    assert plots.config_key(plots.recommend(rows, 250)) == ("timer", 32, 60.0)
    # one repeat each: a tie is within 15 % of the lowest p99
    single = [r for r in rows if r["repeat"] == 0]
    assert plots.config_key(plots.recommend(single, 250)) == ("timer", 32, 60.0)
    apart = [dict(r, p99_ms=200.0) if r["policy"] == "timer" else r for r in single]
    assert plots.config_key(plots.recommend(apart, 250)) == ("greedy", 16, 0.0)


def test_heatmap_frames_exactly_the_pick():
    from matplotlib.patches import Rectangle

    rows = [_point("greedy", 32, 0, 200, 150, 5.0), _point("greedy", 16, 0, 200, 140, 6.0),
            _point("timer", 32, 60, 200, 150, 3.0)]
    figure = plots.plot_p99_heatmaps(rows, budget_ms=250)
    frames = [patch for patch in figure.axes[0].patches if isinstance(patch, Rectangle)]
    assert len(frames) == 1
    sizes = sorted({r["max_batch_size"] for r in rows})
    columns = plots._heatmap_columns(plots.points(rows))
    x, y = frames[0].get_xy()
    assert (columns[round(x + 0.5)], sizes[round(y + 0.5)]) == (("timer", 60.0), 32)


# -- the stand-in and the published figures -------------------------------------------------------


def test_standin_is_deep_narrow_and_servable(tmp_path):
    from loadtests.models import DeepNarrow, write_model

    small = DeepNarrow(depth=3, width=4)
    assert small(torch.zeros(5, 4)).shape == (5, 4)
    write_model("standin", tmp_path / "standin")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = torch.jit.load(str(tmp_path / "standin" / "model.pt"))
    assert loaded(torch.zeros(3, *ROW_SHAPES["standin"][1:])).shape[0] == 3
    assert not (tmp_path / "standin" / "mmserver.json").exists()


def test_published_figures_are_consistent():
    for figures in published.RESNET50.values():
        assert len(figures["images_per_s"]) == len(figures["latency_ms"]) == len(published.BATCH_SIZES)
        # throughput x latency ~ batch size (both are averages of the same runs)
        for b, ips, ms in zip(published.BATCH_SIZES, figures["images_per_s"], figures["latency_ms"]):
            assert ips * ms / 1000 == pytest.approx(b, rel=0.15), (b, ips, ms)
    assert published.gain("V100 16GB, mixed precision", 32) > 25
    assert json.dumps(published.SOURCE)
    assert not math.isnan(published.gain("T4, FP32", 256))


def test_per_request_cost_of_a_mean_batch_mixes_the_two_sizes_around_it():
    """07's greedy at its lowest load: calls of 1.43 rows with t(1) = 12.91 ms below the line
    (F = 13.62, c = 4.53 ms): 57 % ones and 43 % twos cost 11.97 ms a request, not t(1)."""
    cost = queueing.BatchCost(a=0.01362, c=0.00453, t1=0.01291)
    assert cost.per_request(1.43) == pytest.approx((0.57 * 0.01291 + 0.43 * (0.01362 + 2 * 0.00453)) / 1.43)
    assert cost.per_request(1.0) == pytest.approx(0.01291)
    assert cost.per_request(3.13) == pytest.approx((0.01362 + 0.00453 * 3.13) / 3.13)   # on the line from 2
    with pytest.raises(ValueError):
        cost.per_request(0.5)
