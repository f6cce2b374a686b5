"""The batching policy alone: made-up queues and clocks, no threads, no sleeps."""

from __future__ import annotations

import dataclasses

import pytest

from mmserver.batching import BatchPlanner, Plan


@dataclasses.dataclass
class Queued:
    rows: int
    arrival: float
    key: str = "3x64x64 float32 cpu"


def planner(policy="timer", max_batch_size=8, max_wait=0.010, concatenate=True) -> BatchPlanner:
    return BatchPlanner(policy=policy, max_batch_size=max_batch_size, max_wait=max_wait,
                        concatenate=concatenate)


@pytest.mark.parametrize("policy", ["timer", "greedy"])
def test_an_empty_queue_waits_for_news(policy):
    assert planner(policy).plan([], now=5.0) == Plan(take=(), wait=None)


def test_timer_waits_until_the_oldest_has_waited_max_wait():
    queue = [Queued(1, arrival=1.000), Queued(1, arrival=1.004)]
    plan = planner("timer").plan(queue, now=1.006)
    assert plan.take == () and plan.wait == pytest.approx(0.004)
    assert planner("timer").plan(queue, now=1.010).take == (0, 1)
    assert planner("timer").plan(queue, now=7.0).take == (0, 1)


def test_timer_runs_at_once_when_the_rows_fill_a_batch():
    queue = [Queued(3, 1.0), Queued(3, 1.0), Queued(2, 1.0), Queued(1, 1.0)]
    assert planner("timer").plan(queue, now=1.0).take == (0, 1, 2)


def test_a_compatible_request_that_does_not_fit_means_waiting_cannot_help():
    queue = [Queued(5, 1.0), Queued(5, 1.0)]
    assert planner("timer").plan(queue, now=1.0).take == (0,)


def test_smaller_requests_behind_a_big_one_fill_the_gap_in_arrival_order():
    queue = [Queued(5, 1.0), Queued(4, 1.0), Queued(2, 1.0), Queued(1, 1.0)]
    assert planner("timer").plan(queue, now=1.0).take == (0, 2, 3)


def test_a_request_larger_than_max_batch_size_runs_alone():
    queue = [Queued(20, 1.0), Queued(1, 1.0)]
    assert planner("timer").plan(queue, now=1.0).take == (0,)


def test_only_requests_with_the_oldests_key_join_it():
    queue = [Queued(1, 1.0, "a"), Queued(1, 1.0, "b"), Queued(1, 1.0, "a"), Queued(1, 1.0, "b")]
    assert planner("greedy").plan(queue, now=1.0).take == (0, 2)
    assert planner("timer").plan(queue, now=1.0).wait == pytest.approx(0.010)


def test_greedy_runs_at_once_when_no_company_is_on_its_way():
    queue = [Queued(1, arrival=1.0)]
    assert planner("greedy", max_wait=10.0).plan(queue, now=1.0).take == (0,)


def test_greedy_waits_for_requests_on_their_way_but_at_most_max_wait():
    queue = [Queued(1, arrival=1.0)]
    greedy = planner("greedy", max_wait=0.2)
    plan = greedy.plan(queue, now=1.05, on_the_way=2)
    assert plan.take == () and plan.wait == pytest.approx(0.15)
    assert greedy.plan(queue, now=1.25, on_the_way=2).take == (0,)


def test_greedy_with_max_wait_zero_never_waits():
    queue = [Queued(1, arrival=1.0)]
    assert planner("greedy", max_wait=0).plan(queue, now=1.0, on_the_way=5).take == (0,)


@pytest.mark.parametrize("policy", ["timer", "greedy"])
def test_closing_runs_what_is_queued_without_waiting(policy):
    queue = [Queued(1, arrival=1.0), Queued(1, arrival=1.0)]
    assert planner(policy, max_wait=30).plan(queue, now=1.0, on_the_way=3,
                                             closing=True).take == (0, 1)


def test_without_concatenation_every_request_runs_alone_oldest_first():
    queue = [Queued(1, 1.0), Queued(1, 1.0), Queued(1, 1.0)]
    assert planner("timer", concatenate=False).plan(queue, now=1.0).take == (0,)


def test_a_batch_is_full_at_the_size_the_sizer_gives():
    queue = [Queued(1, 0.0) for _ in range(20)]
    greedy = planner("greedy", max_batch_size=16, max_wait=0.005)
    assert greedy.plan(queue, now=0.0, on_the_way=5, batch_size=8).take == tuple(range(8))
    assert greedy.plan(queue, now=0.0, on_the_way=5).take == tuple(range(16))
    assert greedy.plan(queue, now=0.0, on_the_way=5, batch_size=64).take == tuple(range(16))
    timer = planner("timer", max_batch_size=16, max_wait=0.005)
    assert timer.plan(queue[:8], now=0.0, batch_size=8).take == tuple(range(8))
    assert timer.plan(queue[:8], now=0.0).wait == pytest.approx(0.005)
    assert timer.plan([Queued(12, 0.0)], now=0.0, batch_size=8).take == (0,)


def test_a_planner_concatenates_unless_told_not_to():
    queue = [Queued(1, 1.0), Queued(1, 1.0), Queued(1, 1.0)]
    default = BatchPlanner(policy="greedy", max_batch_size=8, max_wait=0.010)
    assert default.plan(queue, now=1.0).take == (0, 1, 2)
    assert planner("greedy", concatenate=False).plan(queue, now=1.0).take == (0,)


# -- the token budget (text models: rows of different lengths) ---------------------------


@dataclasses.dataclass
class Sentences:
    rows: int
    longest: int
    arrival: float = 1.0
    key: str = "sequences"


def token_planner(policy="timer", max_batch_size=64, max_batch_tokens=100) -> BatchPlanner:
    return BatchPlanner(policy=policy, max_batch_size=max_batch_size, max_wait=0.010,
                        max_batch_tokens=max_batch_tokens)


def test_a_batch_holds_at_most_the_token_budget_padded_to_its_longest():
    # 2 rows of 10 tokens, then 1 of 30: 3 x 30 = 90 fits; 2 more rows would make 5 x 30 = 150,
    # and 1 more 4 x 30 = 120, so the batch is full at once, without waiting.
    queue = [Sentences(2, 10), Sentences(1, 30), Sentences(2, 5), Sentences(1, 4)]
    assert token_planner().plan(queue, now=1.0) == Plan(take=(0, 1))


def test_short_rows_join_while_the_padded_batch_fits():
    queue = [Sentences(1, 20), Sentences(3, 20), Sentences(1, 50), Sentences(1, 10)]
    # 4 x 20 = 80; the 50-token row would make 5 x 50; the 10-token row makes 5 x 20 = 100.
    assert token_planner().plan(queue, now=1.0) == Plan(take=(0, 1, 3))


def test_a_request_over_the_token_budget_runs_alone_at_once():
    queue = [Sentences(4, 40), Sentences(1, 3)]
    for policy in ("timer", "greedy"):
        assert token_planner(policy).plan(queue, now=1.0) == Plan(take=(0,))


def test_a_batch_that_reaches_the_token_budget_does_not_wait_for_company():
    assert token_planner("timer").plan([Sentences(2, 50)], now=1.0) == Plan(take=(0,))
    assert token_planner("timer").plan([Sentences(2, 49)], now=1.0).wait == pytest.approx(0.010)


def test_without_a_token_budget_lengths_do_not_matter():
    queue = [Sentences(2, 400), Sentences(3, 500)]
    assert token_planner(max_batch_tokens=0).plan(queue, now=1.0).take == ()
    assert token_planner(max_batch_tokens=0, max_batch_size=5).plan(queue, now=1.0) == \
        Plan(take=(0, 1))
