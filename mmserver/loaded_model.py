"""A loaded model: everything one model needs to serve, in one object that owns its life.

A :class:`LoadedModel` holds the model folder's resolved functions
(:class:`~mmserver.handler.folder.ModelHandler`), its :class:`ModelRunner` (the batching
queue), the threads that run its own ``input_fn``/``output_fn``, its memory
figure, and :meth:`close`, which drains and frees all of them. It is the served model
(``mmserver.served``) of this process: invocations run through the
:class:`~mmserver.pipeline.InvocationPipeline`, and its answers are the HTTP layer's
builders' (``http.answers``, ``http.triton``) of its plain data (:meth:`info`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mmserver import heap
from mmserver.batching import ModelRunner
from mmserver.batching.pending import QueuedRequest
from mmserver.errors import MMServerError
from mmserver.handler.folder import ModelHandler, RowCodecs
from mmserver.http import answers, triton
from mmserver.http.service import Call
from mmserver.model_info import NOT_LOADED, ModelInfo, ModelStatus
from mmserver.pipeline import Answer, Invocation, InvocationPipeline
from mmserver.wires import ToolkitHeaders, V2Headers
from mmserver.workers import WorkerPool

__all__ = ["NOT_LOADED", "LoadedModel", "ModelInfo", "ModelStatus"]  # the last three: older imports

log = logging.getLogger(__name__)

#: Threads per model for its own input_fn/output_fn: decoding one request while another encodes.
CODEC_THREADS = 2
#: Each load in this process gets the next: what names it to other processes (``RowCodecs``).
_GENERATIONS = itertools.count(1)


class LoadedModel:
    """One model, ready to serve until :meth:`close` (see the module docstring)."""

    def __init__(self, name: str, url: str, path: Path, handler: ModelHandler,
                 runner: ModelRunner, memory_bytes: int, notes: tuple[str, ...] = ()):
        self.name, self.url, self.path = name, url, path
        self.notes = notes
        self.handler = handler
        self.runner = runner
        self.memory_bytes = memory_bytes
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

    # -- the served model (``mmserver.served``) -------------------------------------------

    def admit(self) -> None:
        self.runner.check_admission()

    async def invoke(self, headers: ToolkitHeaders | V2Headers, call: Call,
                     pipeline: InvocationPipeline) -> Answer:
        return await pipeline.run(self, Invocation(
            wire=headers.wire(self.name, self.handler, pipeline.settings.default_accept),
            content_length=call.content_length, read_body=call.read_body,
            body_arrived=call.body_arrived))

    def row_codecs(self) -> RowCodecs | None:
        return self.handler.row_codecs(self.generation)

    def submit_rows(self, inputs: list[Any], pipeline: InvocationPipeline,
                    answered: Callable[[int, QueuedRequest], None]
                    ) -> tuple[list[QueuedRequest], MMServerError | None]:
        return pipeline.submit_rows(self, inputs, answered)

    def watch_admission(self, listener: Callable[[Exception | None], None]) -> None:
        self.runner.watch_admission(listener)

    def count_refusal(self) -> None:
        self.runner.stats.requests_rejected += 1

    def record_stages(self, answers: list[tuple[float, ...]]) -> None:
        add = self.runner.stats.stages.add
        for seconds in answers:
            add(*seconds)

    async def describe(self) -> dict[str, object]:
        return answers.described(self.info())

    async def model_metadata(self) -> dict[str, object]:
        return triton.model_metadata(self)

    async def model_config(self) -> dict[str, object]:
        return triton.model_config(self)

    async def model_statistics(self) -> list[dict[str, object]]:
        return [triton.model_stats(self)]

    def export_metrics(self, metrics: Any) -> None:
        metrics.runner_loaded(self.name, self.memory_bytes, self.runner)

    async def exposition(self) -> bytes:
        return b""  # its series are this process's own

    async def close(self, drain_timeout: float) -> None:
        """Answer accepted requests (at most ``drain_timeout`` s), then free the model.

        A stuck call is not waited for. Freed: the runner's thread, the codec threads,
        the model and its code's modules, and on CUDA the allocator's cache.
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
            heap.release()
            if self.device is not None and self.device.type == "cuda":
                torch.cuda.empty_cache()


class _InvocationInProgress:
    """A plain context manager (a generator-based one costs more on every request)."""

    __slots__ = ("model",)

    def __init__(self, model: LoadedModel):
        self.model = model

    def __enter__(self) -> None:
        self.enter(1)

    def enter(self, count: int) -> None:
        """``count`` invocations begin, each to end with :meth:`ended`."""
        model = self.model
        model._invocations += count
        model._idle.clear()

    def __exit__(self, *exc_info: object) -> None:
        model = self.model
        model._invocations -= 1
        if model._invocations == 0:
            model._idle.set()

    def ended(self, _: object = None) -> None:
        """The invocation ended (a future's callback, for one entered without ``with``)."""
        self.__exit__()
