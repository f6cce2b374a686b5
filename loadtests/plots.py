"""Plots of a batching sweep (``sweep.csv`` from ``python -m loadtests.sweep``).

Each function takes the rows (``load_rows(path)``) and returns a matplotlib
``Figure`` (built without pyplot, so a notebook shows it once and a script
needs no display):

``plot_frontier``
    achieved throughput against p50 and p99 latency, one line per setting
    (policy, MAX_BATCH_SIZE, MAX_WAIT) through its offered loads, each point
    labelled with its offered load: the latency/throughput frontier.
``plot_batch_size_distribution``
    how the server's batches were distributed over sizes at one offered load,
    one panel per setting (from the ``/metrics`` histogram buckets saved per
    point), as a share of batches or of *requests* (a request's view: how big
    was the batch I rode in?).
``plot_p99_heatmap``
    p99 latency over MAX_BATCH_SIZE x MAX_WAIT at one offered load, a panel
    per policy.
``plot_p99_heatmaps``
    the same at several offered loads side by side (policy and MAX_WAIT on
    the x axis), cells over a budget marked.
``plot_model_vs_measured``
    p99 and throughput against offered load, measured points over the
    predictions of ``loadtests.queueing``.

Repeats. A *configuration* is what the server effectively did: policy,
MAX_BATCH_SIZE and the *effective* MAX_WAIT (``effective_max_wait_ms``:
greedy's wait applies only to bodies decoded in a thread, so for small bodies
greedy at 0, 5 or 20 ms is one configuration). Rows of one configuration at
one offered load are repeats of one point; ``points(rows)`` merges them into
one row holding the median of each measurement, with ``p99_min_ms``,
``p99_max_ms`` and ``repeats``. Every plot and ``recommend`` work on points.

``recommend(rows, budget_ms)`` states its rule in ``RECOMMEND_RULE``;
``explain_recommendation`` says why, in words and numbers.

    python -m loadtests.plots results/cpu/sweep.csv results/cpu   # writes the PNGs
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

INT_COLUMNS = ("max_batch_size", "max_queue_size", "users", "requests", "failures", "shed_503",
               "batches", "cpu_count", "locust_processes")
FLOAT_COLUMNS = ("max_wait_ms", "offered_rps", "duration_s", "achieved_rps", "sent_rps", "p50_ms",
                 "p95_ms", "p99_ms", "mean_ms", "max_ms", "server_mean_latency_ms",
                 "mean_batch_size", "mean_queue_wait_ms", "mean_compute_ms",
                 "effective_max_wait_ms", "window_s", "device_seconds_per_request",
                 "device_busy_fraction")
#: measured columns that ``points`` takes the median of across repeats
MEASURED = ("achieved_rps", "sent_rps", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "max_ms",
            "server_mean_latency_ms", "mean_batch_size", "mean_queue_wait_ms", "mean_compute_ms",
            "device_seconds_per_request", "device_busy_fraction")


def _number(text, kind):
    if text in (None, ""):
        return math.nan if kind is float else 0
    return kind(float(text)) if kind is int else kind(text)


def load_rows(path) -> list[dict]:
    """``sweep.csv`` as dicts with numbers as numbers and ``batch_size_hist`` as a dict."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        for column in INT_COLUMNS:
            if column in row:
                row[column] = _number(row[column], int)
        for column in FLOAT_COLUMNS:
            if column in row:
                row[column] = _number(row[column], float)
        row["batch_size_hist"] = json.loads(row.get("batch_size_hist") or "{}")
        _complete(row)
    return rows


def _complete(row: dict) -> None:
    """Columns of sweeps written before they existed, derived from what those recorded: the
    repeat (0), greedy's effective wait (0: every such sweep sent bodies decoded inline) and
    the device time (the server's compute histogram: mean call x calls, per request answered;
    busy fraction: the calls' seconds over the point's duration)."""
    row.setdefault("repeat", 0)
    row["repeat"] = int(float(row["repeat"] or 0))
    if math.isnan(row.get("effective_max_wait_ms", math.nan)):
        row["effective_max_wait_ms"] = 0.0 if row["policy"] == "greedy" else row["max_wait_ms"]
    compute_s = row.get("mean_compute_ms", math.nan) * row.get("batches", 0) / 1000
    if math.isnan(row.get("device_seconds_per_request", math.nan)) and row.get("requests"):
        row["device_seconds_per_request"] = compute_s / row["requests"]
    if math.isnan(row.get("device_busy_fraction", math.nan)) and row.get("duration_s"):
        row["device_busy_fraction"] = compute_s / row["duration_s"]


def config_key(row) -> tuple:
    """(policy, MAX_BATCH_SIZE, effective MAX_WAIT): what the server effectively did."""
    return (row["policy"], row["max_batch_size"], row["effective_max_wait_ms"])


def points(rows) -> list[dict]:
    """One row per (configuration, offered load): medians over its repeats, with
    ``repeats``, ``p99_min_ms``/``p99_max_ms`` (the spread) and shed/failures summed."""
    import statistics

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((*config_key(r), r["offered_rps"]), []).append(r)
    merged = []
    for group in groups.values():
        first = dict(group[0])
        if len(group) > 1 or "repeats" not in first:
            for column in MEASURED:
                values = [r[column] for r in group if not math.isnan(r.get(column, math.nan))]
                first[column] = statistics.median(values) if values else math.nan
            first["p99_min_ms"] = min(r["p99_ms"] for r in group)
            first["p99_max_ms"] = max(r["p99_ms"] for r in group)
            first["shed_503"] = sum(r["shed_503"] for r in group)
            first["failures"] = sum(r["failures"] for r in group)
            first["requests"] = sum(r["requests"] for r in group)
            first["repeats"] = sum(r.get("repeats", 1) for r in group)
            first["max_wait_ms"] = first["effective_max_wait_ms"]
        merged.append(first)
    return sorted(merged, key=lambda r: (*config_key(r), r["offered_rps"]))


def setting_label(row) -> str:
    wait = row.get("effective_max_wait_ms", row["max_wait_ms"])
    if math.isnan(wait):
        wait = row["max_wait_ms"]
    return f"{row['policy']}, batch≤{row['max_batch_size']}, wait {wait:g} ms"


def _settings(rows):
    keys = sorted({config_key(r) for r in rows})
    return [[r for r in rows if config_key(r) == k] for k in keys]


def _loads(rows):
    return sorted({r["offered_rps"] for r in rows})


def _nearest_load(rows, offered_rps):
    loads = _loads(rows)
    if offered_rps is None:  # the busiest load that is not the overload point
        return loads[-2] if len(loads) > 2 else loads[-1]
    return min(loads, key=lambda load: abs(load - offered_rps))


def within_budget(row, budget_ms: float) -> bool:
    return (row["p99_ms"] <= budget_ms and row["failures"] == 0 and row["shed_503"] == 0
            and row["requests"] > 0)


RECOMMEND_RULE = """\
1. A point (one configuration at one offered load, its repeats merged) is within budget when
   its median p99 is within the budget and no repeat shed (503) or failed a request.
2. The answer comes from the highest offered load at which any point is within budget.
3. There, points whose p99 range over the repeats overlaps the lowest point's range (or,
   with a single repeat, lies within 15 % of it) are a tie: closer than this sweep can tell
   apart.
4. A tie goes to the setting that degrades least if traffic grows: the lowest median p99 at
   the next offered load of the sweep, counting a setting that shed there as worse than any
   that did not. Without a next load (or among equals there), to the least device time per
   request, then the shorter MAX_WAIT, then the smaller MAX_BATCH_SIZE."""


def tied_points(rows, budget_ms: float, tie_tolerance: float = 0.15) -> list[dict]:
    """The points of ``RECOMMEND_RULE`` steps 1-3: the tie at the highest load held, lowest
    p99 first (empty when no point is within budget)."""
    candidates = [r for r in points(rows) if within_budget(r, budget_ms)]
    if not candidates:
        return []
    load = max(r["offered_rps"] for r in candidates)
    at_load = sorted((r for r in candidates if r["offered_rps"] == load), key=lambda r: r["p99_ms"])

    def p99_range(r):
        if r.get("repeats", 1) > 1:
            return r["p99_min_ms"], r["p99_max_ms"]
        return r["p99_ms"], r["p99_ms"] * (1 + tie_tolerance)

    best_high = p99_range(at_load[0])[1]
    return [r for r in at_load if p99_range(r)[0] <= best_high]


def recommend(rows, budget_ms: float = 100.0, tie_tolerance: float = 0.15):
    """The point that ``RECOMMEND_RULE`` picks, or None when no point is within budget."""
    tied = tied_points(rows, budget_ms, tie_tolerance)
    if not tied:
        return None
    merged = points(rows)
    load = tied[0]["offered_rps"]
    higher = [x for x in _loads(merged) if x > load]

    def at_next_load(r):
        if not higher:
            return (False, 0.0)
        nxt = next((p for p in merged if config_key(p) == config_key(r)
                    and p["offered_rps"] == higher[0]), None)
        if nxt is None:
            return (True, math.inf)
        return (nxt["shed_503"] > 0 or nxt["failures"] > 0, nxt["p99_ms"])

    def device_time(r):
        value = r.get("device_seconds_per_request", math.nan)
        return math.inf if math.isnan(value) else value

    return min(tied, key=lambda r: (*at_next_load(r), device_time(r), r["effective_max_wait_ms"],
                                    r["max_batch_size"]))


def _figure(width, height):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


#: one colour per MAX_BATCH_SIZE, one line style per MAX_WAIT, one marker per policy
_SIZE_COLORS = ["tab:gray", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple",
                "tab:brown", "tab:pink"]
_WAIT_STYLES = ["-", "--", ":", "-."]


def _style(rows, row) -> dict:
    sizes = sorted({r["max_batch_size"] for r in rows})
    waits = sorted({r["max_wait_ms"] for r in rows})
    return {"color": _SIZE_COLORS[sizes.index(row["max_batch_size"]) % len(_SIZE_COLORS)],
            "linestyle": _WAIT_STYLES[waits.index(row["max_wait_ms"]) % len(_WAIT_STYLES)],
            "marker": "o" if row["policy"] == "greedy" else "s"}


def plot_frontier(rows, percentiles=("p50_ms", "p99_ms"), budget_ms: float | None = None,
                  label_loads: bool = True):
    """Throughput (x) against latency (y, log) per setting; one panel per percentile.

    Colour: MAX_BATCH_SIZE; line style: MAX_WAIT; marker: policy (circle greedy, square
    timer). With ``label_loads`` each point of the p99 panel carries its offered load
    (requests/s), so a curve that folds back (less served at a higher offered load, past
    saturation) can be read.
    """
    rows = points(rows)
    fig = _figure(6.0 * len(percentiles) + 2.5, 5.0)
    axes = fig.subplots(1, len(percentiles), sharey=True, squeeze=False)[0]
    groups = _settings(rows)
    for ax, column in zip(axes, percentiles):
        for group in groups:
            group = sorted(group, key=lambda r: r["offered_rps"])
            first = group[0]
            ax.plot([r["achieved_rps"] for r in group], [r[column] for r in group],
                    label=setting_label(first), alpha=0.85, **_style(rows, first))
            if label_loads and column == percentiles[-1]:
                for r in group:
                    ax.annotate(f"{r['offered_rps']:g}", (r["achieved_rps"], r[column]),
                                textcoords="offset points", xytext=(3, 3), fontsize=6,
                                color=_style(rows, first)["color"])
        if budget_ms and column == "p99_ms":
            ax.axhline(budget_ms, color="red", linewidth=0.8, linestyle="--",
                       label=f"p99 budget ({budget_ms:g} ms)")
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
        ax.set_xlabel("achieved throughput (requests/s)")
        ax.set_ylabel(f"{column.removesuffix('_ms')} latency (ms)")
        ax.set_title(f"Throughput vs {column.removesuffix('_ms')} latency")
        ax.grid(True, which="both", alpha=0.3)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small",
                    title="setting (a marker per offered load;\nnumbers: offered requests/s)")
    fig.suptitle(_subtitle(rows))
    return fig


def _plain_log_ticks(axis) -> None:
    """Label a log axis 1, 2, 5 x 10^k in plain numbers (not 10^2, and not every minor tick);
    on an axis under two decades, 3 x 10^k too, so that it carries more than three labels."""
    from matplotlib.ticker import FuncFormatter

    def plain(value: float, _) -> str:
        low, high = sorted(axis.get_view_interval())
        digits = "1235" if low > 0 and high / low < 100 else "125"
        return f"{value:g}" if f"{value:.0e}"[0] in digits else ""

    axis.set_major_formatter(FuncFormatter(plain))
    axis.set_minor_formatter(FuncFormatter(plain))


def _p99_range(row: dict) -> str:
    """A point's p99 over its repeats, as every printed range is written."""
    from loadtests.instruments import show_range
    return show_range(row["p99_min_ms"] / 1e3, row["p99_max_ms"] / 1e3, "s")


def batch_bins(upper_bounds) -> list[tuple[int, float, str]]:
    """The batch-size histogram's bins as every figure and sentence writes them: ``(lowest,
    highest, label)`` rows per call from the buckets' upper bounds (``mmserver_batch_size_rows``:
    1, 2, 4, 8, ..., +Inf), labelled ``1``, ``2``, ``3–4``, ``5–8``, ..., ``>64``."""
    bins, previous = [], 0
    for bound in sorted(float(b) for b in upper_bounds):
        low = previous + 1
        if math.isinf(bound):
            bins.append((low, bound, f">{previous}"))
            break
        upper = int(bound)
        bins.append((low, upper, str(upper) if upper == low else f"{low}–{upper}"))
        previous = upper
    return bins


def _buckets(hist: dict) -> list[tuple[int, float, str, float]]:
    """A point's histogram, bin by bin: (lowest, highest, label, batches); +Inf only when it
    counted a batch."""
    counts = {float(k): v for k, v in hist.items()}
    return [(low, high, label, counts[high]) for low, high, label in batch_bins(counts)
            if not math.isinf(high) or counts[high]]


def requests_by_bucket(row) -> list[tuple[str, float]]:
    """(size range, share of the point's *requests* that rode in a batch of that size).

    The histogram counts batches per range (1, 2, 3-4, 5-8, ...); a range's requests are
    estimated as its batches times the middle of the range (capped at MAX_BATCH_SIZE), then
    scaled so that they add up to the rows the server really ran (mean batch x batches).
    Ranges 1 and 2 are exact; the scaling keeps the total exact.
    """
    cap = max(1, row["max_batch_size"])
    estimate = []
    for low, high, label, count in _buckets(row["batch_size_hist"]):
        if low > cap:
            continue
        estimate.append((label, count * (low + min(high, cap)) / 2))
    total_estimated = sum(v for _, v in estimate)
    rows_run = row["mean_batch_size"] * row["batches"]
    if not total_estimated:
        return [(label, 0.0) for label, _ in estimate]
    scale = rows_run / total_estimated if rows_run and not math.isnan(rows_run) else 1.0
    total = total_estimated * scale
    return [(label, v * scale / total) for label, v in estimate]


def plot_batch_size_distribution(rows, offered_rps: float | None = None, share: str = "batches"):
    """Share of batches (``share="batches"``) or of requests (``share="requests"``) per size
    range at one offered load, one panel per setting."""
    rows = points(rows)
    if share not in ("batches", "requests"):
        raise ValueError("share is 'batches' or 'requests'")
    load = _nearest_load(rows, offered_rps)
    at_load = sorted((r for r in rows if r["offered_rps"] == load),
                    key=lambda r: (r["policy"], r["max_batch_size"], r["max_wait_ms"]))
    columns = min(4, max(1, len(at_load)))
    lines = max(1, math.ceil(len(at_load) / columns))
    fig = _figure(3.4 * columns, 2.6 * lines + 0.6)
    axes = fig.subplots(lines, columns, squeeze=False, sharey=True)
    for ax in axes.flat[len(at_load):]:
        ax.set_visible(False)
    for ax, row in zip(axes.flat, at_load):
        if share == "requests":
            shares = requests_by_bucket(row)
        else:
            buckets = [(label, count) for low, _, label, count in _buckets(row["batch_size_hist"])
                       if low <= max(row["max_batch_size"], 1)]
            total = sum(count for _, count in buckets) or 1
            shares = [(label, count / total) for label, count in buckets]
        ax.bar([label for label, _ in shares], [value for _, value in shares],
               color="tab:green" if share == "requests" else "tab:blue")
        ax.set_title(f"{setting_label(row)}\nmean {row['mean_batch_size']:.2f} rows per batch",
                     fontsize="small")
        ax.set_xlabel("batch size (rows)")
        ax.set_ylabel(f"share of {share}")
        ax.tick_params(axis="x", labelsize="small")
        ax.set_ylim(0, 1)
    what = "Requests by the size of the batch they rode in" if share == "requests" else \
        "Batch sizes the server formed"
    fig.suptitle(f"{what} at {load:g} requests/s offered — {_subtitle(rows)}")
    return fig


def plot_p99_heatmap(rows, offered_rps: float | None = None, column: str = "p99_ms"):
    """``column`` (p99 by default) over MAX_BATCH_SIZE x MAX_WAIT at one load, per policy."""
    rows = points(rows)
    import numpy as np

    load = _nearest_load(rows, offered_rps)
    at_load = [r for r in rows if r["offered_rps"] == load]
    policies = sorted({r["policy"] for r in at_load})
    sizes = sorted({r["max_batch_size"] for r in at_load})
    waits = sorted({r["max_wait_ms"] for r in at_load})
    fig = _figure(1.6 + 1.3 * len(waits) * len(policies) + 1.2, 1.2 + 0.8 * len(sizes))
    axes = fig.subplots(1, len(policies), squeeze=False)[0]
    values = [r[column] for r in at_load if not math.isnan(r[column])]
    vmin, vmax = (min(values), max(values)) if values else (1, 10)
    from matplotlib.colors import LogNorm
    norm = LogNorm(vmin=max(vmin, 0.1), vmax=max(vmax, vmin * 1.01, 0.2))
    image = None
    for ax, policy in zip(axes, policies):
        grid = np.full((len(sizes), len(waits)), np.nan)
        for r in at_load:
            if r["policy"] == policy:
                grid[sizes.index(r["max_batch_size"]), waits.index(r["max_wait_ms"])] = r[column]
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="magma_r", norm=norm, aspect="auto",
                          origin="lower")
        for i, _ in enumerate(sizes):
            for j, _ in enumerate(waits):
                text = "—" if np.isnan(grid[i, j]) else f"{grid[i, j]:.0f}"
                ax.text(j, i, text, ha="center", va="center", fontsize="small",
                        color="white" if not np.isnan(grid[i, j]) and norm(grid[i, j]) > 0.6 else "black")
        ax.set_xticks(range(len(waits)), [f"{w:g}" for w in waits])
        ax.set_yticks(range(len(sizes)), [str(s) for s in sizes])
        ax.set_xlabel("MAX_WAIT (ms)")
        ax.set_ylabel("MAX_BATCH_SIZE (rows)")
        missing = bool(np.isnan(grid).any())
        ax.set_title(f"policy {policy}" + ("\n(—: not run, it behaves as greedy)"
                                           if missing and policy == "timer" else ""))
    if image is not None:
        from matplotlib.ticker import FuncFormatter
        bar = fig.colorbar(image, ax=list(axes), label=f"{column.removesuffix('_ms')} latency (ms)")
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        bar.ax.yaxis.set_major_formatter(plain)
        bar.ax.yaxis.set_minor_formatter(plain)
    fig.suptitle(f"{column.removesuffix('_ms')} latency at {load:g} requests/s offered — "
                 f"{_subtitle(rows)}")
    return fig


def _heatmap_columns(rows) -> list[tuple[str, float]]:
    return sorted({(r["policy"], r["max_wait_ms"]) for r in rows},
                  key=lambda pw: (pw[0] != "greedy", pw[0], pw[1]))


def heatmap_grid(rows, offered_rps: float, column: str = "p99_ms"):
    """(sizes, [(policy, wait)], grid of ``column``) at one offered load.

    MAX_BATCH_SIZE 1 runs at one wait only (the wait never applies to a batch of one); its
    value fills every greedy column of its row.
    """
    import numpy as np

    at_load = [r for r in rows if r["offered_rps"] == offered_rps]
    sizes = sorted({r["max_batch_size"] for r in rows})
    columns = _heatmap_columns(rows)
    grid = np.full((len(sizes), len(columns)), np.nan)
    for r in at_load:
        i = sizes.index(r["max_batch_size"])
        if r["max_batch_size"] == 1:
            for j, (policy, _) in enumerate(columns):
                if policy == r["policy"]:
                    grid[i, j] = r[column]
        else:
            grid[i, columns.index((r["policy"], r["max_wait_ms"]))] = r[column]
    return sizes, columns, grid


def plot_p99_heatmaps(rows, loads=None, budget_ms: float | None = 100.0,
                      column: str = "p99_ms"):
    """p99 over MAX_BATCH_SIZE (rows) x policy and MAX_WAIT (columns), a panel per offered
    load (default: every load of the sweep), on one shared log colour scale. Cells over
    ``budget_ms`` (or that shed requests) carry a cross; the best cell within budget of
    the panel at its load, the point ``recommend`` picks, is outlined in green."""
    rows = points(rows)
    import numpy as np
    from matplotlib.colors import LogNorm
    from matplotlib.patches import Rectangle
    from matplotlib.ticker import FuncFormatter

    loads = list(loads) if loads is not None else _loads(rows)
    loads = [_nearest_load(rows, load) for load in loads]
    values = [r[column] for r in rows if r["offered_rps"] in loads and not math.isnan(r[column])]
    vmin, vmax = (min(values), max(values)) if values else (1, 10)
    norm = LogNorm(vmin=max(vmin, 0.1), vmax=max(vmax, vmin * 1.01, 0.2))
    sizes = sorted({r["max_batch_size"] for r in rows})
    columns = _heatmap_columns(rows)
    fig = _figure(1.5 + (0.75 * len(columns) + 0.9) * len(loads), 1.9 + 0.55 * len(sizes))
    axes = fig.subplots(1, len(loads), squeeze=False, sharey=True)[0]
    image = None
    pick = recommend(rows, budget_ms) if budget_ms is not None else None
    for ax, load in zip(axes, loads):
        _, _, grid = heatmap_grid(rows, load, column)
        _, _, shed = heatmap_grid(rows, load, "shed_503")
        image = ax.imshow(np.ma.masked_invalid(grid), cmap="magma_r", norm=norm, aspect="auto",
                          origin="lower")
        for i in range(len(sizes)):
            for j in range(len(columns)):
                value = grid[i, j]
                if np.isnan(value):
                    ax.text(j, i, "—", ha="center", va="center", fontsize="small")
                    continue
                over = budget_ms is not None and (value > budget_ms or shed[i, j] > 0)
                ax.text(j, i, f"{value:.0f}" + ("\n✗" if over else ""), ha="center",
                        va="center", fontsize=7,
                        color="white" if norm(value) > 0.6 else "black")
        if pick is not None and pick["offered_rps"] == load:
            i = sizes.index(pick["max_batch_size"])
            j = columns.index((pick["policy"], pick["max_wait_ms"])) if pick["max_batch_size"] > 1 \
                else next(k for k, (policy, _) in enumerate(columns) if policy == pick["policy"])
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False,
                                   edgecolor="tab:green", linewidth=2.5))
        ax.set_xticks(range(len(columns)), [f"{p}\n{w:g}" for p, w in columns], fontsize=7)
        ax.set_yticks(range(len(sizes)), [str(size) for size in sizes])
        ax.set_xlabel("policy and MAX_WAIT (ms)")
        ax.set_ylabel("MAX_BATCH_SIZE (rows)")
        ax.set_title(f"{load:g} requests/s offered", fontsize="small")
    if image is not None:
        bar = fig.colorbar(image, ax=list(axes), label=f"{column.removesuffix('_ms')} latency (ms)")
        # label 1, 2, 5 x 10^k only: every minor tick labelled crowds the bar
        plain = FuncFormatter(lambda value, _: f"{value:g}"
                              if f"{value:.0e}"[0] in "125" else "")
        bar.ax.yaxis.set_major_formatter(plain)
        bar.ax.yaxis.set_minor_formatter(plain)
    budget = (f"; ✗ over {budget_ms:g} ms or shed, green: recommend()'s pick"
              if budget_ms is not None else "")
    fig.suptitle(f"{column.removesuffix('_ms')} latency by setting and load{budget} — "
                 f"{_subtitle(rows)}", fontsize="medium")
    return fig


def plot_model_vs_measured(rows, cost, t_http: float, sizes=None, policy: str = "greedy",
                           wait_ms: float | None = None, max_queue_size: int | None = None,
                           latency_offset_ms: float = 0.0):
    """Measured points (markers) over ``loadtests.queueing.predict`` (lines) against offered
    load: served requests/s on the left, p99 (ms, log) on the right, one colour per
    MAX_BATCH_SIZE, for ``policy`` at MAX_WAIT ``wait_ms`` (default: the smallest waits
    run; MAX_BATCH_SIZE 1 at whatever wait it ran). ``latency_offset_ms`` is added to every
    predicted latency: the time a request spends outside the server's core, which the model
    leaves out."""
    rows = points(rows)
    import numpy as np

    from loadtests.queueing import predict

    chosen = [r for r in rows if r["policy"] == policy]
    sizes = sorted(sizes or {r["max_batch_size"] for r in chosen})
    queue = max_queue_size or (chosen[0]["max_queue_size"] if chosen else 64)
    top = max((r["offered_rps"] for r in rows), default=100) * 1.1
    rates = np.linspace(max(1.0, top / 200), top, 200)
    fig = _figure(12.5, 4.8)
    ax_served, ax_p99 = fig.subplots(1, 2)
    for size in sizes:
        measured = [r for r in chosen if r["max_batch_size"] == size]
        waits = sorted({r["max_wait_ms"] for r in measured})
        wait = wait_ms if wait_ms in waits else (waits[0] if waits else 0.0)
        measured = sorted((r for r in measured if r["max_wait_ms"] == wait),
                        key=lambda r: r["offered_rps"])
        color = _SIZE_COLORS[sorted({r["max_batch_size"] for r in rows}).index(size)
                             % len(_SIZE_COLORS)] if size in {r["max_batch_size"] for r in rows} \
            else "black"
        predicted = [predict(cost, t_http, size, rate, max_wait_s=wait / 1000, policy=policy,
                             max_queue_size=queue) for rate in rates]
        label = f"batch≤{size}" + (f", wait {wait:g} ms" if size > 1 else "")
        ax_served.plot(rates, [p.served for p in predicted], color=color, label=f"{label} (model)")
        ax_p99.plot(rates, [p.p99_ms + latency_offset_ms for p in predicted], color=color)
        ax_served.plot([r["offered_rps"] for r in measured], [r["achieved_rps"] for r in measured],
                       "o", color=color, label=f"{label} (measured)")
        ax_p99.plot([r["offered_rps"] for r in measured], [r["p99_ms"] for r in measured], "o",
                    color=color)
    ax_served.plot(rates, rates, color="black", linewidth=0.6, linestyle=":",
                   label="served = offered")
    ax_served.set_xlabel("offered load (requests/s)")
    ax_served.set_ylabel("served (requests/s)")
    ax_served.set_title("Throughput: model (lines) vs measured (dots)")
    ax_served.legend(fontsize="x-small")
    ax_p99.set_yscale("log")
    ax_p99.set_xlabel("offered load (requests/s)")
    ax_p99.set_ylabel("p99 latency (ms, log)")
    ax_p99.set_title("p99 latency: model (lines) vs measured (dots)")
    for ax in (ax_served, ax_p99):
        ax.grid(True, which="both", alpha=0.3)
    offset = f", + {latency_offset_ms:.1f} ms outside the core" if latency_offset_ms else ""
    fig.suptitle(f"Queueing model with t(b) = {cost.a * 1e3:.2f} ms + {cost.c * 1e3:.3f} ms·b, "
                 f"t_http = {t_http * 1e3:.2f} ms{offset}, policy {policy} — {_subtitle(rows)}",
                 fontsize="medium")
    return fig


def most_served(rows) -> dict:
    """{(policy, size, wait): the point that served the most}."""
    rows = points(rows)
    best = {}
    for r in rows:
        key = config_key(r)
        if key not in best or r["achieved_rps"] > best[key]["achieved_rps"]:
            best[key] = r
    return best


def explain_recommendation(rows, budget_ms: float) -> str:
    """``recommend``'s choice in words: what it served, which rule step decided, and what
    the others did at the same load and at the next one."""
    rows = points(rows)
    pick = recommend(rows, budget_ms)
    if pick is None:
        lowest = min(rows, key=lambda r: r["p99_ms"], default=None)
        hint = (f" (the lowest p99 measured was {lowest['p99_ms']:g} ms, {setting_label(lowest)} "
                f"at {lowest['offered_rps']:g} requests/s)") if lowest else ""
        return (f"No setting kept p99 within {budget_ms:g} ms without shedding at any load of "
                f"this sweep{hint}: raise the budget or lower the load.")
    load = pick["offered_rps"]
    same = sorted((r for r in rows if r["offered_rps"] == load and within_budget(r, budget_ms)),
                  key=lambda r: r["p99_ms"])
    tied = tied_points(rows, budget_ms)
    higher = [x for x in _loads(rows) if x > load]
    spread = (f" (range {_p99_range(pick)} over {pick['repeats']} repeats)"
              if pick.get("repeats", 1) > 1 else "")
    lines = [
        (f"For a p99 budget of {budget_ms:g} ms choose {setting_label(pick)} "
         f"(--policy {pick['policy']} --max-batch-size {pick['max_batch_size']} "
         f"--max-wait-ms {pick['max_wait_ms']:g})."),
        (f"At {load:g} requests/s offered it served {pick['achieved_rps']:.0f} with median p99 "
         f"{pick['p99_ms']:g} ms{spread}, p50 {pick['p50_ms']:g} ms, nothing shed, batches of "
         f"{pick['mean_batch_size']:.1f} rows, {pick['device_seconds_per_request'] * 1e3:.2f} ms "
         f"of device time per request."),
        (f"Why: {load:g} requests/s is the highest offered load at which any setting stayed "
         f"within the budget (rule step 2); {len(same)} setting(s) did."),
    ]
    others = [r for r in same if config_key(r) != config_key(pick)]
    if others:
        tied_keys = {config_key(r) for r in tied}
        lines.append("Within budget there as well: " + "; ".join(
            f"{setting_label(r)}: p99 {r['p99_ms']:g} ms"
            + (f" ({_p99_range(r)})" if r.get("repeats", 1) > 1 else "")
            + (", tied (step 3)" if config_key(r) in tied_keys else ", not tied: measurably slower")
            for r in others) + ".")
    if higher:
        nxt = sorted((r for r in rows if r["offered_rps"] == higher[0]), key=lambda r: r["p99_ms"])
        if nxt:
            lines.append(f"At the next load ({higher[0]:g} requests/s), over budget or shed: " + "; ".join(
                f"{setting_label(r)}: p99 {r['p99_ms']:g} ms, {r['shed_503']} shed" for r in nxt)
                + (" (step 4 breaks the tie here)." if len(tied) > 1 else "."))
    unbatched = [r for r in rows if r["max_batch_size"] == 1 and within_budget(r, budget_ms)]
    if unbatched:
        top = max(unbatched, key=lambda r: r["offered_rps"])
        lines.append(f"Without batching (MAX_BATCH_SIZE 1) the budget held only up to "
                     f"{top['offered_rps']:g} requests/s offered.")
    return "\n".join(lines)


def _subtitle(rows) -> str:
    if not rows:
        return ""
    first = rows[0]
    return f"{first.get('model', '')} on {first.get('device', '')}, torch {first.get('torch_version', '')}"


def save_figures(csv_path, out_dir, budget_ms: float = 100.0) -> list[Path]:
    """Write frontier.png, batch_sizes.png (share of requests at the second-highest load)
    and p99_heatmap.png (every load) next to the CSV."""
    rows = load_rows(csv_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in (("frontier.png", plot_frontier(rows, budget_ms=budget_ms)),
                      ("batch_sizes.png", plot_batch_size_distribution(rows, share="requests")),
                      ("p99_heatmap.png", plot_p99_heatmaps(rows, budget_ms=budget_ms))):
        path = out_dir / name
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m loadtests.plots SWEEP_CSV [OUT_DIR]")
    source = Path(sys.argv[1])
    for written_path in save_figures(source, Path(sys.argv[2]) if len(sys.argv) > 2 else source.parent):
        print(written_path)
