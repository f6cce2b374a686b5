"""The load tests themselves: real locust (a subprocess) against a real server process.

Each scenario of ``loadtests/`` runs headless for a few seconds with no
failures and leaves the server with the models it had; the quick sweep writes
its CSV, shows batching happens, resumes, and its plots render.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, Server, running_server

from mmserver.harness.testing import free_port

if str(ROOT) not in sys.path:  # loadtests/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.slow

SCENARIOS = ["SteadyUser", "OpenLoopUser", "ManyModelsUser", "ChurnUser", "SpikeUser",
             "OverloadUser", "SentencesUser"]


@pytest.fixture(scope="module")
def examples(tmp_path_factory) -> Path:
    """The example models the scenarios load, in a model root of their own."""
    from mmserver.harness.examples import write_examples

    root = tmp_path_factory.mktemp("examples")
    write_examples(root, names=["resnet18", "tabular"])
    return root


@pytest.fixture(scope="module")
def scenario_server(examples) -> Server:
    # tabular-7 is loaded before the test: the many-models scenario must use it, must not
    # unload it at the end, and its churn must leave it alone (it is not the run's own).
    with running_server(["--model-root", str(examples), "--no-access-log",
                         "--preload", f"tabular-7={examples / 'tabular' / 'model'}",
                         "--preload", f"unrelated={examples / 'tabular' / 'model'}"]) as server:
        yield server


def loaded(server: Server) -> list[str]:
    status, body = server.json("GET", "/models?limit=1000")
    assert status == 200
    return sorted(m["modelName"] for m in body["models"])


def run_locust(server: Server, examples: Path, tmp_path: Path, *args: str,
               env: dict | None = None, timeout: float = 120) -> tuple[dict, str]:
    """``locust -f loadtests --headless ...``; returns ({request name: stats}, output)."""
    prefix = tmp_path / "locust"
    command = [sys.executable, "-m", "locust", "-f", "loadtests", "--headless",
               "--host", server.url, "--only-summary",
               "--csv", str(prefix), "--json-file", str(prefix),
               "--mm-examples-dir", str(examples), *args]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})})
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"locust exited {result.returncode}:\n{output[-6000:]}"
    stats = {e["name"]: e for e in json.loads(Path(f"{prefix}.json").read_text())}
    return stats, output


def failures(stats: dict) -> int:
    return sum(e["num_failures"] for e in stats.values())


# -- discovery ---------------------------------------------------------------------------


@pytest.mark.parametrize("directory", ["repository", "elsewhere"])
def test_every_scenario_is_listed(directory, tmp_path):
    # From elsewhere, only loadtests/_repo_path.py makes ``loadtests`` importable.
    cwd = ROOT if directory == "repository" else tmp_path
    result = subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "loadtests"),
                             "--list"], cwd=cwd, capture_output=True, text=True, timeout=60,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert result.returncode == 0, result.stderr
    listed = {line.strip() for line in result.stdout.splitlines()}
    assert set(SCENARIOS) <= listed


def test_web_ui_offers_every_user_class_and_the_spike_shape():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", "loadtests", "--class-picker",
         "--web-host", "127.0.0.1", "--web-port", str(port)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        import http.client
        import time

        deadline, page = time.monotonic() + 60, ""
        while time.monotonic() < deadline and not page:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/")
                page = connection.getresponse().read().decode()
            except OSError:
                time.sleep(0.3)
        start = page.index("templateArgs = ") + len("templateArgs = ")
        args, _ = json.JSONDecoder().raw_decode(page[start:])
        assert set(SCENARIOS) <= set(args["available_user_classes"])
        assert "SpikeShape" in args["available_shape_classes"]
        assert "mm_target_rps" in args["extra_options"]
    finally:
        process.terminate()
        process.wait(30)


# -- the scenarios ---------------------------------------------------------------------------


def test_steady(scenario_server, examples, tmp_path):
    before = loaded(scenario_server)
    stats, output = run_locust(scenario_server, examples, tmp_path, "-u", "3", "-r", "3",
                               "-t", "4s", "--mm-think-ms", "20", "SteadyUser")
    assert stats["invoke resnet18"]["num_requests"] > 0
    assert failures(stats) == 0
    assert "Shape test" not in output  # the spike's shape stays off unless SpikeUser is chosen
    assert loaded(scenario_server) == before
    # The --csv file the notebooks read holds the final stats, not those of a second before the end.
    with open(tmp_path / "locust_stats.csv", newline="") as f:
        written = {row["Name"]: int(row["Request Count"]) for row in csv.DictReader(f)}
    assert written["invoke resnet18"] == stats["invoke resnet18"]["num_requests"]


def test_sentences_of_both_lengths_are_answered_and_counted_apart(tmp_path_factory, tmp_path):
    from mmserver.harness.examples import write_examples

    root = tmp_path_factory.mktemp("text-examples")
    write_examples(root, names=["minilm"])
    with running_server(["--model-root", str(root), "--no-access-log"]) as server:
        stats, _ = run_locust(server, root, tmp_path, "-u", "4", "-r", "4", "-t", "5s",
                              "--mm-think-ms", "0", "--mm-long-fraction", "0.5",
                              "SentencesUser")
        assert stats["invoke minilm (short)"]["num_requests"] > 0
        assert stats["invoke minilm (long)"]["num_requests"] > 0
        assert failures(stats) == 0
        assert loaded(server) == []  # the scenario unloaded the model it loaded
        status, described = server.json("GET", "/models/minilm")
        assert status == 404, described


def test_open_loop_offers_its_rate(scenario_server, examples, tmp_path):
    before = loaded(scenario_server)
    stats, _ = run_locust(scenario_server, examples, tmp_path, "-u", "20", "-r", "20", "-t", "5s",
                          "--mm-model", "tabular", "--mm-target-rps", "40", "OpenLoopUser")
    entry = stats["invoke tabular"]
    assert failures(stats) == 0
    # Poisson arrivals at 40/s over ~5 s: far from the closed-loop rate of 20 users
    # without think time (hundreds per second), and far from nothing.
    assert 60 <= entry["num_requests"] <= 400
    assert loaded(scenario_server) == before


def test_many_models_with_churn_in_locust_multiprocess_mode(scenario_server, examples, tmp_path):
    before = loaded(scenario_server)
    stats, output = run_locust(
        scenario_server, examples, tmp_path, "--processes", "2", "-u", "6", "-r", "6", "-t", "5s",
        "--mm-models", "8", "--mm-think-ms", "10", "--mm-churn-interval", "0.3",
        "ManyModelsUser", "ChurnUser")
    assert stats["invoke tabular-*"]["num_requests"] > 0
    assert stats["churn: unload"]["num_requests"] > 0, output[-3000:]
    assert failures(stats) == 0
    assert loaded(scenario_server) == before  # tabular-7 (not the run's) is still there


def test_spike_shape_steps_up_and_down(scenario_server, examples, tmp_path):
    before = loaded(scenario_server)
    env = {"MMSERVER_SPIKE_BASE_S": "2", "MMSERVER_SPIKE_PEAK_S": "2", "MMSERVER_SPIKE_CYCLES": "1"}
    stats, output = run_locust(scenario_server, examples, tmp_path, "-u", "4", "--mm-think-ms", "20",
                               "SpikeUser", env=env)
    assert "Shape test updating to 1 users" in output
    assert "Shape test updating to 4 users" in output
    assert output.index("updating to 4 users") < output.rindex("updating to 1 users")
    assert stats["invoke resnet18"]["num_requests"] > 0
    assert failures(stats) == 0
    assert loaded(scenario_server) == before


def test_overload_sheds_with_503_counted_apart(examples, tmp_path):
    # A queue of 2 and one-row batches: 24 open-loop users at 150/s overflow it.
    with running_server(["--model-root", str(examples), "--no-access-log",
                         "--max-queue-size", "2", "--max-batch-size", "2"]) as server:
        before = loaded(server)
        stats, _ = run_locust(server, examples, tmp_path, "-u", "24", "-r", "24", "-t", "4s",
                              "--mm-target-rps", "150", "OverloadUser")
        assert stats["invoke resnet18"]["num_requests"] > 0
        assert stats["invoke resnet18 (shed 503)"]["num_requests"] > 0
        assert failures(stats) == 0
        assert loaded(server) == before


def test_only_a_full_queues_503_is_shed():
    """Every other 503 (an engine, a replica, a model loading again or stuck) is a failure."""
    from loadtests._names import SHED_TYPE, is_shed

    from mmserver import errors

    assert SHED_TYPE == errors.QueueFull.__name__
    assert errors.QueueFull.unavailable == errors.Unavailable.QUEUE_FULL
    assert is_shed(503, "QueueFull")
    for other in (errors.EngineUnavailable, errors.ReplicaUnavailable, errors.ModelStillLoading,
                  errors.ModelUnhealthy, errors.ShuttingDown):
        assert not is_shed(503, other.__name__)
    assert not is_shed(503, None) and not is_shed(500, "QueueFull")


# -- the sweep and its plots -----------------------------------------------------------------

EXPECTED_COLUMNS = {
    "policy", "max_batch_size", "max_wait_ms", "offered_rps", "users", "achieved_rps", "p50_ms",
    "p95_ms", "p99_ms", "failures", "shed_503", "mean_batch_size", "mean_queue_wait_ms",
    "mean_compute_ms", "duration_s", "model", "device", "torch_version", "cpu_count",
    "batch_size_hist",
}


@pytest.fixture(scope="module")
def quick_sweep(examples, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("sweep")
    result = subprocess.run([sys.executable, "-m", "loadtests.sweep", "--quick", "--out", str(out),
                             "--examples-dir", str(examples)],
                            cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    return out, result.stdout


def test_quick_sweep_writes_the_csv_and_batching_happens(quick_sweep):
    out, stdout = quick_sweep
    with open(out / "sweep.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert EXPECTED_COLUMNS <= set(reader.fieldnames)
        rows = list(reader)
    assert len(rows) == 4
    for row in rows:
        assert int(row["failures"]) == 0, row
        assert float(row["achieved_rps"]) > 0, row
        assert row["device"] and row["torch_version"], row
        assert (out / f"{row['locust_csv']}_stats.csv").exists()
        histogram = json.loads(row["batch_size_hist"])
        assert sum(histogram.values()) == int(row["batches"]) > 0
    batched = [r for r in rows if int(r["max_batch_size"]) > 1]
    busiest = max(batched, key=lambda r: float(r["offered_rps"]))
    assert float(busiest["mean_batch_size"]) > 1.0, busiest
    single = [r for r in rows if int(r["max_batch_size"]) == 1]
    assert all(float(r["mean_batch_size"]) == 1.0 for r in single)
    assert "[  4/4]" in stdout


def test_quick_sweep_resumes_without_repeating_points(quick_sweep, examples):
    out, _ = quick_sweep
    result = subprocess.run([sys.executable, "-m", "loadtests.sweep", "--quick", "--out", str(out),
                             "--examples-dir", str(examples), "--no-plots"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "4 already in" in result.stdout
    with open(out / "sweep.csv", newline="") as f:
        assert len(list(csv.DictReader(f))) == 4


def test_plots_render_from_the_sweep_csv(quick_sweep):
    from loadtests import plots

    out, _ = quick_sweep
    for name in ("frontier.png", "batch_sizes.png", "p99_heatmap.png"):
        assert (out / name).stat().st_size > 10_000
    rows = plots.load_rows(out / "sweep.csv")
    figures = [plots.plot_frontier(rows, budget_ms=100), plots.plot_batch_size_distribution(rows),
               plots.plot_p99_heatmap(rows)]
    for figure in figures:
        assert figure.get_suptitle()
        visible = [ax for ax in figure.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
        assert visible
        for ax in visible:
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title(), ax
    assert "(ms)" in figures[0].axes[0].get_ylabel()
    assert "requests/s" in figures[0].axes[0].get_xlabel()
    pick = plots.recommend(rows, budget_ms=10_000)
    assert pick is not None and pick["failures"] == 0 and pick["shed_503"] == 0


def test_a_server_is_saturated_from_inside_a_running_event_loop_without_wrk(tmp_path, monkeypatch):
    """Notebooks 04 and 07 saturate a server from a cell, inside the kernel's running event
    loop, and a learner's machine seldom has wrk: the aiohttp generator must run there too,
    and the server's own counts must give t_http and a capacity."""
    import asyncio
    import shutil

    from helpers import path_without

    from loadtests import costs, definitions
    from loadtests._payload import npy_row

    monkeypatch.setenv("PATH", path_without("wrk", tmp_path))
    assert shutil.which("wrk") is None
    folder = costs.write_noop_model(tmp_path / "models" / "noop")

    async def a_notebook_cell():
        return costs.saturate_models({"noop": folder}, npy_row((1, 3, 8, 8)), max_batch_size=4,
                                     window_s=1.0, connections=8, warmup_s=0.3, max_queue_size=8)

    run = asyncio.run(a_notebook_cell())["noop"]
    assert run["answered"] > 0 and run["shed"] == 0, run
    assert 0.5 < run["window_s"] < 5 and run["server_cpu_s"] > 0, run
    assert 1 <= run["mean_batch"] <= 4, run   # a no-op model may outrun 8 clients: no fill asked
    assert definitions.t_http_s(run["server_cpu_s"], run["answered"]) > 0
