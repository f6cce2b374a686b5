"""Notebook 07's sweep of batching settings: run it, read each point over its repeats, and set
the queueing model's prediction beside it.

The measuring is ``python -m loadtests.sweep`` (one fresh server per setting and repeat, open
loop from locust); each point's records come from :func:`loadtests.instruments.sweep_point` and
are merged over repeats by :func:`loadtests.instruments.over_repeats`, so this module only
groups, prints and plots what those instruments measured.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

if not __package__:  # locust -f loadtests imports each file on its own, from anywhere
    import _repo_path  # noqa: F401

from loadtests import definitions, instruments, plots, queueing
from loadtests.verdicts import setting_label

#: The records each point keeps, over its repeats.
QUANTITIES = ("p50", "p99", "throughput", "served share", "mean batch", "device time per request")


def sweep(out: Path, repo: Path, *, batch_sizes: Sequence[int], timer_batch_size: int, waits_ms: Sequence[float],
          loads: Sequence[float], repeats: int, duration_s: float, warmup_s: float) -> list[dict]:
    """``python -m loadtests.sweep`` on the resnet18 example: greedy at each of ``batch_sizes``,
    ``timer`` at ``timer_batch_size`` with each non-zero wait of ``waits_ms``, at each offered
    load, ``repeats`` fresh servers per setting. Its rows (``sweep.csv``); the raw files are
    removed once read."""
    command = [sys.executable, "-m", "loadtests.sweep", "--policies", "greedy,timer",
               "--batch-sizes", ",".join(map(str, batch_sizes)), "--timer-batch-sizes", str(timer_batch_size),
               "--waits-ms", ",".join(f"{w:g}" for w in waits_ms), "--loads", ",".join(f"{x:g}" for x in loads),
               "--repeats", str(repeats), "--duration", f"{duration_s:g}", "--warmup", f"{warmup_s:g}",
               "--out", str(out), "--no-plots"]
    started = time.perf_counter()
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    rows = plots.load_rows(out / "sweep.csv")
    shutil.rmtree(out)
    print(f"{len(rows)} runs in {time.perf_counter() - started:.0f} s")
    return rows


def points(rows: Sequence[Mapping]) -> list[dict]:
    """One point per setting and load: each of :data:`QUANTITIES` that every repeat recorded,
    over the repeats (median, lowest and highest), the requests shed over all repeats, and the
    median rate locust sent (below the offered load once its users all wait on answers)."""
    grouped: dict[tuple, list[Mapping]] = {}
    for row in rows:
        key = (row["policy"], row["max_batch_size"], row["effective_max_wait_ms"], row["offered_rps"])
        grouped.setdefault(key, []).append(row)
    merged = []
    for key in sorted(grouped):
        repeats = [instruments.sweep_point(row) for row in grouped[key]]
        point = {q: instruments.over_repeats([r[q] for r in repeats]) for q in QUANTITIES
                 if all(q in r for r in repeats)}
        point["shed"] = sum(int(row["shed_503"]) for row in grouped[key])
        point["sent"] = statistics.median(float(row["sent_rps"]) for row in grouped[key])
        merged.append(point)
    return merged


def predicted(point: Mapping, cost: queueing.BatchCost, t_http_s: Mapping[int, float]) -> queueing.Prediction:
    """The queueing model's view of ``point``'s setting and load (``loadtests/queueing.py``).
    ``t_http_s``: MAX_BATCH_SIZE -> t_http measured there; a point takes the one measured at its
    own size, or else at the largest size measured (the batched settings share per-call work)."""
    w = point["p99"].where
    size = w["max_batch_size"]
    t_http = t_http_s.get(size, t_http_s[max(t_http_s)])
    return queueing.predict(cost, t_http, size, w["offered_rps"],
                            max_wait_s=w["max_wait_ms"] / 1e3, policy=w["policy"])


def side(ratio: float, spread: tuple[float, float] | None = None) -> str:
    """Where a point's measured over predicted p99 lies: within the noise band of 1, or on which
    side of it (above 1 the model was optimistic). ``spread``: the ratio's range over the
    point's repeats; a median outside the band whose repeats reach into it is ``unsettled``:
    the repeats do not say on which side the model lies."""
    if definitions.agree(ratio, 1.0):
        return "within"
    if spread is not None and (spread[0] <= 1.0 <= spread[1]
                               or any(definitions.agree(r, 1.0) for r in spread)):
        return "unsettled"
    return "optimistic" if ratio > 1 else "pessimistic"


def _side_of(p: Mapping, model: queueing.Prediction) -> str:
    low, high = p["p99"].spread
    return side(p["p99"].value * 1e3 / model.p99_ms, (low * 1e3 / model.p99_ms, high * 1e3 / model.p99_ms))


def print_points(merged: Sequence[Mapping], cost: queueing.BatchCost, t_http_s: Mapping[int, float]) -> None:
    """The sweep's table: the client's view, the server's, and the model's p99 beside it, with
    measured over predicted where the model put the point below capacity and nothing was shed
    (a point it put below capacity that shed is a miss, :func:`model_misses`). Above the table,
    the model's capacity at each MAX_BATCH_SIZE swept, the line its "past capacity" means."""
    sizes = sorted({p["p99"].where["max_batch_size"] for p in merged})
    caps = {b: queueing.capacity(cost, t_http_s.get(b, t_http_s[max(t_http_s)]), b) for b in sizes}
    print("the queueing model's capacity, 1 / (t_http + t(b)/b) at b = MAX_BATCH_SIZE, with the t(b) it is fed "
          "(the measured t(1); from b = 2 the line through 2, 4, 8): "
          + ", ".join(f"{cap:.0f} requests/s at {b} (t({b}) = {cost(b) * 1e3:.1f} ms)" for b, cap in caps.items())
          + "; 'past capacity' below: the offered load is at or above it")
    print(f"{'setting':<18} {'offered':>7} {'sent':>5} {'served':>6} {'shed':>5} {'p50':>5} {'p99 (over repeats)':>19} "
          f"{'batch':>6} {'device/req':>10} | {'model p99':>9} {'measured/model':>14}")
    print(f"{'':<18} {'req/s':>7} {'req/s':>5} {'req/s':>6} {'(sum)':>5} {'ms':>5} {'ms':>19} {'rows':>6} {'ms':>10} | "
          f"{'ms':>9}")
    for p in merged:
        model = predicted(p, cost, t_http_s)
        low, high = p["p99"].spread
        ratio = p["p99"].value * 1e3 / model.p99_ms   # measured over predicted
        print(f"{setting_label(p['p99']):<18} {p['p99'].where['offered_rps']:>7g} {p['sent']:>5.0f} "
              f"{p['throughput'].value:>6.0f} "
              f"{p['shed']:>5} {p['p50'].value * 1e3:>5.0f} {p['p99'].value * 1e3:>7.0f} ({low * 1e3:.0f}–{high * 1e3:.0f})"
              f"{'':>3} {p['mean batch'].value:>6.2f} {p['device time per request'].value * 1e3:>10.2f} | "
              + (f"{'past capacity':>9}" if model.saturated else
                 f"{model.p99_ms:>9.0f} {'miss (shed)':>14}" if p["shed"] else
                 f"{model.p99_ms:>9.0f} {ratio:>14.2f} {_side_of(p, model)}"))


def model_errors(merged: Sequence[Mapping], cost: queueing.BatchCost,
                 t_http_s: Mapping[int, float]) -> dict[str, list[float]]:
    """Measured over predicted p99 at every point the model puts below capacity, by setting."""
    errors: dict[str, list[float]] = {}
    for p, model in _judged(merged, cost, t_http_s):
        errors.setdefault(setting_label(p["p99"]), []).append(p["p99"].value * 1e3 / model.p99_ms)
    return errors


def model_sides(merged: Sequence[Mapping], cost: queueing.BatchCost,
                t_http_s: Mapping[int, float]) -> dict[str, list[str]]:
    """:func:`side` of each ratio :func:`model_errors` gives, in its order, judged with the
    point's repeats (as the table prints it)."""
    sides: dict[str, list[str]] = {}
    for p, model in _judged(merged, cost, t_http_s):
        sides.setdefault(setting_label(p["p99"]), []).append(_side_of(p, model))
    return sides


def _judged(merged: Sequence[Mapping], cost: queueing.BatchCost, t_http_s: Mapping[int, float]):
    """Each point the model puts below capacity that shed nothing, with the model's prediction:
    the points whose measured p99 can be set over a predicted one."""
    for p in merged:
        model = predicted(p, cost, t_http_s)
        if not model.saturated and p["shed"] == 0:
            yield p, model


def model_misses(merged: Sequence[Mapping], cost: queueing.BatchCost,
                 t_http_s: Mapping[int, float]) -> list[Mapping]:
    """The points the model put below capacity that shed when measured: misses, which no
    measured-over-predicted ratio of :func:`model_errors` shows, since a point that shed has no
    p99 of its requests all served."""
    return [p for p in merged if not predicted(p, cost, t_http_s).saturated and p["shed"] > 0]


def plot_p99(merged: Sequence[Mapping], budget_s: float, title: str) -> None:
    """p99 (bars: lowest to highest repeat) against offered load, one line per setting; a
    point that shed is drawn hollow."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5))
    labels = sorted({setting_label(p["p99"]) for p in merged}, key=lambda s: (s.split()[0], int(s.split()[1]), s))
    for i, label in enumerate(labels):
        line = [p for p in merged if setting_label(p["p99"]) == label]
        x = [p["p99"].where["offered_rps"] for p in line]
        y = [p["p99"].value * 1e3 for p in line]
        err = [[(p["p99"].value - p["p99"].spread[0]) * 1e3 for p in line],
               [(p["p99"].spread[1] - p["p99"].value) * 1e3 for p in line]]
        ax.errorbar(x, y, yerr=err, color=f"C{i}", capsize=3, label=label)
        for xi, yi, p in zip(x, y, line):
            ax.plot(xi, yi, "o", color=f"C{i}", mfc="white" if p["shed"] else f"C{i}")
    ax.axhline(budget_s * 1e3, color="black", linestyle="--", label=f"p99 budget {budget_s * 1e3:.4g} ms")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s, open loop)")
    ax.set_ylabel("p99 latency (ms, log); bars: range over repeats")
    ax.set_title(title)
    ax.legend(fontsize=8, title="policy MAX_BATCH_SIZE / MAX_WAIT\n(hollow: shed)", title_fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))   # beside the axes: no line hidden under it
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    plt.show()
