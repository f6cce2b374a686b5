"""What a model is and does now, as plain data: :class:`ModelInfo` (its status from ``status``).

Below every kind of served model (``loaded_model``, ``engine.isolated``) and the HTTP
answers built from it (``http.answers``), so that each may import it; the HTTP layer
names the keys.
"""

from __future__ import annotations

import dataclasses

import torch

from mmserver.batching import BatchSettings, RunnerStats
from mmserver.status import NOT_LOADED, ModelStatus  # noqa: F401 - re-exported


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What a model is and does now, as plain data (the HTTP layer names the keys)."""

    name: str
    url: str
    status: ModelStatus
    device: torch.device | None = None
    memory_bytes: int | None = None
    batching: BatchSettings | None = None
    queue_depth: int = 0
    stats: RunnerStats | None = None
    #: With ``batch_sizing="measured"``: the size the model's own calls serve fastest.
    measured_batch_size: int | None = None
    #: While unhealthy: how long the stuck call has run, and the limit it passed.
    stuck_seconds: float | None = None
    call_timeout_seconds: float | None = None
    #: Seconds each instance has spent running batches.
    instance_busy_seconds: tuple[float, ...] = ()
    #: Why the model runs other than asked (one instance for a script not declared thread-safe).
    notes: tuple[str, ...] = ()
