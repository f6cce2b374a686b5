"""The worker pools that run model calls: what a thread keeps after a call.

A stopping server exits through Python's finalization only when no call is counted
as running (``exit_past_abandoned_calls``). That is safe only if a thread counted
idle holds nothing a call made: a tensor it frees later retakes the interpreter
lock inside torch's C++ and aborts the process (exit -6) once finalization began.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref

import pytest
import torch

from mmserver.workers import UserCodeExit, WorkerPool, calls_running

WAIT_S = 10  # how long a thread may take to count its call as finished


def wait_until_idle() -> None:
    deadline = time.monotonic() + WAIT_S
    while calls_running() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert calls_running() == 0


def test_a_thread_counted_idle_holds_nothing_its_call_made():
    made = []

    def call(rows: torch.Tensor) -> torch.Tensor:
        answer = rows * 2
        made.append(weakref.ref(answer))
        return answer

    async def main() -> weakref.ref:
        pool = WorkerPool("test-holds")
        rows = torch.ones(4, 3)
        argument = weakref.ref(rows)
        answer = await pool.run(call, rows)
        assert answer.tolist() == [[2.0] * 3] * 4
        del rows, answer
        await asyncio.to_thread(wait_until_idle)
        return argument

    argument = asyncio.run(main())
    gc.collect()
    assert argument() is None, "the worker thread still holds the call's argument"
    assert made[0]() is None, "the worker thread still holds the call's answer"


def test_sys_exit_in_a_call_fails_that_call_and_not_the_thread():
    def leaves():
        raise SystemExit(3)

    async def main():
        pool = WorkerPool("test-exit")
        with pytest.raises(UserCodeExit, match="SystemExit: 3"):
            await pool.run(leaves)
        assert await pool.run(sum, [1, 2]) == 3  # the same thread serves on
        pool.close()

    asyncio.run(main())
