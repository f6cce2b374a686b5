"""The test bench of notebooks 02 and 03: stand-in models, inputs, and how a run is shown.

The notebooks drive the book's runner (``book_runner``) and mmserver's with simulated
clients; what is measured goes through ``loadtests.instruments`` (``scripted_clients`` and
its readers) and is judged by ``loadtests.verdicts``. What lives here is the machinery around
it that is no step of the story: a model whose cost is chosen and that logs its calls, inputs
that say whose they are, the table and the plot of a timeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import matplotlib.pyplot as plt
import torch


class PretendStyleTransfer:
    """Mirrors each image left to right, taking ``compute_s`` per call (a sleep, as a busy GPU
    keeps the worker thread waiting), and logs every call in ``calls``: (start, end, client
    numbers) on ``time.monotonic``, the clock the event loop's ``loop.time()`` reads."""

    def __init__(self, compute_s: float):
        self.compute_s = compute_s
        self.calls: list[tuple[float, float, list[int]]] = []

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        started = time.monotonic()
        time.sleep(self.compute_s)
        clients = [round(value) for value in batch[:, 0, 0, 0].tolist()]
        self.calls.append((started, time.monotonic(), clients))
        return batch.flip(-1)


def image_of(client: int, shape=(3, 8, 8)) -> torch.Tensor:
    """Pixel values client + 0.0, 0.1, ..., 0.7 across each row, so a mirror image differs and
    every pixel's integer part names the client."""
    return (client + torch.arange(shape[-1]) / 10).expand(shape).clone()


def is_mirror_of(client: int, output: torch.Tensor) -> bool:
    """Whether ``output`` is the client's own image, mirrored."""
    return torch.equal(output, image_of(client, tuple(output.shape)).flip(-1))


def print_timeline(timeline) -> None:
    """One line per client of an ``instruments.Timeline``: arrival, launch, queue wait, answer."""
    print(f"{'client':>6} {'arrived':>8} {'launched':>9} {'waited':>7} {'done':>6} {'answer':>7} {'batch':>6}")
    for r in timeline.requests:
        if r.status == 200:
            print(f"{r.client:>6} {r.arrived:>7.2f}s {r.launched:>8.2f}s {r.launched - r.arrived:>6.2f}s "
                  f"{r.done:>5.2f}s {r.status:>7} {r.batch:>6}")
        else:
            print(f"{r.client:>6} {r.arrived:>7.2f}s {'':>9} {'':>7} {'':>6} {r.status:>7} {'':>6}")


def plot_timeline(timeline, max_batch_size: int, title: str) -> None:
    """One row per client: arrival (dot), queue (dotted), its batch in the model (a bar, one
    colour per batch), answer (tick), refusal (red cross); a vertical line per launch, solid
    for a full batch, dashed for one the MAX_WAIT timer started."""
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for r in timeline.requests:
        y = r.client
        if r.status != 200:
            ax.scatter(r.arrived, y, marker="x", s=70, color="red", zorder=3, label="refused: 503 too busy")
            continue
        ax.plot([r.arrived, r.launched], [y, y], linestyle=":", color="grey", label="waiting in the queue")
        ax.barh(y, r.finished - r.launched, left=r.launched, height=0.5, color=colours(r.batch % 10), alpha=0.8)
        ax.scatter(r.arrived, y, color="black", s=20, zorder=3, label="arrival")
        ax.scatter(r.done, y, marker="|", s=150, color="black", zorder=3, label="answer")
    for number, (launched, _, clients) in enumerate(timeline.calls):
        full = len(clients) == max_batch_size
        ax.axvline(launched, color=colours(number % 10), alpha=0.6, linestyle="-" if full else "--",
                   label="launch: full batch" if full else "launch: MAX_WAIT timer")
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax.legend(unique.values(), unique.keys(), loc="lower left", fontsize=8)
    ax.set_yticks([r.client for r in timeline.requests])
    ax.invert_yaxis()
    ax.set_xlabel("time since the start (s)")
    ax.set_ylabel("client (request)")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    plt.show()


# -- notebook 03: the book's runner and mmserver's, side by side ---------------------------------


class ToyModel:
    """Doubles its input after ``compute_s``, counts the rows it computes, refuses NaN (any model
    error: a malformed input, a bug, a CUDA error)."""

    def __init__(self, compute_s: float):
        self.compute_s = compute_s
        self.rows_seen = 0

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        time.sleep(self.compute_s)
        self.rows_seen += batch.shape[0]
        if torch.isnan(batch).any():
            raise ValueError("the model cannot handle NaN inputs")
        return batch * 2


class FixedPlusPerRowModel:
    """Sleeps ``per_call_s + per_row_s × rows`` per call and returns its input: a known cost line."""

    def __init__(self, per_call_s: float, per_row_s: float):
        self.per_call_s, self.per_row_s = per_call_s, per_row_s

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        time.sleep(self.per_call_s + self.per_row_s * batch.shape[0])
        return batch


def item(value: float, size: int) -> torch.Tensor:
    """One input as the book takes it: no batch dimension."""
    return torch.full((size,), value)


@contextlib.asynccontextmanager
async def book_server(model, **settings):
    """The book's runner as a background task (as the book's ``app.add_task`` starts it);
    yields (submit, runner, task)."""
    import book_runner

    runner = book_runner.ModelRunner(model, **settings)
    task = asyncio.create_task(runner.model_runner())
    await asyncio.sleep(0)  # let model_runner make its lock and event before the first request
    try:
        yield runner.process_input, runner, task
    finally:
        task.cancel()


@contextlib.asynccontextmanager
async def fixed_server(model, **settings):
    """mmserver's runner on the CPU; yields (submit, runner). Each request is one row (``x[None]``)."""
    from mmserver.batching import BatchSettings, ModelRunner

    async with ModelRunner(model, BatchSettings(**settings), device="cpu", name="toy") as runner:
        yield (lambda x: runner.submit(x[None])), runner


async def ask(request, give_up_seconds: float) -> str:
    """One client awaiting one request; what it got, in words: ``answered``, ``too busy`` (the
    503), ``model error`` or ``gave up`` (after ``give_up_seconds``)."""
    import book_runner
    from mmserver.batching import ModelError, QueueFull

    try:
        await asyncio.wait_for(request, give_up_seconds)
    except TimeoutError:
        return "gave up"
    except (book_runner.HandlingError, QueueFull):
        return "too busy"
    except ModelError:
        return "model error"
    return "answered"


def compare(book: dict, fixed: dict) -> None:
    """Print what each client got from the book's runner and from mmserver's."""
    print(f"{'client':<20}{'book runner':<14}{'mmserver':<14}")
    for client in book:
        print(f"{client:<20}{book[client]:<14}{fixed[client]:<14}")


def policy_runners(model_factory, policies, **settings) -> dict:
    """One unstarted mmserver runner per policy, each with its own model from ``model_factory``."""
    from mmserver.batching import BatchSettings, ModelRunner

    return {p: ModelRunner(model_factory(), BatchSettings(policy=p, **settings), device="cpu", name=p)
            for p in policies}


def sweep_point(run) -> dict:
    """What the sweep's table and plot show of one ``instruments.OpenLoopRun``, each read by its
    instrument: p50 and p99 latency, device time per request (with mean batch, busy fraction,
    served rate and queue wait in its context), and the backlog's growth through the run."""
    from loadtests import instruments

    return {"p50": instruments.open_loop_latency(run, 50), "p99": instruments.open_loop_latency(run, 99),
            "device": instruments.open_loop_device_time(run), "backlog": instruments.backlog_growth(run),
            "run": run}


def print_sweep(sweep: dict, rates) -> None:
    """The sweep's table: one line per rate and policy."""
    from loadtests.instruments import signed

    print(f"{'rate':>5} {'policy':>7} {'requests':>9} {'offered/s':>10} {'served/s':>9} {'batch':>6} "
          f"{'queue wait':>11} {'p50':>8} {'p99':>8} {'device/request':>15} {'busy':>5} {'backlog growth':>15}")
    for index, rate in enumerate(rates):
        for policy, points in sweep.items():
            point = points[index]
            run, seen = point["run"], point["device"].observed
            growth = signed(f"{round(point['backlog'].value * 1e3, 1) + 0.0:.1f}")   # never −0.0
            print(f"{rate:>5} {policy:>7} {run.answered:>9} {run.offered_rps:>10.0f} {seen['served_rps']:>9.0f} "
                  f"{seen['mean_batch']:>6.2f} {seen['queue_wait_s'] * 1e3:>8.1f} ms "
                  f"{point['p50'].value * 1e3:>5.1f} ms {point['p99'].value * 1e3:>5.1f} ms "
                  f"{point['device'].value * 1e3:>12.2f} ms {seen['busy']:>5.0%} "
                  f"{growth:>12} ms")


def plot_sweep(sweep: dict, rates, max_batch_size: int, max_wait_s: float, title: str) -> None:
    """Four panels against the arrival rate: mean batch, p50 and p99, device time per request,
    busy fraction; one colour per policy, grey references at MAX_BATCH_SIZE, MAX_WAIT and 100 %."""
    from matplotlib.lines import Line2D

    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    colours = {"timer": "tab:orange", "greedy": "tab:blue"}
    for policy, points in sweep.items():
        colour = colours.get(policy)
        axes[0].plot(rates, [p["device"].observed["mean_batch"] for p in points], marker="o", color=colour)
        axes[1].plot(rates, [p["p50"].value * 1e3 for p in points], marker="o", color=colour)
        axes[1].plot(rates, [p["p99"].value * 1e3 for p in points], marker="^", linestyle="--", color=colour)
        axes[2].plot(rates, [p["device"].value * 1e3 for p in points], marker="o", color=colour)
        axes[3].plot(rates, [100 * p["device"].observed["busy"] for p in points], marker="o", color=colour)
    references = {0: (max_batch_size, "MAX_BATCH_SIZE"), 1: (max_wait_s * 1e3, "MAX_WAIT"), 3: (100, "always busy")}
    titles = [("mean batch (rows per model call)", "Batch size formed"),
              ("latency (ms)", "Latency: p50 (solid), p99 (dashed)"),
              ("device time per request (ms)", "Device time per request"),
              ("busy fraction (% of the run)", "Device busy")]
    for index, (ax, (ylabel, panel)) in enumerate(zip(axes, titles)):
        top = max(max(line.get_ydata()) for line in ax.get_lines())
        if index in references:
            value, label = references[index]
            ax.axhline(value, color="grey", linestyle=":", linewidth=1)
            ax.annotate(label, (0.02 * max(rates), value), xytext=(0, 3), textcoords="offset points",
                        fontsize=8, color="grey")
            top = max(top, value)
        ax.set_ylim(0, 1.15 * top)
        ax.set_xlim(0, 1.05 * max(rates))
        ax.set(xlabel="arrival rate (requests/s)", ylabel=ylabel, title=panel)
        ax.grid(True, alpha=0.3)
    fig.legend([Line2D([], [], color=colours.get(p), marker="o") for p in sweep], list(sweep),
               loc="lower center", ncol=len(sweep), fontsize=9, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    plt.show()
