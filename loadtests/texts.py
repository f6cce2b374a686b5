"""Texts of mixed lengths for a text model, made here (no data set), and a simulated GPU that
charges a padded batch by its padded tokens.

The workload (:func:`texts`): each text is drawn as *short* with probability
``1 - long_fraction`` and *long* otherwise; a short text has a uniform number of words in
:data:`SHORT_WORDS`, a long one in :data:`LONG_WORDS`, each word drawn uniformly from
:data:`WORDS`. Seeded, so a run's texts are the same every time. ``bench/text_batching.py`` and
appendix 14 both use it.

:class:`SimulatedTokenDevice` wraps ``mmserver.harness.simulated_device.SimulatedDevice`` for a
collated text batch (``input_ids`` and ``attention_mask``, ``[rows, longest]``): each padded
token is one of the device's rows, so its t is a function of padded tokens, with the shape
:class:`FlatThenLinear` gives it. Its parameters are assumptions of the caller, not a
measurement of a GPU; its label says so.

Only the standard library at import (torch when a device is built): ``locust -f loadtests``
imports every module of this folder whose name does not start with ``_``.
"""

from __future__ import annotations

import dataclasses
import random

WORDS = ("model server batch token padding request latency queue sentence length throughput "
         "embedding vector short long text call budget wait answer client").split()
#: Words in a short text and in a long one, both ends included.
SHORT_WORDS = (5, 20)
LONG_WORDS = (100, 180)


def texts(count: int, long_fraction: float, seed: int = 0) -> list[str]:
    """``count`` texts, a ``long_fraction`` of them long on average (the module docstring)."""
    if not 0.0 <= long_fraction <= 1.0:
        raise ValueError(f"long_fraction must be within [0, 1], got {long_fraction!r}")
    generator = random.Random(seed)
    made = []
    for _ in range(count):
        low, high = LONG_WORDS if generator.random() < long_fraction else SHORT_WORDS
        made.append(" ".join(generator.choice(WORDS) for _ in range(generator.randint(low, high))))
    return made


def describe_workload(long_fraction: float) -> str:
    """The workload's distribution in words, for the records' conditions and the prose."""
    return (f"{1 - long_fraction:.0%} short ({SHORT_WORDS[0]}–{SHORT_WORDS[1]} words), "
            f"{long_fraction:.0%} long ({LONG_WORDS[0]}–{LONG_WORDS[1]} words), uniform within each")


@dataclasses.dataclass(frozen=True)
class FlatThenLinear:
    """t(padded tokens): ``fixed_seconds`` up to ``flat_tokens``, then ``per_token_seconds``
    for each token past it: a device that is not yet full below ``flat_tokens``."""

    fixed_seconds: float
    flat_tokens: int
    per_token_seconds: float

    @property
    def description(self) -> str:
        return (f"device with t = {self.fixed_seconds * 1e3:g} ms up to {self.flat_tokens} padded tokens, "
                f"then {self.per_token_seconds * 1e6:g} µs per token more (assumed, not measured)")

    def __call__(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        return self.fixed_seconds + self.per_token_seconds * max(0.0, tokens - self.flat_tokens)


class SimulatedTokenDevice:
    """A collated text batch on a ``SimulatedDevice`` whose rows are the batch's padded tokens
    (rows x longest): the call sleeps ``t(padded tokens)`` and holds no CPU. Called as
    ``device(batch)`` with the dict ``mmserver.batching.sequences.collate`` builds."""

    def __init__(self, cost: FlatThenLinear, stream: str = "simulated-token-device"):
        from mmserver.harness.simulated_device import SimulatedDevice

        self.cost = cost
        self.device = SimulatedDevice(cost, input_features=1, stream=stream)
        self.label = self.device.label

    def __call__(self, batch):
        ids = batch["input_ids"]
        return self.device(ids.reshape(-1, 1).float())
