"""Plots of a batching sweep (``sweep.csv`` from ``python -m loadtests.sweep``).

Each function takes the rows (``load_rows(path)``) and returns a matplotlib
``Figure`` (built without pyplot, so a notebook shows it once and a script
needs no display):

``plot_frontier``
    achieved throughput against p50 and p99 latency, one line per setting
    (policy, MAX_BATCH_SIZE, MAX_WAIT) through its offered loads: the
    latency/throughput frontier.
``plot_batch_size_distribution``
    how the server's batches were distributed over sizes at one offered load,
    one panel per setting (from the ``/metrics`` histogram buckets saved per
    point).
``plot_p99_heatmap``
    p99 latency over MAX_BATCH_SIZE x MAX_WAIT at one offered load, a panel
    per policy.

``recommend(rows, budget_ms)`` picks the setting that sustains the highest
offered load with p99 within the budget and nothing shed or failed.

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
                 "mean_batch_size", "mean_queue_wait_ms", "mean_compute_ms")


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
    return rows


def setting_label(row) -> str:
    return f"{row['policy']}, batch≤{row['max_batch_size']}, wait {row['max_wait_ms']:g} ms"


def _settings(rows):
    keys = sorted({(r["policy"], r["max_batch_size"], r["max_wait_ms"]) for r in rows})
    return [[r for r in rows if (r["policy"], r["max_batch_size"], r["max_wait_ms"]) == k]
            for k in keys]


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


def recommend(rows, budget_ms: float = 100.0):
    """The point with the highest offered load kept within the p99 budget (ties: lowest p99)."""
    good = [r for r in rows if within_budget(r, budget_ms)]
    if not good:
        return None
    return max(good, key=lambda r: (r["offered_rps"], -r["p99_ms"], r["achieved_rps"]))


def _figure(width, height):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def plot_frontier(rows, percentiles=("p50_ms", "p99_ms"), budget_ms: float | None = None):
    """Throughput (x) against latency (y, log) per setting; one panel per percentile."""
    import matplotlib

    fig = _figure(6.0 * len(percentiles) + 2.5, 5.0)
    axes = fig.subplots(1, len(percentiles), sharey=True, squeeze=False)[0]
    groups = _settings(rows)
    colors = matplotlib.colormaps["viridis"]
    sizes = sorted({r["max_batch_size"] for r in rows})
    waits = sorted({r["max_wait_ms"] for r in rows})
    styles = ["-", "--", ":", "-."]
    for ax, column in zip(axes, percentiles):
        for group in groups:
            group = sorted(group, key=lambda r: r["offered_rps"])
            first = group[0]
            color = colors(sizes.index(first["max_batch_size"]) / max(1, len(sizes) - 1) * 0.9)
            ax.plot([r["achieved_rps"] for r in group], [r[column] for r in group],
                    marker="o" if first["policy"] == "greedy" else "s",
                    linestyle=styles[waits.index(first["max_wait_ms"]) % len(styles)],
                    color=color, label=setting_label(first))
        if budget_ms and column == "p99_ms":
            ax.axhline(budget_ms, color="red", linewidth=0.8, linestyle="--",
                       label=f"p99 budget ({budget_ms:g} ms)")
        ax.set_yscale("log")
        ax.set_xlabel("achieved throughput (requests/s)")
        ax.set_ylabel(f"{column.removesuffix('_ms')} latency (ms)")
        ax.set_title(f"Throughput vs {column.removesuffix('_ms')} latency")
        ax.grid(True, which="both", alpha=0.3)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small",
                    title="setting (a marker per offered load)")
    fig.suptitle(_subtitle(rows))
    return fig


def _bucket_labels(hist: dict) -> list[tuple[str, int]]:
    """Prometheus upper bounds -> ranges: 1, 2, 3-4, 5-8, ..."""
    out, previous = [], 0
    for bound, count in sorted(((k, v) for k, v in hist.items() if k != "+Inf"),
                               key=lambda kv: float(kv[0])):
        upper = int(float(bound))
        label = str(upper) if upper == previous + 1 else f"{previous + 1}-{upper}"
        out.append((label, count))
        previous = upper
    if hist.get("+Inf"):
        out.append((f">{previous}", hist["+Inf"]))
    return out


def plot_batch_size_distribution(rows, offered_rps: float | None = None):
    """Share of batches per size range at one offered load, one panel per setting."""
    load = _nearest_load(rows, offered_rps)
    points = sorted((r for r in rows if r["offered_rps"] == load),
                    key=lambda r: (r["policy"], r["max_batch_size"], r["max_wait_ms"]))
    columns = min(4, max(1, len(points)))
    lines = max(1, math.ceil(len(points) / columns))
    fig = _figure(3.4 * columns, 2.6 * lines + 0.6)
    axes = fig.subplots(lines, columns, squeeze=False, sharey=True)
    for ax in axes.flat[len(points):]:
        ax.set_visible(False)
    for ax, row in zip(axes.flat, points):
        buckets = [(label, count) for label, count in _bucket_labels(row["batch_size_hist"])
                   if float(label.split("-")[0].lstrip(">")) <= max(row["max_batch_size"], 1)]
        total = sum(count for _, count in buckets) or 1
        ax.bar([label for label, _ in buckets], [count / total for _, count in buckets],
               color="tab:blue")
        ax.set_title(f"{setting_label(row)}\nmean {row['mean_batch_size']:.2f} rows", fontsize="small")
        ax.set_xlabel("batch size (rows)")
        ax.set_ylabel("share of batches")
        ax.tick_params(axis="x", labelsize="small")
        ax.set_ylim(0, 1)
    fig.suptitle(f"Batch sizes the server formed at {load:g} requests/s offered — {_subtitle(rows)}")
    return fig


def plot_p99_heatmap(rows, offered_rps: float | None = None, column: str = "p99_ms"):
    """``column`` (p99 by default) over MAX_BATCH_SIZE x MAX_WAIT at one load, per policy."""
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


def _subtitle(rows) -> str:
    if not rows:
        return ""
    first = rows[0]
    return f"{first.get('model', '')} on {first.get('device', '')}, torch {first.get('torch_version', '')}"


def save_figures(csv_path, out_dir, budget_ms: float = 100.0) -> list[Path]:
    """Write frontier.png, batch_sizes.png and p99_heatmap.png next to the CSV."""
    rows = load_rows(csv_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in (("frontier.png", plot_frontier(rows, budget_ms=budget_ms)),
                      ("batch_sizes.png", plot_batch_size_distribution(rows)),
                      ("p99_heatmap.png", plot_p99_heatmap(rows))):
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
