"""mmserver.harness.testing: the harness the tests, the sweep, the benchmarks and notebooks share."""

from __future__ import annotations

import math
import socket
import subprocess
import sys

import pytest

from mmserver.harness.testing import (
    ServerProcess,
    free_port,
    histogram,
    parse_metrics,
    sample_value,
    wait_for_ping,
)

EXPOSITION = """\
# HELP mmserver_requests_total Invocations answered, by HTTP status.
# TYPE mmserver_requests_total counter
mmserver_requests_total{model="a",status="200"} 5.0
mmserver_requests_total{model="a",status="503"} 2.0
mmserver_requests_total{model="b",status="200"} 7.0
# HELP mmserver_batch_size_rows Rows per model call.
# TYPE mmserver_batch_size_rows histogram
mmserver_batch_size_rows_bucket{le="1.0",model="a"} 1.0
mmserver_batch_size_rows_bucket{le="2.0",model="a"} 3.0
mmserver_batch_size_rows_bucket{le="+Inf",model="a"} 4.0
mmserver_batch_size_rows_sum{model="a"} 9.0
mmserver_batch_size_rows_count{model="a"} 4.0
# HELP mmserver_models_loaded Models loaded now.
# TYPE mmserver_models_loaded gauge
mmserver_models_loaded 2.0
"""


def test_families_are_keyed_by_family_name():
    families = parse_metrics(EXPOSITION)
    assert set(families) == {"mmserver_requests", "mmserver_batch_size_rows",
                             "mmserver_models_loaded"}


def test_sample_value_picks_one_sample_or_adds_over_the_labels_left_out():
    families = parse_metrics(EXPOSITION)
    assert sample_value(families, "mmserver_requests_total", model="a", status="200") == 5.0
    assert sample_value(families, "mmserver_requests_total", status="200") == 12.0
    assert sample_value(families, "mmserver_models_loaded") == 2.0
    assert sample_value(families, "mmserver_requests_total", model="nobody") == 0.0
    assert sample_value(families, "no_such_metric") == 0.0


def test_histogram_gives_cumulative_buckets_sum_and_count():
    families = parse_metrics(EXPOSITION)
    assert histogram(families, "mmserver_batch_size_rows", model="a") == (
        {1.0: 1.0, 2.0: 3.0, math.inf: 4.0}, 9.0, 4.0)
    assert histogram(families, "mmserver_batch_size_rows", model="b") == ({}, 0.0, 0.0)


def test_free_port_can_be_bound():
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))


def test_wait_for_ping_says_when_the_process_exited_and_what_it_printed():
    process = subprocess.Popen([sys.executable, "-c", "print('no model root'); exit(3)"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with pytest.raises(RuntimeError, match=r"exited with 3(.|\n)*no model root"):
        wait_for_ping(f"http://127.0.0.1:{free_port()}", timeout=30, process=process)


def test_wait_for_ping_times_out_with_the_log():
    with pytest.raises(TimeoutError, match="the log says this"):
        wait_for_ping(f"http://127.0.0.1:{free_port()}", timeout=0.3,
                      log=lambda: "the log says this")


def test_a_server_that_cannot_start_raises_with_its_log(tmp_path):
    server = ServerProcess(["--preload", "x=missing", "--model-root", str(tmp_path)],
                           log_path=tmp_path / "server.log")
    with pytest.raises(RuntimeError, match="exited"):
        server.start(timeout=60)
    assert server.process.returncode != 0
    assert "missing" in server.log()


def test_a_server_process_serves_and_stops_on_sigterm(tmp_path):
    with ServerProcess(["--model-root", str(tmp_path), "--no-access-log"]) as server:
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert server.json("GET", "/ping") == (200, {"status": "Healthy"})
        assert server.metric("mmserver_models_loaded") == 0.0
    assert server.process.returncode == 0
