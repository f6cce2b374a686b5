"""The memory rule: what a model is counted as using, and when another one does not fit (507).

A model's memory figure is taken in two steps, both here:

1. **Before loading**, from its files: the size of its weight files times
   :data:`MEMORY_ESTIMATE_FACTOR`. A model whose estimate does not fit is
   refused before any of its code runs.
2. **After loading**, measured: the largest of the estimate, the bytes of the
   model's parameters and buffers, and the growth of the process's (on CUDA,
   the device's) memory across the load, so that what ``model_fn`` allocates
   beyond the weight files counts too.

A :class:`CapacityPolicy` holds the two limits, the number of models
(``MMSERVER_MAX_MODELS``) and the memory budget (``MMSERVER_MEMORY_BUDGET_MB``,
by default a share of the memory free at start-up, of the GPU for CUDA), and
raises :class:`InsufficientResources` when a model does not fit beside the
others, as SageMaker's contract asks (507, so that the platform unloads a model
and retries).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from mmserver.errors import InsufficientResources
from mmserver.resources import available_memory_bytes, memory_in_use_bytes

T = TypeVar("T")

#: Files whose size stands for the model's weights when we estimate its memory before loading.
WEIGHT_SUFFIXES = (".pt", ".pt2", ".pth", ".bin", ".safetensors", ".ckpt")
#: Loaded weights take about their size on disk; the margin covers buffers and the runtime.
MEMORY_ESTIMATE_FACTOR = 1.2
#: Share of the memory available at start-up that loaded models may use by default.
DEFAULT_MEMORY_BUDGET_SHARE = 0.5


def estimated_memory_bytes(model_dir: Path) -> int:
    """Before loading: the weights' size on disk, with a margin."""
    size = sum(p.stat().st_size for p in model_dir.rglob("*")
               if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    return int(size * MEMORY_ESTIMATE_FACTOR)


def parameter_bytes(model: Any) -> int:
    """Bytes held by the model's parameters and buffers (0 when it has none we can see)."""
    total = 0
    for getter in ("parameters", "buffers"):
        method = getattr(model, getter, None)
        if not callable(method):
            continue
        try:
            total += sum(t.numel() * t.element_size() for t in method())
        except Exception:  # noqa: BLE001 - an opaque model simply reports 0
            return total
    return total


def measured_load(device: torch.device, load: Callable[[], T],
                  model_of: Callable[[T], Any]) -> tuple[T, int]:
    """Run ``load()`` and return it with the memory it took (the larger of the two readings).

    The two readings: the growth of memory in use on ``device`` across the call, and the
    bytes of the loaded model's parameters and buffers (``model_of(result)``).
    """
    before = memory_in_use_bytes(device)
    loaded = load()
    grown = memory_in_use_bytes(device) - before
    return loaded, max(grown, parameter_bytes(model_of(loaded)))


def default_memory_budget_bytes(device: torch.device) -> int:
    """A share of the memory free now: of the GPU for CUDA models, else of RAM (container
    limits included)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * DEFAULT_MEMORY_BUDGET_SHARE)
    return int(available_memory_bytes() * DEFAULT_MEMORY_BUDGET_SHARE)


@dataclasses.dataclass(frozen=True)
class CapacityPolicy:
    """The two limits on loaded models; each check raises :class:`InsufficientResources`."""

    memory_budget_bytes: int
    max_models: int | None = None

    def check_room(self, models_present: int) -> None:
        """One more model may be loaded beside ``models_present`` (loaded or loading)."""
        if self.max_models is not None and models_present >= self.max_models:
            raise InsufficientResources(
                f"{models_present} models are loaded or loading, the most allowed "
                f"(MMSERVER_MAX_MODELS={self.max_models}); unload one first")

    def check_memory(self, needed_bytes: int, others_bytes: int, how: str) -> None:
        """``needed_bytes`` (``how``: estimated or measured) fits beside the others' figures."""
        if others_bytes + needed_bytes > self.memory_budget_bytes:
            raise InsufficientResources(
                f"the model needs {needed_bytes / 2**20:.1f} MiB ({how}) but only "
                f"{max(0, self.memory_budget_bytes - others_bytes) / 2**20:.1f} MiB of the "
                f"{self.memory_budget_bytes / 2**20:.1f} MiB budget is free "
                "(MMSERVER_MEMORY_BUDGET_MB); unload a model first")
