"""``ModelRunner``'s races and its stuck-call path, ordered by asyncio's own scheduling.

No sleep is a barrier here. Tasks run their steps in the order they were scheduled (the
event loop's ready queue is FIFO), so "the runner is woken, then a caller is cancelled in
the same turn" is an order the test sets up, not a guess about timing. A model call is
held by a gate the test opens; a stuck call is one that outlives ``call_timeout``, which
is the behaviour under test, not a wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading

import pytest
import torch

from mmserver.batching import (
    BatchSettings,
    InvocationTimeout,
    ModelRunner,
    ModelUnhealthy,
    QueueFull,
    RunnerClosed,
)

#: Longest the held model waits for its release, and a guard on every await that could hang.
GATE_SECONDS = 5.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 6 * GATE_SECONDS))


class Held(torch.nn.Module):
    """y = 2x + 1, one call at a time through a gate: ``entered`` when a call starts, then it
    waits for ``release``; ``left`` once it returned."""

    def __init__(self, held: bool = True):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))
        self.calls: list[list[float]] = []
        self.entered, self.release, self.left = threading.Event(), threading.Event(), \
            threading.Event()
        if not held:
            self.release.set()

    def forward(self, x):
        self.calls.append(x[:, 0].tolist())
        self.entered.set()
        self.release.wait(GATE_SECONDS)
        self.left.set()
        return x * self.scale + 1

    async def wait_entered(self):
        assert await asyncio.to_thread(self.entered.wait, GATE_SECONDS), "the model was not called"


def row(value: float) -> torch.Tensor:
    return torch.full((1, 3), value)


@contextlib.asynccontextmanager
async def one_call_held(model: Held, settings: BatchSettings | None = None):
    """A runner (one row a call by default) whose first request, row 0, is inside the held
    model: whatever is queued next waits behind it until the test opens the gate."""
    async with ModelRunner(model, settings or BatchSettings(max_batch_size=1, max_wait=0),
                           name="m") as runner:
        first = runner.reserve().submit(row(0.0))
        await model.wait_entered()
        yield runner, first


async def until(condition) -> None:
    """Wait for ``condition()`` to hold (set by a callback the loop runs when a thread ends)."""
    async def poll():
        while not condition():
            await asyncio.sleep(0.001)
    await asyncio.wait_for(poll(), GATE_SECONDS)


def test_a_caller_cancelled_while_the_runner_is_waking_is_dropped_and_the_rest_run():
    """The race: B's future is cancelled, but B leaves the queue only on its own next step.

    A's arrival wakes the runner, whose step is scheduled before B's cancellation is
    handled, so the runner forms its batch with B cancelled and still queued. It must drop
    B and batch A with C; keeping only the cancelled ones would leave A and C waiting
    forever, and keeping B would waste half of the two-row batch on it.
    """
    model = Held(held=False)
    records = []

    async def main():
        settings = BatchSettings(max_batch_size=2, max_wait=0, policy="greedy")
        async with ModelRunner(model, settings) as runner:
            runner.add_listener(records.append)
            tasks = [asyncio.create_task(runner.submit(row(float(i)))) for i in range(3)]
            await asyncio.sleep(0)  # one turn: A, B and C are queued, the runner is woken
            assert runner.queue_depth == 3 and not model.entered.is_set()
            tasks[1].cancel()
            a, c = await asyncio.wait_for(asyncio.gather(tasks[0], tasks[2]), GATE_SECONDS)
            with pytest.raises(asyncio.CancelledError):
                await tasks[1]
            return a, c, runner.stats

    a, c, stats = run(main())
    assert torch.equal(a, row(1.0)) and torch.equal(c, row(5.0))
    assert model.calls == [[0.0, 2.0]]  # one call, of A and C: B never reached the model
    assert [(r.requests, r.rows) for r in records] == [(2, 2)]
    assert (stats.requests_submitted, stats.requests_completed, stats.requests_cancelled) == \
        (3, 2, 1)


def test_a_cancelled_caller_frees_its_queue_slot_at_once():
    model = Held()

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0, max_queue_size=1)
        async with ModelRunner(model, settings) as runner:
            first = asyncio.create_task(runner.submit(row(0.0)))
            await model.wait_entered()
            queued = asyncio.create_task(runner.submit(row(1.0)))
            await asyncio.sleep(0)
            assert runner.queue_depth == 1
            with pytest.raises(QueueFull):
                runner.check_admission()
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            assert runner.queue_depth == 0
            runner.check_admission()  # the slot is free again
            model.release.set()
            assert torch.equal(await first, row(1.0))
            assert torch.equal(await runner.submit(row(2.0)), row(5.0))

    run(main())
    assert model.calls == [[0.0], [2.0]]


def test_a_stuck_call_makes_the_model_unhealthy_until_it_returns():
    model = Held()

    async def main():
        settings = BatchSettings(max_batch_size=4, max_wait=0)
        async with ModelRunner(model, settings, name="slow", call_timeout=0.05) as runner:
            assert runner.stuck_seconds is None
            with pytest.raises(InvocationTimeout) as timed_out:
                await runner.submit(row(0.0))
            assert str(timed_out.value) == "model 'slow' did not answer within its 0.05 s call " \
                                           "timeout"
            assert model.entered.is_set() and not model.left.is_set()
            assert runner.stuck_seconds >= 0.05
            for refused in (runner.check_admission, runner.reserve):
                with pytest.raises(ModelUnhealthy) as unhealthy:
                    refused()
            message = str(unhealthy.value)
            assert message.startswith("model 'slow' is unhealthy: a call has run for ")
            assert message.endswith(" s, past its 0.05 s limit; unload it or wait for the call "
                                    "to return")
            with pytest.raises(ModelUnhealthy):
                await runner.submit(row(1.0))
            assert runner.queue_depth == 0
            assert runner.stats.requests_submitted == 1
            assert (runner.stats.requests_completed, runner.stats.requests_failed) == (0, 1)

            model.release.set()  # the call returns: healthy again
            await until(lambda: runner.stuck_seconds is None)
            runner.check_admission()
            assert torch.equal(await runner.submit(row(3.0)), row(7.0))
            return runner.stats

    stats = run(main())
    assert model.calls == [[0.0], [3.0]]
    assert (stats.requests_completed, stats.requests_failed) == (1, 1)


def test_a_stuck_call_that_finally_raises_leaves_no_unretrieved_error_behind(caplog):
    """Its request was answered (timed out) long ago; the error it raises at last is read and
    dropped, not reported by asyncio as "Future exception was never retrieved"."""
    class HeldThenFails(Held):
        def forward(self, x):
            super().forward(x)
            raise RuntimeError("too late to matter")

    model = HeldThenFails()

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0)
        async with ModelRunner(model, settings, call_timeout=0.05) as runner:
            with pytest.raises(InvocationTimeout):
                await runner.submit(row(0.0))
            model.release.set()
            await until(lambda: runner.stuck_seconds is None)

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        run(main())
        gc.collect()  # an unretrieved exception is reported when its future is collected
    assert model.left.is_set()
    assert "never retrieved" not in caplog.text


def test_a_request_queued_before_the_call_got_stuck_runs_once_the_call_returns():
    model = Held()

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0)
        async with ModelRunner(model, settings, call_timeout=0.2) as runner:
            stuck = asyncio.create_task(runner.submit(row(0.0)))
            await model.wait_entered()
            queued = asyncio.create_task(runner.submit(row(1.0)))  # before the timeout
            with pytest.raises(InvocationTimeout):
                await stuck
            assert runner.queue_depth == 1 and not queued.done()
            model.release.set()  # the stuck call returns: the queue moves again
            return await asyncio.wait_for(queued, GATE_SECONDS)

    assert torch.equal(run(main()), row(3.0))
    assert model.calls == [[0.0], [1.0]]


def test_a_full_batch_is_as_many_rows_as_the_sizer_says():
    """With ``batch_sizing="measured"`` the planner's full batch is the sizer's size, so two
    rows run at once when the sizer asks for two, though the timer would wait for four."""
    model = Held(held=False)

    async def main():
        settings = BatchSettings(max_batch_size=4, max_wait=6 * GATE_SECONDS, policy="timer",
                                 batch_sizing="measured")
        async with ModelRunner(model, settings) as runner:
            runner.sizer.next_size = 2
            done = asyncio.gather(runner.submit(row(1.0)), runner.submit(row(2.0)))
            return await asyncio.wait_for(done, GATE_SECONDS)

    assert len(run(main())) == 2
    assert model.calls == [[1.0, 2.0]]


def test_a_runner_keeps_its_call_timeout_and_names_its_instances():
    runner = ModelRunner(Held(), BatchSettings(instances=3), name="m", call_timeout=2.5)
    assert runner.call_timeout == 2.5
    assert [e.name for e in runner.instances.executors] == ["m", "m-1", "m-2"]
    assert all(e.call_timeout == 2.5 for e in runner.instances.executors)

    async def submit_before_start():
        with pytest.raises(RunnerClosed) as closed:
            await runner.submit(row(1.0))
        assert str(closed.value) == "model 'm' is not accepting requests"

    run(submit_before_start())


def test_admission_refusals_say_why():
    model = Held()

    async def main():
        runner = ModelRunner(model, BatchSettings(max_batch_size=1, max_wait=0,
                                                  max_queue_size=1), name="m")
        with pytest.raises(RunnerClosed) as closed:
            runner.check_admission()
        assert str(closed.value) == "model 'm' is not accepting requests"
        async with runner:
            running = asyncio.create_task(runner.submit(row(0.0)))
            await model.wait_entered()
            queued = asyncio.create_task(runner.submit(row(1.0)))
            await until(lambda: runner.queue_depth == 1)
            with pytest.raises(QueueFull) as full:
                runner.check_admission()
            assert str(full.value) == "model 'm' has 1 requests queued (max_queue_size=1)"
            assert runner.stats.requests_rejected == 1
            model.release.set()
            await asyncio.gather(running, queued)

    run(main())


def test_stop_does_not_wait_for_a_stuck_call_and_answers_what_was_queued():
    model = Held()

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0)
        runner = ModelRunner(model, settings, name="slow", call_timeout=0.05)
        await runner.start()
        slot = runner.reserve()  # admitted before the call got stuck
        with pytest.raises(InvocationTimeout):
            await runner.submit(row(0.0))
        waiting = asyncio.ensure_future(slot.submit(row(1.0)))
        await asyncio.sleep(0)
        assert runner.queue_depth == 1  # queued behind the stuck instance
        await asyncio.wait_for(runner.stop(), GATE_SECONDS)
        assert not model.left.is_set()  # stop() returned with the call still in the model
        with pytest.raises(RunnerClosed) as closed:
            await waiting
        assert str(closed.value) == "model 'slow' stopped"
        assert runner.queue_depth == 0 and not runner.running
        with pytest.raises(RunnerClosed):
            await runner.submit(row(2.0))
        model.release.set()

    run(main())
    assert model.calls == [[0.0]]


def test_stop_with_a_timeout_answers_what_is_left():
    """A long ``timer`` wait holds a request; ``stop`` runs it at once, without waiting."""
    model = Held(held=False)

    async def main():
        settings = BatchSettings(max_batch_size=8, max_wait=60.0, policy="timer")
        runner = ModelRunner(model, settings)
        await runner.start()
        assert runner.running
        waiting = asyncio.create_task(runner.submit(row(4.0)))
        await asyncio.sleep(0)
        await asyncio.wait_for(runner.stop(timeout=GATE_SECONDS), GATE_SECONDS)
        assert not runner.running
        assert torch.equal(await waiting, row(9.0))

    run(main())
    assert model.calls == [[4.0]]


class Poisonable(torch.nn.Module):
    """y = 2x + 1; raises on a row holding -1, and runs out of memory above ``oom_above`` rows."""

    def __init__(self, oom_above: int | None = None):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.tensor(2.0))
        self.oom_above = oom_above
        self.calls: list[int] = []

    def forward(self, x):
        self.calls.append(x.shape[0])
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise torch.OutOfMemoryError(f"pretend OOM at {x.shape[0]} rows")
        if (x == -1).any():
            raise RuntimeError("poisoned row")
        return x * self.scale + 1


def full_at(rows: int) -> BatchSettings:
    return BatchSettings(max_batch_size=rows, max_wait=GATE_SECONDS, policy="timer")


def test_a_failed_batch_is_retried_one_request_at_a_time_and_recorded():
    from mmserver.batching import ModelError

    model = Poisonable()
    records = []

    async def main():
        async with ModelRunner(model, full_at(4)) as runner:
            runner.add_listener(records.append)
            xs = [row(1.0), row(-1.0), torch.ones(2, 3)]
            return await asyncio.gather(*(runner.submit(x) for x in xs), return_exceptions=True)

    results = run(main())
    assert model.calls == [4, 1, 1, 2]  # together, then each alone: only the poisoned one fails
    assert type(results[1]) is ModelError  # not ModelOutOfMemory: a 500, not a 507
    assert str(results[1]) == "model 'model' failed: RuntimeError: poisoned row"
    assert type(results[1].__cause__) is RuntimeError  # the model's own error, for the log
    assert torch.equal(results[0], row(3.0)) and torch.equal(results[2], torch.full((2, 3), 3.0))
    assert [(r.rows, r.requests, r.failed_requests) for r in records] == [(4, 3, 1)]
    assert 0 <= records[0].compute_seconds < GATE_SECONDS


def test_a_record_sums_each_request_s_time_from_arrival_to_the_end_of_its_call():
    """``completed_seconds`` and ``failed_seconds`` (Triton's success and fail durations) are,
    request by request, its queue wait plus the call; a poisoned request counts as failed."""
    model = Poisonable()
    records = []

    async def main():
        async with ModelRunner(model, full_at(3)) as runner:
            runner.add_listener(records.append)
            xs = [row(1.0), row(-1.0), row(2.0)]
            await asyncio.gather(*(runner.submit(x) for x in xs), return_exceptions=True)

    run(main())
    [record] = records
    waits, call = record.queue_wait_seconds, record.compute_seconds
    assert (record.requests, record.failed_requests) == (3, 1)
    assert record.completed_seconds == pytest.approx(waits[0] + waits[2] + 2 * call)
    assert record.failed_seconds == pytest.approx(waits[1] + call)


def test_a_batch_our_own_code_fails_to_run_is_still_answered(monkeypatch):
    """A bug of ours in running a batch (not the model's error) leaves nobody waiting."""
    from mmserver.batching import BatchExecutor

    def broken(self, flight, result, error):
        raise RuntimeError("a bug in the executor")

    monkeypatch.setattr(BatchExecutor, "_arrived", broken)

    async def main():
        settings = BatchSettings(max_batch_size=2, max_wait=GATE_SECONDS, policy="timer",
                                 batch_sizing="measured")
        async with ModelRunner(Poisonable(), settings) as runner:
            results = await asyncio.gather(runner.submit(row(1.0)), runner.submit(row(2.0)),
                                           return_exceptions=True)
            return results, runner.stats

    results, stats = run(main())
    assert [type(r) for r in results] == [RunnerClosed, RunnerClosed]
    assert str(results[0]) == "model 'model' failed to run this request; see the server log"
    assert (stats.requests_failed, stats.requests_in_flight, stats.batches) == (2, 0, 1)


def test_out_of_memory_is_retried_in_halves_before_one_request_is_too_big():
    from mmserver.batching import ModelOutOfMemory

    model = Poisonable(oom_above=2)

    async def main():
        async with ModelRunner(model, full_at(7)) as runner:
            xs = [row(float(i)) for i in range(4)] + [torch.zeros(3, 3)]
            return await asyncio.gather(*(runner.submit(x) for x in xs), return_exceptions=True)

    results = run(main())
    # 7 rows; halves of 2 and 5 requests' rows; the 5 in halves of 1 and 4; the 4 in 1 and 3.
    assert model.calls == [7, 2, 5, 1, 4, 1, 3]
    assert [torch.equal(y, row(2.0 * i + 1)) for i, y in enumerate(results[:4])] == [True] * 4
    assert type(results[4]) is ModelOutOfMemory
    assert str(results[4]) == "model 'model' failed: OutOfMemoryError: pretend OOM at 3 rows"


def test_without_concatenation_each_request_is_one_call_with_its_input_as_it_is():
    seen = []

    def script(data):  # not row-wise: any object in, any object out
        seen.append(data)
        return {"echo": data["text"].upper(), "rows": torch.ones(5)}

    async def main():
        async with ModelRunner(script, full_at(8), concatenate=False) as runner:
            inputs = [{"text": "a"}, {"text": "bc"}, {"text": "d"}]
            outputs = await asyncio.gather(*(runner.submit(x) for x in inputs))
            return outputs, runner.stats

    outputs, stats = run(main())
    assert seen == [{"text": "a"}, {"text": "bc"}, {"text": "d"}]  # three calls, oldest first
    assert [o["echo"] for o in outputs] == ["A", "BC", "D"]
    assert all(torch.equal(o["rows"], torch.ones(5)) for o in outputs)  # handed back whole
    assert stats.batch_size_counts == {1: 3}


def test_the_device_is_where_the_model_s_parameters_are():
    assert ModelRunner(torch.nn.Linear(2, 2, device="meta")).device == torch.device("meta")
    assert ModelRunner(torch.nn.Linear(2, 2)).device == torch.device("cpu")
    assert ModelRunner(torch.nn.ReLU()).device is None  # no parameters: inputs stay where they are
    assert ModelRunner(torch.nn.ReLU(), device="meta").device == torch.device("meta")

    class Opaque:
        def parameters(self):
            raise RuntimeError("a compiled model that hides its parameters")

        def __call__(self, x):
            return x

    assert ModelRunner(Opaque()).device is None


class DeviceRecorder:
    """Notes the device of each input it is given, and answers on the CPU (as a model on an
    accelerator would once its output is copied back): y = x's row sums, one per row."""

    def __init__(self):
        self.devices: list[str] = []

    def __call__(self, x):
        tensor = x["x"] if isinstance(x, dict) else x
        self.devices.append(tensor.device.type)
        return torch.ones(tensor.shape[0], 1)


@pytest.mark.parametrize("concatenate", [True, False])
def test_inputs_are_moved_to_the_runner_s_device_and_answers_come_back(concatenate):
    model = DeviceRecorder()  # "meta" stands in for an accelerator: it has no data to compute on

    async def main():
        async with ModelRunner(model, full_at(2), device="meta", concatenate=concatenate) as r:
            x = {"x": torch.ones(1, 3)} if not concatenate else torch.ones(1, 3)
            return await asyncio.gather(r.submit(x), r.submit(x))

    answers = run(main())
    assert model.devices == (["meta"] if concatenate else ["meta", "meta"])
    assert all(torch.equal(a, torch.ones(1, 1)) for a in answers)


def test_a_batch_of_one_request_reaches_the_model_without_a_copy():
    seen = []

    def model(x):
        seen.append(x)
        return x

    x = torch.ones(2, 3)

    async def main():
        async with ModelRunner(model, full_at(2)) as runner:
            return await runner.submit(x)

    assert run(main()) is not None
    assert seen[0].data_ptr() == x.data_ptr()  # the request's own memory: no concatenation


def test_the_sizer_learns_from_each_successful_batch_and_its_model_time():
    sleep_seconds = 0.02

    def model(x):
        threading.Event().wait(sleep_seconds)
        return x

    async def main():
        settings = BatchSettings(max_batch_size=2, max_wait=0, batch_sizing="measured")
        async with ModelRunner(model, settings) as runner:
            started = asyncio.get_running_loop().time()
            for _ in range(3):
                await runner.submit(row(1.0))
            return runner.sizer, asyncio.get_running_loop().time() - started

    sizer, elapsed = run(main())
    seconds_per_call = 1 / sizer.rows_per_second(1)  # three calls of one row: it counts
    # A weighted mean of the three calls' times: each took at least the sleep, so none took
    # more than what the other two leave of the whole (not elapsed / 3: the weights are unequal,
    # and CI saw a slow first call put the mean 9 µs above a third of the whole).
    assert sleep_seconds <= seconds_per_call <= elapsed - 2 * sleep_seconds


def test_a_stopped_runner_s_worker_threads_end_and_one_never_started_stops_too():
    async def main():
        async with ModelRunner(Held(held=False), BatchSettings(instances=2),
                               name="threads-end") as runner:
            await asyncio.gather(*(runner.submit(row(1.0)) for _ in range(4)))
            threads = [t for t in threading.enumerate()
                       if t.name.startswith("mmserver-threads-end")]
        await ModelRunner(Held(), name="never-started").stop()
        return threads

    threads = run(main())
    assert threads, "the runner ran its calls in no thread of its own"
    for thread in threads:
        thread.join(GATE_SECONDS)
        assert not thread.is_alive(), thread.name


def test_stop_after_its_timeout_fails_what_is_left_without_waiting_for_the_model():
    model = Held()

    async def main():
        runner = ModelRunner(model, BatchSettings(max_batch_size=1, max_wait=0))
        await runner.start()
        running = asyncio.create_task(runner.submit(row(0.0)))
        await model.wait_entered()
        queued = asyncio.create_task(runner.submit(row(1.0)))
        await asyncio.sleep(0)
        await asyncio.wait_for(runner.stop(timeout=0.05), GATE_SECONDS)
        assert not model.left.is_set()  # stop() gave up on the call after its timeout
        for request in (running, queued):
            with pytest.raises(RunnerClosed) as closed:
                await request
            assert str(closed.value) == "model 'model' stopped"
        model.release.set()

    run(main())


def test_two_instances_run_two_batches_at_once_and_one_stuck_instance_is_not_unhealthy():
    model = Held()

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0, instances=2)
        async with ModelRunner(model, settings, call_timeout=0.05) as runner:
            with pytest.raises(InvocationTimeout):
                await runner.submit(row(0.0))  # instance 0 is stuck
            runner.check_admission()  # one instance is left: still healthy
            assert runner.stuck_seconds is None
            with pytest.raises(InvocationTimeout):
                await runner.submit(row(1.0))  # instance 1 gets stuck too
            with pytest.raises(ModelUnhealthy):
                runner.check_admission()
            assert runner.stuck_seconds >= 0.05
            model.release.set()
            await until(lambda: runner.stuck_seconds is None)
            assert torch.equal(await runner.submit(row(2.0)), row(5.0))
            busy = [e.busy_seconds for e in runner.instances.executors]
            return busy

    busy = run(main())
    assert sorted(model.calls) == [[0.0], [1.0], [2.0]]
    assert all(0.05 <= seconds < GATE_SECONDS for seconds in busy)


def test_a_model_that_calls_sys_exit_fails_its_request_and_the_runner_keeps_serving():
    import sys

    from mmserver.batching import ModelError

    def script(x):
        if (x < 0).any():
            sys.exit(3)
        return x + 1

    async def main():
        async with ModelRunner(script, BatchSettings(max_batch_size=1, max_wait=0)) as runner:
            with pytest.raises(ModelError) as failed:
                await runner.submit(row(-1.0))
            assert str(failed.value) == "model 'model' failed: SystemExit: 3"
            assert runner.running
            assert torch.equal(await runner.submit(row(1.0)), row(2.0))

    run(main())


def test_a_request_past_its_deadline_says_so_and_leaves_the_queue():
    model = Held()

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0)
        async with ModelRunner(model, settings, name="m") as runner:
            first = asyncio.create_task(runner.submit(row(0.0)))
            await model.wait_entered()
            loop = asyncio.get_running_loop()
            with pytest.raises(InvocationTimeout) as expired:
                await runner.submit(row(1.0), deadline=loop.time() + 0.01)
            assert str(expired.value) == "model 'm' did not answer before the request's deadline"
            assert runner.queue_depth == 0
            model.release.set()
            assert torch.equal(await first, row(1.0))

    run(main())
    assert model.calls == [[0.0]]


def test_reservations_count_each_slot_once():
    model = Held(held=False)

    async def main():
        settings = BatchSettings(max_batch_size=4, max_wait=0, max_queue_size=3)
        async with ModelRunner(model, settings) as runner:
            first, second = runner.reserve(), runner.reserve()
            assert runner.queue_depth == 2
            first.release()
            first.release()  # a second release gives nothing back twice
            assert runner.queue_depth == 1
            with pytest.raises(RuntimeError) as used:
                await first.submit(row(0.0))
            assert str(used.value) == "this reservation was already used"
            assert torch.equal(await second.submit(row(1.0)), row(3.0))
            with pytest.raises(RuntimeError, match="^this reservation was already used$"):
                second.submit(row(1.0))
            assert runner.queue_depth == 0
        stopping = ModelRunner(model, settings)
        await stopping.start()
        late = stopping.reserve()
        await stopping.stop(timeout=0.05)  # a slot reserved, never used, when the runner stops
        with pytest.raises(RunnerClosed) as closed:
            await late.submit(row(2.0))
        assert str(closed.value) == "model 'model' is not accepting requests"

    run(main())


def test_a_reserved_slot_submits_with_its_deadline():
    model = Held()

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0)
        async with ModelRunner(model, settings) as runner:
            first = asyncio.create_task(runner.submit(row(0.0)))
            await model.wait_entered()
            slot = runner.reserve()
            loop = asyncio.get_running_loop()
            with pytest.raises(InvocationTimeout):
                await asyncio.wait_for(slot.submit(row(1.0), deadline=loop.time() + 0.01),
                                       GATE_SECONDS)
            model.release.set()
            await first

    run(main())
    assert model.calls == [[0.0]]


def test_enqueued_requests_answer_on_their_futures_and_a_withdrawn_one_never_runs():
    """The engine's path for its HTTP workers' rows: queued without a coroutine each."""
    def enqueue(runner, data, deadline=None):
        slot = runner.reserve()
        slot.submit(data, deadline=deadline)
        return slot

    model = Held()

    async def main():
        settings = BatchSettings(max_batch_size=4, max_wait=0)
        async with ModelRunner(model, settings) as runner:
            first = enqueue(runner, row(0.0))
            await model.wait_entered()
            kept, withdrawn = enqueue(runner, row(1.0)), enqueue(runner, row(2.0))
            assert runner.queue_depth == 2
            withdrawn.withdraw()
            assert runner.queue_depth == 1 and withdrawn.future.cancelled()
            model.release.set()
            assert torch.equal(await first.future, row(1.0))
            assert torch.equal(await kept.future, row(3.0))
            kept.withdraw()  # after its answer: nothing changes
            assert not kept.future.cancelled()
            return runner.stats

    stats = run(main())
    assert model.calls == [[0.0], [1.0]]
    assert (stats.requests_submitted, stats.requests_completed, stats.requests_cancelled) == \
        (3, 2, 1)


def test_enqueued_requests_past_their_deadlines_are_answered_in_deadline_order_and_leave_the_queue():
    """An earlier deadline that arrives later still expires first; a request without one waits
    for its answer."""
    model = Held()

    async def main():
        async with one_call_held(model) as (runner, first):
            now = asyncio.get_running_loop().time()
            late = runner.reserve().submit(row(1.0), deadline=now + 0.3)
            soon = runner.reserve().submit(row(2.0), deadline=now + 0.02)
            patient = runner.reserve().submit(row(3.0))
            with pytest.raises(InvocationTimeout, match="before the request's deadline"):
                await asyncio.wait_for(soon, GATE_SECONDS)
            assert not late.done() and runner.queue_depth == 2
            with pytest.raises(InvocationTimeout, match="before the request's deadline"):
                await asyncio.wait_for(late, GATE_SECONDS)
            assert not patient.done() and runner.queue_depth == 1
            model.release.set()
            assert torch.equal(await first, row(1.0))
            assert torch.equal(await asyncio.wait_for(patient, GATE_SECONDS), row(7.0))
        with pytest.raises(RunnerClosed):
            runner.reserve()

    run(main())
    assert model.calls == [[0.0], [3.0]]


def test_admission_changes_are_reported_once_per_change_of_kind():
    """What the engine tells its HTTP workers: the queue filled, then it has room again."""
    model = Held()
    reports = []

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0, max_queue_size=2)
        async with ModelRunner(model, settings, name="m") as runner:
            runner.watch_admission(reports.append)
            assert runner.refusal() is None
            first = runner.reserve().submit(row(0.0))
            await model.wait_entered()
            queued = [runner.reserve(), runner.reserve()]
            queued[0].submit(row(1.0))
            queued[1].submit(row(2.0))
            await asyncio.sleep(0)
            assert [type(r) for r in reports] == [QueueFull]  # one report for two changes
            assert str(reports[0]) == "model 'm' has 2 requests queued (max_queue_size=2)"
            assert runner.stats.requests_rejected == 0  # refusal() only looks
            queued.pop().withdraw()  # room for one, then full again in the same turn:
            queued.append(runner.reserve())  # the kind stays
            queued[-1].submit(row(3.0))
            await asyncio.sleep(0)
            assert len(reports) == 1
            model.release.set()
            await asyncio.gather(first, *(r.future for r in queued))
            await until(lambda: len(reports) == 2)
            assert reports[1] is None and runner.refusal() is None
        await asyncio.sleep(0)
        assert type(reports[-1]) is RunnerClosed and len(reports) == 3

    run(main())


def test_the_next_call_starts_before_the_last_batchs_answers_are_written():
    """The device never waits on our answers: the next batch is in the worker thread (queued
    behind the running call when it is full, else handed over by the callback that brings
    the call's result) before that result's answers are written. Each caller sees, the
    moment its answer is written, that the runner has already started the call after its own."""
    model = Held()
    records, calls_started_at_answer = [], []

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0)
        async with ModelRunner(model, settings) as runner:
            runner.add_listener(records.append)
            futures = [runner.reserve().submit(row(float(i))) for i in range(3)]
            for future in futures:
                future.add_done_callback(lambda _: calls_started_at_answer.append(
                    runner.instances.calls_started))
            await model.wait_entered()  # the first call is in the model, two are queued
            model.release.set()
            return await asyncio.gather(*futures)

    answers = run(main())
    assert [a[0, 0].item() for a in answers] == [1.0, 3.0, 5.0]
    assert model.calls == [[0.0], [1.0], [2.0]]
    assert calls_started_at_answer[0] >= 2 and calls_started_at_answer[1] == 3
    assert [r.next_call_started for r in records] == [True, True, False]


def test_a_batch_waiting_behind_a_running_call_counts_that_wait_as_queue_time():
    """A full batch handed to the worker thread while the call ahead still runs starts when
    that call ends: its requests' wait there is queue time and its call time is its own, as
    Triton counts them (``queue`` to the start of the call, ``compute_infer`` the call), not the
    two calls together."""
    model = Held()
    records, requests = [], []
    hold_s = 0.2

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0)
        async with ModelRunner(model, settings) as runner:
            runner.add_listener(records.append)
            slots = [runner.reserve() for _ in range(2)]
            futures = [slot.submit(row(float(i))) for i, slot in enumerate(slots)]
            await model.wait_entered()  # the first call runs; the second waits behind it
            await asyncio.sleep(hold_s)  # the call ahead lasts at least this long
            model.release.set()
            await asyncio.gather(*futures)
            requests.extend(slot.queued for slot in slots)

    run(main())
    behind = records[1]
    assert behind.queue_wait_seconds[0] >= hold_s * 0.9, behind
    assert behind.compute_seconds < hold_s / 2, behind
    assert requests[1].started - requests[1].arrival >= hold_s * 0.9
    assert requests[1].ended - requests[1].started < hold_s / 2


def test_a_full_batch_queued_behind_a_call_that_gets_stuck_runs_once_it_can():
    """A full batch waits in the instance's worker thread behind the running call; when that
    call outlives ``call_timeout``, the waiting batch goes back to the queue (it would wait
    for the stuck call), and runs, once, when the instance can work again."""
    model = Held()

    async def main():
        settings = BatchSettings(max_batch_size=1, max_wait=0)
        async with ModelRunner(model, settings, name="m", call_timeout=0.05) as runner:
            first = runner.reserve().submit(row(0.0))
            behind = runner.reserve().submit(row(1.0))
            await model.wait_entered()
            assert runner.queue_depth == 1  # admitted, not running: in the thread's queue
            with pytest.raises(InvocationTimeout):
                await asyncio.wait_for(first, GATE_SECONDS)
            assert runner.queue_depth == 1 and not behind.done()
            assert runner.instances.in_flight() == []  # back in the runner's queue
            model.release.set()
            return await asyncio.wait_for(behind, GATE_SECONDS)

    assert torch.equal(run(main()), row(3.0))
    assert model.calls == [[0.0], [1.0]]


def test_requests_that_arrive_together_are_admitted_as_one_after_another_would_be():
    """An HTTP worker's message to the engine: ``submit_many`` admits what fits, in order, and
    refuses the rest as that many single requests would be refused (counted each)."""
    model = Held()

    async def main():
        settings = BatchSettings(max_batch_size=4, max_wait=0, max_queue_size=3)
        async with ModelRunner(model, settings, name="m") as runner:
            first = runner.reserve().submit(row(0.0))
            await model.wait_entered()
            requests, refusal = runner.submit_many([row(1.0), row(2.0), row(3.0), row(4.0),
                                                    row(5.0)])
            assert len(requests) == 3 and runner.queue_depth == 3
            assert isinstance(refusal, QueueFull)
            assert str(refusal) == "model 'm' has 3 requests queued (max_queue_size=3)"
            assert runner.stats.requests_rejected == 2
            again, full = runner.submit_many([row(6.0)])
            assert again == [] and isinstance(full, QueueFull)
            assert runner.stats.requests_rejected == 3
            requests[1].future.cancel()  # withdrawn: it leaves the queue uncomputed
            await until(lambda: runner.queue_depth == 2)
            model.release.set()
            assert torch.equal(await first, row(1.0))
            answers = await asyncio.gather(requests[0].future, requests[2].future)
            assert [a[0, 0].item() for a in answers] == [3.0, 7.0]
            assert runner.stats.requests_cancelled == 1
        requests, refusal = runner.submit_many([row(7.0), row(8.0)])
        assert requests == [] and isinstance(refusal, RunnerClosed)
        assert runner.stats.requests_rejected == 3  # a closed runner's refusals are not rejections

    run(main())
    assert model.calls == [[0.0], [1.0, 3.0]]


def test_requests_that_arrive_together_share_one_deadline_and_leave_the_queue_at_it():
    """One timer for the group: at the deadline every one still queued is answered with
    :class:`InvocationTimeout` and leaves the queue at once; one answered before is not."""
    model = Held()

    async def main():
        async with one_call_held(model) as (runner, first):
            now = asyncio.get_running_loop().time()
            requests, refusal = runner.submit_many([row(1.0), row(2.0), row(3.0)],
                                                   deadline=now + 0.05)
            assert refusal is None and runner.queue_depth == 3
            requests[0].future.cancel()
            for request in requests[1:]:
                with pytest.raises(InvocationTimeout, match="before the request's deadline"):
                    await asyncio.wait_for(request.future, GATE_SECONDS)
            assert runner.queue_depth == 0
            assert runner.stats.requests_failed == 2 and runner.stats.requests_cancelled == 1
            model.release.set()
            assert torch.equal(await first, row(1.0))

    run(main())
    assert model.calls == [[0.0]]
