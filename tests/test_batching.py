"""ModelRunner: the batching rules of docs/design.md section 3, each as a test that fails if broken.

The tests order events with a gate, not with sleeps: the model sets ``entered`` when a
call starts and blocks until the test sets ``release``, so "a batch is in the model"
is a fact the test waits for, not a guess about how long the runner takes. Times the
policy is about (``max_wait``) are read from the runner's own ``BatchRecord``.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
import torch

from mmserver.batching import (
    BatchSettings,
    InvocationTimeout,
    ModelError,
    ModelOutOfMemory,
    ModelRunner,
    QueueFull,
    RunnerClosed,
)

POISON = -1.0
#: Longest a test waits for the model to be entered, or the model for its release.
GATE_SECONDS = 5.0


class RecordingModel:
    """Doubles its input plus one, so every output row identifies its input row.

    Remembers the shape of every batch it saw and raises on rows holding POISON.
    ``held=True`` makes it a gate: each call sets ``entered`` and then waits for
    ``release``, so a test can keep the runner busy for exactly as long as it needs.
    """

    def __init__(self, oom_above_rows: int | None = None, held: bool = False):
        self.batches: list[tuple[int, ...]] = []
        self.oom_above_rows = oom_above_rows
        self.entered = threading.Event()
        self.release = threading.Event()
        if not held:
            self.release.set()
        self.threads: set[str] = set()

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        self.threads.add(threading.current_thread().name)
        self.entered.set()
        if not self.release.wait(timeout=GATE_SECONDS):
            raise RuntimeError("the test never released the model")
        assert batch.shape[0] > 0, "the runner must never run an empty batch"
        self.batches.append(tuple(batch.shape))
        if self.oom_above_rows is not None and batch.shape[0] > self.oom_above_rows:
            raise torch.OutOfMemoryError(f"pretend OOM at {batch.shape[0]} rows")
        if (batch == POISON).any():
            raise RuntimeError("poisoned row")
        assert torch.is_inference_mode_enabled()
        return batch * 2 + 1

    async def wait_entered(self) -> None:
        """Return once a call is inside the model (the worker thread holds it at the gate)."""
        assert await asyncio.to_thread(self.entered.wait, GATE_SECONDS), "the model was not called"

    @property
    def rows_seen(self) -> int:
        return sum(shape[0] for shape in self.batches)


def run(coro, timeout: float = 60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def one_loop_turn() -> None:
    """Let the tasks created before this run to their first await (into the runner's queue).

    One turn of the event loop, not a wait for time: a task created with ``create_task``
    runs its first step on the next turn, in creation order.
    """
    await asyncio.sleep(0)


def expected(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def timer(max_batch_size: int, max_wait: float) -> BatchSettings:
    return BatchSettings(max_batch_size=max_batch_size, max_wait=max_wait, policy="timer")


def test_each_request_gets_exactly_its_own_rows():
    async def main():
        model = RecordingModel()
        async with ModelRunner(model, timer(8, 0.05)) as runner:
            inputs = [torch.full((n, 3), float(i)) for i, n in enumerate([1, 2, 3, 2])]
            outputs = await asyncio.gather(*(runner.submit(x) for x in inputs))
        for x, y in zip(inputs, outputs):
            assert torch.equal(y, expected(x))
        assert model.batches == [(8, 3)]

    run(main())


def test_shapes_never_mix_and_the_oldest_leads():
    async def main():
        model = RecordingModel()
        async with ModelRunner(model, timer(4, 0.1)) as runner:
            a = [torch.full((1, 3), float(i)) for i in range(3)]
            b = [torch.full((1, 5), float(i)) for i in range(3)]
            interleaved = [a[0], b[0], a[1], b[1], a[2], b[2]]
            outputs = await asyncio.gather(*(runner.submit(x) for x in interleaved))
        for x, y in zip(interleaved, outputs):
            assert torch.equal(y, expected(x))
        assert model.batches == [(3, 3), (3, 5)]

    run(main())


def test_dtypes_never_mix():
    async def main():
        model = RecordingModel()
        async with ModelRunner(model, timer(4, 0.1)) as runner:
            xs = [torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float32)]
            outputs = await asyncio.gather(*(runner.submit(x) for x in xs))
        assert [y.dtype for y in outputs] == [torch.float64, torch.float32]
        assert len(model.batches) == 2

    run(main())


def test_a_full_queue_refuses_at_once_before_any_work():
    async def main():
        model = RecordingModel(held=True)
        settings = BatchSettings(max_batch_size=1, max_wait=0, max_queue_size=2)
        async with ModelRunner(model, settings) as runner:
            first = asyncio.create_task(runner.submit(torch.zeros(1, 2)))
            await model.wait_entered()
            queued = [asyncio.create_task(runner.submit(torch.ones(1, 2))) for _ in range(2)]
            await one_loop_turn()
            assert runner.queue_depth == 2
            started = time.perf_counter()
            with pytest.raises(QueueFull) as refused:
                await runner.submit(torch.full((1, 2), 7.0))
            assert time.perf_counter() - started < 0.05
            assert refused.value.retry_after_seconds >= 1
            with pytest.raises(QueueFull):
                runner.reserve()
            model.release.set()
            await asyncio.gather(first, *queued)
        assert model.rows_seen == 3
        assert runner.stats.requests_rejected == 2

    run(main())


def test_a_reservation_holds_a_slot_until_used_or_released():
    async def main():
        model = RecordingModel()
        settings = BatchSettings(max_batch_size=4, max_wait=0, max_queue_size=1)
        async with ModelRunner(model, settings) as runner:
            slot = runner.reserve()
            with pytest.raises(QueueFull):
                await runner.submit(torch.ones(1, 1))
            slot.release()
            assert torch.equal(await runner.submit(torch.ones(1, 1)), torch.full((1, 1), 3.0))
            with runner.reserve() as slot:
                assert torch.equal(await slot.submit(torch.zeros(1, 1)), torch.ones(1, 1))
            assert runner.queue_depth == 0

    run(main())


def test_a_failing_request_fails_alone_and_the_runner_keeps_serving():
    async def main():
        model = RecordingModel()
        async with ModelRunner(model, timer(4, 0.1)) as runner:
            xs = [torch.full((1, 2), v) for v in (1.0, POISON, 3.0, 4.0)]
            results = await asyncio.gather(*(runner.submit(x) for x in xs),
                                           return_exceptions=True)
            assert isinstance(results[1], ModelError)
            assert "poisoned row" in str(results[1])
            for i in (0, 2, 3):
                assert torch.equal(results[i], expected(xs[i]))
            assert model.batches[0] == (4, 2)  # tried together first, then one by one
            later = await runner.submit(torch.full((1, 2), 5.0))
            assert torch.equal(later, torch.full((1, 2), 11.0))
        assert runner.stats.requests_failed == 1

    run(main())


def test_out_of_memory_retries_smaller_then_gives_up_on_one_request():
    async def main():
        model = RecordingModel(oom_above_rows=2)
        async with ModelRunner(model, timer(8, 0.1)) as runner:
            xs = [torch.full((1, 2), float(i)) for i in range(4)] + [torch.zeros(3, 2)]
            results = await asyncio.gather(*(runner.submit(x) for x in xs),
                                           return_exceptions=True)
        for x, y in zip(xs[:4], results[:4]):
            assert torch.equal(y, expected(x))
        assert isinstance(results[4], ModelOutOfMemory)

    run(main())


def test_a_request_larger_than_max_batch_size_runs_alone_and_whole():
    async def main():
        model = RecordingModel()
        async with ModelRunner(model, timer(2, 0.05)) as runner:
            big = torch.arange(10.0).reshape(5, 2)
            y = await runner.submit(big)
        assert torch.equal(y, expected(big))
        assert model.batches == [(5, 2)]

    run(main())


def test_the_books_stale_timer_crash_cannot_happen():
    """Bursts that fill batches while a timer is pending, for many rounds (docs/design.md, section 2, defect 3).

    The pauses between bursts are the test's input: arrivals before, around and after
    the 10 ms timer of the request left over from the previous burst.
    """

    async def main():
        model = RecordingModel()
        rng = random.Random(3)
        async with ModelRunner(model, timer(3, 0.01)) as runner:
            for round_ in range(150):
                burst = [torch.full((1, 2), float(round_ * 10 + i))
                         for i in range(rng.choice([1, 2, 3, 4, 6]))]
                outputs = await asyncio.gather(*(runner.submit(x) for x in burst))
                for x, y in zip(burst, outputs):
                    assert torch.equal(y, expected(x))
                await asyncio.sleep(rng.choice([0, 0.001, 0.005, 0.012]))
            assert runner.running
        assert all(shape[0] >= 1 for shape in model.batches)
        assert runner.stats.requests_failed == 0

    run(main())


def test_a_cancelled_request_is_dropped_before_its_batch_is_formed():
    async def main():
        model = RecordingModel()
        async with ModelRunner(model, timer(8, 0.2)) as runner:
            tasks = [asyncio.create_task(runner.submit(torch.full((1, 2), float(i))))
                     for i in range(5)]
            assert not await asyncio.to_thread(model.entered.wait, 0.02)  # the timer holds them
            assert runner.queue_depth == 5
            tasks[1].cancel()
            tasks[3].cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[1], asyncio.CancelledError)
        assert isinstance(results[3], asyncio.CancelledError)
        assert model.batches == [(3, 2)]
        assert runner.stats.requests_cancelled == 2

    run(main())


def test_greedy_does_not_make_a_lone_request_wait():
    async def main():
        model = RecordingModel()
        records = []
        settings = BatchSettings(max_batch_size=8, max_wait=10.0, policy="greedy")
        async with ModelRunner(model, settings) as runner:
            runner.add_listener(records.append)
            started = time.perf_counter()
            await runner.submit(torch.ones(1, 2))
            return time.perf_counter() - started, records

    seconds, records = run(main())
    assert seconds < 1.0
    assert [r.requests for r in records] == [1] and records[0].queue_wait_seconds[0] < 1.0


def test_timer_waits_for_company_up_to_max_wait_and_no_longer():
    async def main():
        model = RecordingModel()
        records = []
        async with ModelRunner(model, timer(8, 0.3)) as runner:
            runner.add_listener(records.append)
            started = time.perf_counter()
            await runner.submit(torch.ones(1, 2))
            lone = time.perf_counter() - started
            started = time.perf_counter()
            await asyncio.gather(*(runner.submit(torch.ones(1, 2)) for _ in range(8)))
            full = time.perf_counter() - started
        return lone, full, records

    lone, full, records = run(main())
    assert [r.requests for r in records] == [1, 8]
    assert 0.3 <= records[0].queue_wait_seconds[0] < 2.0  # waited max_wait, on the loop's clock
    assert lone < 2.0
    assert max(records[1].queue_wait_seconds) < 0.3  # a full batch runs at once
    assert full < 0.3


def test_greedy_batches_what_accumulated_while_the_model_was_busy():
    async def main():
        model = RecordingModel(held=True)
        settings = BatchSettings(max_batch_size=8, max_wait=0, policy="greedy")
        async with ModelRunner(model, settings) as runner:
            first = asyncio.create_task(runner.submit(torch.zeros(1, 2)))
            await model.wait_entered()
            rest = [asyncio.create_task(runner.submit(torch.ones(1, 2))) for _ in range(5)]
            await one_loop_turn()
            assert runner.queue_depth == 5  # queued while the model is busy
            model.release.set()
            await asyncio.gather(first, *rest)
        assert model.batches == [(1, 2), (5, 2)]

    run(main())


def test_greedy_waits_for_reserved_company_at_most_max_wait():
    async def main():
        model = RecordingModel()
        records = []
        settings = BatchSettings(max_batch_size=8, max_wait=0.2, policy="greedy")
        async with ModelRunner(model, settings) as runner:
            runner.add_listener(records.append)
            slot = runner.reserve()  # a request still being decoded
            started = time.perf_counter()
            lone = asyncio.create_task(runner.submit(torch.ones(1, 2)))
            # The lone request is queued, yet the model is not called: company is on its way.
            assert not await asyncio.to_thread(model.entered.wait, 0.05)
            await slot.submit(torch.ones(1, 2))
            await lone
            assert model.batches == [(2, 2)]
            assert time.perf_counter() - started < 0.2
            forgotten = runner.reserve()
            started = time.perf_counter()
            await runner.submit(torch.ones(1, 2))
            waited = time.perf_counter() - started
            forgotten.release()
        return records, waited

    records, waited = run(main())
    assert [r.requests for r in records] == [2, 1]
    assert max(records[0].queue_wait_seconds) < 0.2  # ran when its company came, not at max_wait
    assert 0.2 <= records[1].queue_wait_seconds[0] < 2.0  # a forgotten slot: max_wait, no more
    assert waited < 2.0


def test_stop_answers_everything_accepted_and_then_refuses():
    async def main():
        model = RecordingModel()
        runner = ModelRunner(model, timer(4, 30.0))
        await runner.start()
        tasks = [asyncio.create_task(runner.submit(torch.full((1, 1), float(i))))
                 for i in range(10)]
        await asyncio.gather(*tasks[:8])  # two full batches ran at once
        assert runner.queue_depth == 2  # the 30 s timer holds the last two
        started = time.perf_counter()
        await runner.stop()
        assert time.perf_counter() - started < 5
        results = await asyncio.gather(*tasks)
        for i, y in enumerate(results):
            assert y.item() == 2 * i + 1
        with pytest.raises(RunnerClosed):
            await runner.submit(torch.ones(1, 1))

    run(main())


def test_exactly_once_under_random_shapes_cancellations_and_failures():
    """2,000 concurrent submits; each resolves once, with the answer for its own input."""

    async def main():
        rng = random.Random(2026)
        model = RecordingModel()
        settings = BatchSettings(max_batch_size=16, max_wait=0.002, max_queue_size=4096)
        runner = ModelRunner(model, settings)
        await runner.start()
        submits, inputs, poisoned = [], [], []
        for i in range(2000):
            rows = rng.randint(1, 4)
            width = rng.choice([2, 3, 5])
            x = torch.full((rows, width), float(i))
            bad = rng.random() < 0.05
            if bad:
                x[rng.randrange(rows), 0] = POISON
            inputs.append(x)
            poisoned.append(bad)
            submits.append(asyncio.create_task(runner.submit(x)))
            if i % 50 == 0:
                await one_loop_turn()
        cancelled = set(rng.sample(range(2000), 200))
        for i in cancelled:
            submits[i].cancel()
        results = await asyncio.gather(*submits, return_exceptions=True)
        await runner.stop()
        return inputs, poisoned, cancelled, results, runner, model

    inputs, poisoned, cancelled, results, runner, model = run(main(), timeout=120)
    computed_ok = failed = was_cancelled = 0
    for i, (x, bad, result) in enumerate(zip(inputs, poisoned, results)):
        if isinstance(result, asyncio.CancelledError):
            assert i in cancelled
            was_cancelled += 1
        elif bad:
            assert isinstance(result, ModelError), (i, result)
            failed += 1
        else:
            assert isinstance(result, torch.Tensor), (i, result)
            assert torch.equal(result, expected(x)), i
            computed_ok += 1
    stats = runner.stats
    assert computed_ok + failed + was_cancelled == 2000
    # A caller cancelled just after its answer was set still counts as answered by the runner.
    assert computed_ok <= stats.requests_completed <= computed_ok + was_cancelled
    assert failed <= stats.requests_failed <= failed + was_cancelled
    # A task cancelled before it first ran never reached the runner; all others did, once.
    assert stats.requests_submitted >= 2000 - len(cancelled)
    assert (stats.requests_completed + stats.requests_failed + stats.requests_cancelled
            == stats.requests_submitted)
    assert max(stats.batch_size_counts) <= 16
    assert runner.queue_depth == 0


def test_the_event_loop_stays_responsive_while_a_model_call_runs():
    async def main():
        model = RecordingModel(held=True)
        turns: list[float] = []
        async with ModelRunner(model, BatchSettings(max_batch_size=4, max_wait=0)) as runner:
            answer = asyncio.create_task(runner.submit(torch.ones(2, 2)))
            await model.wait_entered()
            for _ in range(20):
                started = time.perf_counter()
                await one_loop_turn()
                turns.append(time.perf_counter() - started)
            assert not answer.done()  # the call was inside the model all along
            model.release.set()
            assert torch.equal(await answer, expected(torch.ones(2, 2)))
        assert max(turns) < 0.2
        assert all(name.startswith("mmserver-") for name in model.threads)

    run(main())


def test_settings_are_validated():
    for bad in (dict(max_batch_size=0), dict(max_wait=-1), dict(max_wait=float("nan")),
                dict(max_queue_size=0), dict(policy="fifo")):
        with pytest.raises(ValueError):
            BatchSettings(**bad)


def test_inputs_must_be_tensors_with_rows():
    async def main():
        async with ModelRunner(lambda x: x) as runner:
            with pytest.raises(ValueError):
                await runner.submit(torch.tensor(3.0))
            with pytest.raises(TypeError):
                await runner.submit([1, 2, 3])
            assert runner.queue_depth == 0

    run(main())


def test_a_model_that_returns_the_wrong_number_of_rows_is_a_model_error():
    async def main():
        async with ModelRunner(lambda x: x[:1], BatchSettings(max_wait=0)) as runner:
            with pytest.raises(ModelError, match="one row per input row"):
                await runner.submit(torch.ones(3, 2))
            assert runner.running

    run(main())


def test_statistics_count_batches_rows_and_waits():
    async def main():
        model = RecordingModel()
        records = []
        async with ModelRunner(model, timer(4, 0.05)) as runner:
            runner.add_listener(records.append)
            await asyncio.gather(*(runner.submit(torch.ones(1, 2)) for _ in range(6)))
        return runner.stats, records

    stats, records = run(main())
    assert stats.batches == 2
    assert stats.rows == 6
    assert stats.batch_size_counts == {4: 1, 2: 1}
    assert stats.mean_batch_size == 3
    assert [r.rows for r in records] == [4, 2]
    assert records[1].queue_wait_seconds[0] >= 0.05 - 0.005
    assert stats.compute_seconds_total > 0


def test_stats_add_every_record_to_each_total():
    from mmserver.batching import BatchRecord, RunnerStats

    stats = RunnerStats()
    before = time.time()
    stats.add(BatchRecord(rows=4, requests=2, queue_wait_seconds=(0.25, 0.5),
                          compute_seconds=1.0, failed_requests=1, completed_seconds=1.25,
                          failed_seconds=1.5))
    stats.add(BatchRecord(rows=4, requests=1, queue_wait_seconds=(0.125,), compute_seconds=2.0,
                          failed_requests=0, completed_seconds=2.125))
    stats.add(BatchRecord(rows=1, requests=1, queue_wait_seconds=(0.0,), compute_seconds=0.5,
                          failed_requests=1, failed_seconds=0.5))
    assert (stats.batches, stats.rows, stats.batch_size_counts) == (3, 9, {4: 2, 1: 1})
    assert stats.batch_size_compute_seconds == {4: 3.0, 1: 0.5}
    assert (stats.compute_seconds_total, stats.requests_batched) == (3.5, 4)
    assert stats.queue_seconds_total == 0.875
    assert stats.request_compute_seconds_total == 1.0 * 2 + 2.0 + 0.5  # each request, its call
    assert (stats.requests_failed_in_calls, stats.completed_seconds_total,
            stats.failed_seconds_total) == (2, 3.375, 2.0)
    assert before <= stats.last_batch_unix <= time.time()
    assert stats.mean_batch_size == 3.0


def test_requests_in_a_batch_are_answered_even_if_a_batching_step_fails():
    async def main():
        model = RecordingModel(held=True)
        runner = ModelRunner(model, BatchSettings(max_batch_size=2, max_wait=0))
        await runner.start()
        tasks = [asyncio.create_task(runner.submit(torch.ones(1, 1))) for _ in range(2)]
        await model.wait_entered()

        def broken():
            raise RuntimeError("a bug in the runner")
        runner.instances.idle = broken  # not stop(): a bug of ours breaks the next step
        tasks.append(asyncio.create_task(runner.submit(torch.ones(1, 1))))
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        model.release.set()
        assert all(isinstance(r, RunnerClosed) for r in results), results
        with pytest.raises(RunnerClosed):
            await runner.submit(torch.ones(1, 1))

    run(main())


def test_a_plain_function_gets_its_inputs_where_they_are():
    async def main():
        seen = []
        model = lambda x: seen.append(x.device) or x  # noqa: E731
        async with ModelRunner(model, BatchSettings(max_wait=0)) as runner:
            await runner.submit(torch.ones(1, 1))
        assert runner.device is None and seen == [torch.device("cpu")]

    run(main())


def test_a_request_past_its_deadline_is_answered_and_never_computed():
    async def main():
        model = RecordingModel(held=True)
        async with ModelRunner(model, BatchSettings(max_batch_size=1, max_wait=0)) as runner:
            first = asyncio.create_task(runner.submit(torch.zeros(1, 2)))
            await model.wait_entered()
            loop = asyncio.get_running_loop()
            with pytest.raises(InvocationTimeout):
                await runner.submit(torch.ones(1, 2), deadline=loop.time() + 0.05)
            assert runner.queue_depth == 0
            model.release.set()
            await first
        assert model.rows_seen == 1
        stats = runner.stats
        assert (stats.requests_completed, stats.requests_failed) == (1, 1)

    run(main())


# -- the knobs and the statistics, exact values ---------------------------------------------


def test_settings_refuse_each_bad_value_saying_which():
    from mmserver.batching.settings import BatchSettings as Settings

    cases = [
        (dict(max_batch_size=0), "max_batch_size must be an integer >= 1, got 0"),
        (dict(max_batch_size=True), "max_batch_size must be an integer >= 1, got True"),
        (dict(max_batch_size=2.0), "max_batch_size must be an integer >= 1, got 2.0"),
        (dict(max_wait=-0.001), "max_wait must be a finite number of seconds >= 0, got -0.001"),
        (dict(max_wait=float("inf")), "max_wait must be a finite number of seconds >= 0, got inf"),
        (dict(max_wait=False), "max_wait must be a finite number of seconds >= 0, got False"),
        (dict(max_wait="5"), "max_wait must be a finite number of seconds >= 0, got '5'"),
        (dict(max_queue_size=0), "max_queue_size must be an integer >= 1, got 0"),
        (dict(max_queue_size=True), "max_queue_size must be an integer >= 1, got True"),
        (dict(max_queue_size=1.5), "max_queue_size must be an integer >= 1, got 1.5"),
        (dict(policy="fifo"), "policy must be one of ('greedy', 'timer'), got 'fifo'"),
        (dict(batch_sizing="min"), "batch_sizing must be one of ('max', 'measured'), got 'min'"),
        (dict(instances=0), "instances must be an integer >= 1, got 0"),
        (dict(instances=True), "instances must be an integer >= 1, got True"),
        (dict(instances=1.0), "instances must be an integer >= 1, got 1.0"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError) as refused:
            Settings(**bad)
        assert str(refused.value) == message
    edge = Settings(max_batch_size=1, max_wait=0, max_queue_size=1, instances=1)
    assert (edge.max_batch_size, edge.max_wait, edge.max_queue_size) == (1, 0, 1)
    assert Settings() == Settings(16, 0.005, 256, "greedy", "max", 1)


def test_knobs_spell_every_edge():
    from mmserver.batching.settings import KNOBS_BY_KEY

    wait, size = KNOBS_BY_KEY["max_wait_ms"], KNOBS_BY_KEY["max_batch_size"]
    assert (wait.flag, size.flag) == ("--max-wait-ms", "--max-batch-size")
    settings = BatchSettings(max_batch_size=8, max_wait=0.004)
    assert wait.edge_value(settings) == 4.0 and size.edge_value(settings) == 8
    assert wait.field_value(5) == 0.005 and wait.field_value(2.5) == 0.0025
    assert size.field_value(7) == 7 and size.field_value("x") == "x"  # checked by the settings
    for bad in (True, "5", None):
        with pytest.raises(ValueError) as refused:
            wait.field_value(bad)
        assert str(refused.value) == f"max_wait_ms must be a number, got {bad!r}"


def test_overrides_are_edge_values_and_errors_name_the_edge_key():
    base = BatchSettings()
    assert base.overridden({}) == base
    assert base.overridden({"max_batch_size": 32, "max_wait_ms": 10, "policy": "timer"}) == \
        BatchSettings(max_batch_size=32, max_wait=0.01, policy="timer")
    with pytest.raises(ValueError) as refused:
        base.overridden({"bogus": 1, "max_wait": 2})
    assert str(refused.value) == (
        "unknown batching settings ['bogus', 'max_wait']; known: ['batch_sizing', 'instances', "
        "'max_batch_size', 'max_batch_tokens', 'max_queue_size', 'max_wait_ms', 'policy']")
    with pytest.raises(ValueError) as refused:
        base.overridden({"max_wait_ms": -5})
    assert str(refused.value) == ("max_wait_ms=-5 is not allowed: max_wait must be a finite "
                                  "number of seconds >= 0, got -0.005")
    with pytest.raises(ValueError) as refused:
        base.overridden({"max_batch_size": 0})
    assert str(refused.value) == "max_batch_size must be an integer >= 1, got 0"


def test_statistics_add_up_each_record():
    from mmserver.batching import BatchRecord, RunnerStats

    stats = RunnerStats()
    assert stats.mean_batch_size == 0.0
    assert stats.drain_seconds(0, 16) == 1.0  # at least a second
    assert stats.drain_seconds(320, 16) == 2.0  # 20 batches at 0.1 s before any was measured
    stats.add(BatchRecord(rows=4, requests=2, queue_wait_seconds=(0.25, 0.5),
                          compute_seconds=0.5, failed_requests=0))
    stats.add(BatchRecord(rows=2, requests=1, queue_wait_seconds=(1.0,), compute_seconds=2.5,
                          failed_requests=1))
    assert (stats.batches, stats.rows) == (2, 6)
    assert stats.batch_size_counts == {4: 1, 2: 1}
    assert stats.compute_seconds_total == 3.0
    assert stats.mean_batch_size == 3.0
    assert stats.drain_seconds(17, 16) == 3.0  # two batches at the measured 1.5 s
    assert stats.drain_seconds(1, 16) == 1.5
    assert stats.drain_seconds(0, 16) == 1.0
