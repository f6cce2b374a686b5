"""The simulated GPU: t(b) from NVIDIA's figures, no CPU held, one call at a time, copies,
exact statistics, its label, and its model folder served by a real server."""

from __future__ import annotations

import concurrent.futures
import io
import itertools
import json
import sys
import threading
import time

import numpy as np
import pytest
import torch
from conftest import ROOT, running_server

from mmserver.harness.simulated_device import (
    DEFAULT_FIGURE,
    PCIE3_X16_BYTES_PER_SECOND,
    PER_THREAD,
    PUBLISHED_BATCH_SIZES,
    RESNET50,
    SETTINGS_FILE,
    LinearBatchTime,
    PublishedBatchTime,
    SimulatedDevice,
    write_model_folder,
)

if str(ROOT) not in sys.path:  # loadtests/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

_streams = itertools.count()


def device(batch_seconds, **options) -> SimulatedDevice:
    """A device on a stream of its own, so no other test's device shares its lock."""
    return SimulatedDevice(batch_seconds, stream=f"test-{next(_streams)}", **options)


def expected(rows: list[list[float]]) -> list[list[float]]:
    return [[sum(row), sum((j + 1) * x for j, x in enumerate(row))] for row in rows]


def call_together(fn, threads: int) -> list[float]:
    """Run ``fn`` in ``threads`` threads released at once; each one's return time."""
    start = threading.Barrier(threads)
    finished = [0.0] * threads

    def one(i):
        start.wait()
        fn()
        finished[i] = time.perf_counter()

    workers = [threading.Thread(target=one, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return finished


# -- t(b) ----------------------------------------------------------------------------------------


def test_t_b_is_the_published_figure_between_and_past_the_published_sizes():
    for figure, numbers in RESNET50.items():
        t = PublishedBatchTime(figure)
        for b, ms in zip(PUBLISHED_BATCH_SIZES, numbers["latency_ms"]):
            assert t(b) == ms / 1e3, (figure, b)
    fp32 = RESNET50["V100 16GB, FP32"]["latency_ms"]
    t = PublishedBatchTime("V100 16GB, FP32")
    assert t(3) == pytest.approx((fp32[1] + fp32[2]) / 2 / 1e3)
    assert t(48) == pytest.approx((fp32[5] + fp32[6]) / 2 / 1e3)
    assert t(512) == pytest.approx((fp32[8] + 2 * (fp32[8] - fp32[7])) / 1e3)  # the last slope
    assert t(0) == 0.0
    assert SimulatedDevice().batch_seconds == PublishedBatchTime(DEFAULT_FIGURE)
    assert device("T4, FP32", time_scale=0.1).compute_seconds(8) == pytest.approx(0.002241)
    with pytest.raises(ValueError, match="no published figure"):
        SimulatedDevice("A100")


def test_the_figures_are_kept_once_and_loadtests_reads_them():
    from loadtests import published

    assert published.RESNET50 is RESNET50
    assert published.BATCH_SIZES is PUBLISHED_BATCH_SIZES


def test_an_explicit_t_b():
    flat = device(LinearBatchTime(0.002))
    assert flat.compute_seconds(32) == flat.compute_seconds(1) == 0.002
    assert device(LinearBatchTime(0.001, 0.0005)).compute_seconds(4) == pytest.approx(0.003)
    assert device(lambda b: b * 1e-3, time_scale=0.5).compute_seconds(10) == pytest.approx(0.005)
    with pytest.raises(ValueError):
        LinearBatchTime(-1.0)


# -- how it runs --------------------------------------------------------------------------------


def test_it_holds_no_cpu_while_it_computes():
    gpu = device(LinearBatchTime(0.05))
    rows = torch.ones(4, 8)
    device(LinearBatchTime(0.0))(rows)  # the first torch calls of the process warm up here
    wall, cpu = time.perf_counter(), time.process_time()
    call_together(lambda: gpu(rows), threads=2)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert 0.1 <= wall < 0.3  # one stream: the sum of the two calls
    assert cpu < 0.2 * wall, (cpu, wall)
    assert gpu.stats().queued_seconds >= 0.04  # one of them waited for the other


def test_one_call_at_a_time():
    gpu = device(LinearBatchTime(0.02))
    started = time.perf_counter()
    finished = call_together(lambda: gpu(torch.ones(1, 8)), threads=6)
    assert max(finished) - started >= 6 * 0.02
    assert gpu.stats().max_concurrent_calls == 1
    assert gpu.stats().calls == 6


def test_a_call_sleeps_once_to_its_end_with_a_fine_timer_slack(monkeypatch):
    """Each sleep may wake late by the thread's timer slack (50 us by Linux's default), so a
    call sleeps once, to its end, and its thread asks for a slack of 1 us, as a thread that the
    driver wakes at a kernel's end would see. A sleep per copy made a 1.5 ms call 0.1 ms long."""
    from mmserver.harness import simulated_device

    deadlines: list[float] = []
    sleep_until = simulated_device._sleep_until
    monkeypatch.setattr(simulated_device, "_sleep_until",
                        lambda deadline: deadlines.append(deadline) or sleep_until(deadline))
    gpu = device(LinearBatchTime(0.001, 0.0005))
    slack: list[int] = []

    def call() -> None:
        gpu(torch.ones(4, 8))
        if sys.platform.startswith("linux"):
            import ctypes
            slack.append(ctypes.CDLL(None).prctl(30, 0, 0, 0, 0))  # PR_GET_TIMERSLACK

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert len(deadlines) == 1
    assert gpu.stats().busy_seconds == pytest.approx(0.003 + (4 * 8 * 4 + 4 * 2 * 4)
                                                    / PCIE3_X16_BYTES_PER_SECOND, rel=1e-12)
    if sys.platform.startswith("linux"):
        assert slack == [simulated_device.TIMER_SLACK_NS]


def test_a_per_thread_device_gives_each_calling_thread_a_stream_of_its_own():
    gpu = SimulatedDevice(LinearBatchTime(0.05), stream=PER_THREAD)
    started = time.perf_counter()
    wall = max(call_together(lambda: gpu(torch.ones(1, 8)), threads=3)) - started
    assert 0.05 <= wall < 0.1  # the three calls overlapped: one call's time, not three
    assert gpu.stats().max_concurrent_calls == 3
    assert gpu.stats().calls == 3


def test_devices_of_one_stream_take_turns_and_of_two_streams_do_not():
    one, same = SimulatedDevice(LinearBatchTime(0.03), stream="shared-test"), \
        SimulatedDevice(LinearBatchTime(0.03), stream="shared-test")
    other = device(LinearBatchTime(0.03))
    for a, b, at_least, below in ((one, same, 0.06, None), (one, other, 0.03, 0.06)):
        calls = iter((a, b))
        lock = threading.Lock()

        def call():
            with lock:
                gpu = next(calls)
            gpu(torch.ones(1, 2))

        started = time.perf_counter()
        wall = max(call_together(call, threads=2)) - started
        assert wall >= at_least
        if below is not None:
            assert wall < below


def test_copies_take_bytes_over_the_host_link():
    assert PCIE3_X16_BYTES_PER_SECOND == pytest.approx(15.75e9, rel=1e-3)
    assert device(LinearBatchTime(0)).transfer_seconds(15_753_846_154) == pytest.approx(1.0)
    slow_link = 1e8  # 100 MB/s, so a 1 MB copy is 10 ms
    gpu = device(LinearBatchTime(0), host_link_bytes_per_second=slow_link)
    transfer = 0.0
    for numbers in (250_000, 1_000_000):  # 1 MB and 4 MB of float32 in one row
        before = time.perf_counter()
        gpu(torch.ones(1, numbers))
        wall = time.perf_counter() - before
        copy_seconds = (numbers * 4 + 2 * 4) / slow_link
        transfer += copy_seconds
        assert gpu.stats().transfer_seconds == pytest.approx(transfer, rel=1e-12)
        assert wall >= copy_seconds
    assert gpu.transfer_seconds(4_000_000) == pytest.approx(4 * gpu.transfer_seconds(1_000_000))
    halved = device(LinearBatchTime(0), host_link_bytes_per_second=slow_link, time_scale=0.5)
    assert halved.transfer_seconds(1_000_000) == pytest.approx(0.005)


def test_statistics_are_exact():
    link = 1e9
    gpu = device(LinearBatchTime(0.001, 0.0005), time_scale=0.5, host_link_bytes_per_second=link)
    sizes = (1, 3, 8)
    for b in sizes:
        gpu(torch.ones(b, 4))
    stats = gpu.stats()
    assert (stats.calls, stats.rows) == (3, 12)
    assert (stats.bytes_in, stats.bytes_out) == (12 * 4 * 4, 12 * 2 * 4)
    assert stats.compute_seconds == pytest.approx(sum(0.5 * (0.001 + 0.0005 * b) for b in sizes),
                                                  rel=1e-12)
    assert stats.transfer_seconds == pytest.approx(0.5 * 12 * (16 + 8) / link, rel=1e-12)
    assert stats.busy_seconds == stats.compute_seconds + stats.transfer_seconds
    assert stats.max_concurrent_calls == 1
    gpu.reset_stats()
    assert gpu.stats().calls == gpu.stats().rows == 0 and gpu.stats().busy_seconds == 0


def test_the_answer_is_a_new_tensor_of_its_own_rows():
    gpu = device(LinearBatchTime(0), input_features=3)
    rows = [[1.0, 2.0, 3.0], [4.0, -5.0, 6.0], [0.0, 0.0, 7.0]]
    data = torch.tensor(rows)
    answer = gpu(data)
    assert answer.tolist() == expected(rows)
    assert answer.untyped_storage().data_ptr() != data.untyped_storage().data_ptr()
    assert data.tolist() == rows
    assert gpu(torch.arange(6).reshape(2, 1, 3)).tolist() == expected([[0, 1, 2], [3, 4, 5]])
    with pytest.raises(ValueError, match="rows of 3 numbers"):
        gpu(torch.ones(2, 4))
    with pytest.raises(ValueError, match="tensor of rows"):
        gpu(torch.ones(3))


def test_the_answer_stays_on_the_device_the_rows_came_on():
    """The server moves a batch to CUDA when it has one; the answer must be made there too.
    ``meta`` stands in for a device other than the CPU on a machine without one."""
    rows = torch.ones(4, 3, device="meta")
    answer = device(LinearBatchTime(0), input_features=3)(rows)
    assert answer.device == rows.device and tuple(answer.shape) == (4, 2)


def test_it_says_it_is_simulated():
    gpu = SimulatedDevice()
    assert gpu.label == ("simulated NVIDIA V100 16GB, FP32 (published ResNet-50 v1.5 t(b)), "
                         "not a real GPU")
    for text in (gpu.label, repr(gpu), device(LinearBatchTime(0.002), time_scale=0.1).label,
                 device(lambda b: 0.0).label):
        assert "simulated" in text and "not a real GPU" in text
    assert "every time ×0.1" in device("T4, FP32", time_scale=0.1).label
    assert list(gpu.parameters()) == [] and gpu.to("cpu").eval() is gpu


# -- the model folder ---------------------------------------------------------------------------


def test_the_model_folder_holds_its_parameters(tmp_path):
    folder = write_model_folder(tmp_path / "sim", figure="T4, FP32", time_scale=0.01,
                                input_features=8)
    settings = json.loads((folder / SETTINGS_FILE).read_text())
    assert settings == {"figure": "T4, FP32", "time_scale": 0.01, "input_features": 8,
                        "stream": "default"}
    assert "MMSERVER_ROW_WISE = True" in (folder / "code" / "inference.py").read_text()
    gpu = SimulatedDevice.from_file(folder / SETTINGS_FILE)
    assert (gpu.batch_seconds, gpu.time_scale, gpu.input_features) == (
        PublishedBatchTime("T4, FP32"), 0.01, 8)
    linear = write_model_folder(tmp_path / "linear", fixed_seconds=0.002)
    assert SimulatedDevice.from_file(linear / SETTINGS_FILE).batch_seconds == LinearBatchTime(0.002)
    (folder / SETTINGS_FILE).write_text(json.dumps({"figure": "T4, FP32", "time_scal": 1}))
    with pytest.raises(ValueError, match="unknown keys"):
        SimulatedDevice.from_file(folder / SETTINGS_FILE)
    with pytest.raises(ValueError, match="no published figure"):
        write_model_folder(tmp_path / "bad", figure="A100")
    assert not (tmp_path / "bad").exists()  # refused before anything is written


def test_served_folder_batches_concurrent_requests_and_answers_each_its_own_rows(tmp_path):
    write_model_folder(tmp_path / "sim", fixed_seconds=0.02, per_row_seconds=0.0002,
                       input_features=4)
    requests = [[[i, -i, 2 * i, 3]] for i in range(40)]  # one row each: a batch > 1 row is shared
    with running_server(["--model-root", str(tmp_path), "--no-access-log",
                         "--max-batch-size", "16", "--max-wait-ms", "2"]) as server:
        assert server.load("sim", tmp_path / "sim")[0] == 200
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda rows: server.invoke("sim", rows), requests))
        for rows, (status, answer) in zip(requests, answers):
            assert status == 200 and answer == expected(rows), (rows, answer)
        buffer = io.BytesIO()
        np.save(buffer, np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.float32))
        status, _, body = server.request("POST", "/models/sim/invoke", buffer.getvalue(),
                                         {"Content-Type": "application/x-npy"})
        assert status == 200 and json.loads(body) == expected([[1, 2, 3, 4], [5, 6, 7, 8]])
        status, described = server.json("GET", "/models/sim")
        assert status == 200
        assert described["stats"]["requestsCompleted"] == len(requests) + 1
        assert described["stats"]["meanBatchSize"] > 1, described["stats"]
        assert described["stats"]["batches"] < len(requests)
