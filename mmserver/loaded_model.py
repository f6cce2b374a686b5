"""A loaded model: everything one model needs to serve, in one object that owns its life.

A :class:`LoadedModel` holds the model folder's resolved functions
(:class:`~mmserver.handler.folder.ModelHandler`), its :class:`ModelRunner` (the batching
queue), the threads that run its own ``input_fn``/``output_fn``, its memory
figure, and :meth:`close`, which drains and frees all of them. The registry, both
protocols' routes and any other host use it alike; nothing here knows HTTP.
:meth:`info` returns plain data that the HTTP layer shapes into its answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import gc
import itertools
import logging
from pathlib import Path

import torch

from mmserver.batching import BatchSettings, ModelRunner, RunnerStats
from mmserver.handler.folder import ModelHandler
from mmserver.handler.requirements import InstalledRequirements
from mmserver.workers import WorkerPool

log = logging.getLogger(__name__)

#: Threads per model for its own input_fn/output_fn: decoding one request while another encodes.
CODEC_THREADS = 2
#: Each load in this process gets the next: what names it to other processes (``RowCodecs``).
_GENERATIONS = itertools.count(1)


class ModelStatus(enum.StrEnum):
    """Where a model is in its life; a string, so answers and logs show its value as it is."""

    LOADING = "loading"
    READY = "ready"
    #: A call into the model is stuck past its time limit; new requests get 503.
    UNHEALTHY = "unhealthy"
    UNLOADING = "unloading"
    #: In the registry's index only: a folder of the model roots no model is loaded from.
    NOT_LOADED = "not loaded"


NOT_LOADED = ModelStatus.NOT_LOADED


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


class LoadedModel:
    """One model, ready to serve until :meth:`close` (see the module docstring)."""

    def __init__(self, name: str, url: str, path: Path, handler: ModelHandler,
                 runner: ModelRunner, memory_bytes: int, notes: tuple[str, ...] = (),
                 packages: InstalledRequirements | None = None):
        self.name, self.url, self.path = name, url, path
        self.notes = notes
        self.handler = handler
        self.runner = runner
        self.memory_bytes = memory_bytes
        #: The folder its code/requirements.txt was installed into, shared by file hash.
        self.packages = packages
        #: Runs this model's own input_fn/output_fn, so a stuck one holds no other model's thread.
        self.codec_pool = WorkerPool(f"{name}-codec", workers=CODEC_THREADS)
        self.unloading = False
        #: This load of the model, among every load in this process.
        self.generation = next(_GENERATIONS)
        self._invocations = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def device(self) -> torch.device | None:
        return self.runner.device

    @property
    def status(self) -> ModelStatus:
        if self.unloading:
            return ModelStatus.UNLOADING
        return ModelStatus.UNHEALTHY if self.runner.stuck_seconds else ModelStatus.READY

    async def start(self) -> None:
        await self.runner.start()

    def invocation(self) -> _InvocationInProgress:
        """``with model.invocation():`` marks one in progress; :meth:`close` waits for the last."""
        return _InvocationInProgress(self)

    def info(self) -> ModelInfo:
        runner = self.runner
        return ModelInfo(
            name=self.name, url=self.url, status=self.status, device=runner.device,
            memory_bytes=self.memory_bytes, batching=runner.settings,
            queue_depth=runner.queue_depth, stats=runner.stats,
            measured_batch_size=runner.sizer.best if runner.sizer is not None else None,
            stuck_seconds=runner.stuck_seconds,
            call_timeout_seconds=runner.call_timeout,
            instance_busy_seconds=tuple(e.busy_seconds for e in runner.instances.executors),
            notes=self.notes)

    async def close(self, drain_timeout: float) -> None:
        """Answer accepted requests (at most ``drain_timeout`` s), then free the model.

        A stuck call is not waited for. Freed: the runner's thread, the codec threads,
        the model and its code's modules, on CUDA the allocator's cache, and the
        folder of its installed requirements once no other model uses it.
        """
        self.unloading = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout
        try:
            await self.runner.stop(drain_timeout)
            if self._invocations:  # answered by the runner, maybe still in output_fn
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._idle.wait(), max(0.0, deadline - loop.time()))
        finally:
            self.handler.close()
            for executor in self.runner.instances.executors:  # stopped: the model may go
                executor.model = None
            self.codec_pool.close()
            gc.collect()
            if self.device is not None and self.device.type == "cuda":
                torch.cuda.empty_cache()
            if self.packages is not None:  # its modules are gone: the folder may go too
                await self.packages.release()


class _InvocationInProgress:
    """A plain context manager (a generator-based one costs more on every request)."""

    __slots__ = ("model",)

    def __init__(self, model: LoadedModel):
        self.model = model

    def __enter__(self) -> None:
        model = self.model
        model._invocations += 1
        model._idle.clear()

    def __exit__(self, *exc_info: object) -> None:
        model = self.model
        model._invocations -= 1
        if model._invocations == 0:
            model._idle.set()

    def ended(self, _: object = None) -> None:
        """The invocation ended (a future's callback, for one entered without ``with``)."""
        self.__exit__()
