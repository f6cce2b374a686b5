"""The knobs of one ``ModelRunner``, defined and checked in one place.

The environment (``MMSERVER_*``), the command line and a model's
``mmserver.json`` all build a :class:`BatchSettings`; nothing else repeats its
defaults or its checks. See the package docstring of ``mmserver.batching`` for
what each knob does to latency and throughput.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

POLICIES = ("greedy", "timer")
SIZINGS = ("max", "measured")


@dataclasses.dataclass(frozen=True)
class BatchSettings:
    """The knobs of one runner, checked once here (see the module docstring)."""

    max_batch_size: int = 16
    max_wait: float = 0.005
    max_queue_size: int = 256
    policy: str = "greedy"
    batch_sizing: str = "max"

    def __post_init__(self):
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int) \
                or self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1, got {self.max_batch_size!r}")
        if isinstance(self.max_wait, bool) or not isinstance(self.max_wait, (int, float)) \
                or not (self.max_wait >= 0 and math.isfinite(self.max_wait)):
            raise ValueError(f"max_wait must be a finite number of seconds >= 0, "
                             f"got {self.max_wait!r}")
        if isinstance(self.max_queue_size, bool) or not isinstance(self.max_queue_size, int) \
                or self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be an integer >= 1, got {self.max_queue_size!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.batch_sizing not in SIZINGS:
            raise ValueError(f"batch_sizing must be one of {SIZINGS}, got {self.batch_sizing!r}")

    #: Keys of a model's ``mmserver.json`` that override these settings (wait in ms there).
    OVERRIDE_KEYS = ("max_batch_size", "max_wait_ms", "max_queue_size", "policy", "batch_sizing")

    def overridden(self, overrides: Mapping[str, object]) -> BatchSettings:
        """These settings with a model's ``mmserver.json`` on top; unknown keys are refused."""
        unknown = set(overrides) - set(self.OVERRIDE_KEYS)
        if unknown:
            raise ValueError(f"unknown batching settings {sorted(unknown)}; "
                             f"known: {sorted(self.OVERRIDE_KEYS)}")
        changes = {k: v for k, v in overrides.items() if k != "max_wait_ms"}
        if "max_wait_ms" in overrides:
            wait_ms = overrides["max_wait_ms"]
            if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)):
                raise ValueError(f"max_wait_ms must be a number, got {wait_ms!r}")
            changes["max_wait"] = wait_ms / 1000.0
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, object]:
        """The ``batching`` object of ``GET /models/{name}``."""
        return {"maxBatchSize": self.max_batch_size, "maxWaitMs": self.max_wait * 1000.0,
                "maxQueueSize": self.max_queue_size, "policy": self.policy,
                "batchSizing": self.batch_sizing}
