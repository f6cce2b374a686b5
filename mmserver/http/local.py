"""The models of this process: the :class:`~mmserver.http.service.ModelService` of ``mmserver serve``.

A thin layer over the :class:`~mmserver.registry.ModelRegistry` (loading, the memory
rule, unloading) and the :class:`~mmserver.pipeline.InvocationPipeline` (admission,
the body, the queue, the deadline); the aiohttp host (``http.app``) serves it.

Each model is a served model (``mmserver.served``), whatever its kind: the registry
builds it, and this service calls its protocol. A model with ``isolation: process`` runs
in a child process of this one (``engine.isolated``): its operations go there, and its
metrics are merged into this process's. A model whose process died and could not load
it again (or, under ``--http-workers``, that killed the engine as it loaded) is
*failed* (:attr:`LocalService.failed`): described with the reason, invoked 404 with it,
until it is loaded again or deleted. Once SIGTERM has begun to drain the models, an
invocation that has not reached its model's queue is refused 503 (``ShuttingDown``).
"""

from __future__ import annotations

from collections.abc import Callable

from mmserver.config import Settings
from mmserver.engine.journal import Failure
from mmserver.errors import MMServerError, ModelNotFound, RunnerClosed, ShuttingDown
from mmserver.handler.folder import RowCodecs
from mmserver.http import answers
from mmserver.http.requests import SINGLE_MODEL_NAME
from mmserver.http.service import Call
from mmserver.metrics import Metrics, merged_exposition
from mmserver.model_info import ModelInfo, ModelStatus
from mmserver.pipeline import Answer, InvocationPipeline
from mmserver.registry import ModelRegistry
from mmserver.served import ServedModel
from mmserver.wires import ToolkitHeaders, V2Headers

#: What a request refused during shutdown reads.
SHUTTING_DOWN_MESSAGE = "the server is shutting down; send the request to another instance"


class LocalService:
    """Every model in this process and its isolated models' processes, under one server's
    settings. ``isolating=False``: an isolated model's own engine, which isolates nothing."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None, *,
                 isolating: bool = True):
        self.settings = settings
        self.metrics = metrics or Metrics()
        #: Called with each model as it is loaded (True) and unloaded (False).
        self.model_listeners: list[Callable[[ServedModel, bool], None]] = [
            lambda model, loaded: (self.metrics.model_loaded if loaded
                                   else self.metrics.model_unloaded)(model)]
        self.registry = ModelRegistry(
            settings, on_loaded=lambda model: self._changed(model, True),
            on_unloaded=lambda model: self._changed(model, False),
            isolate_in=LocalService if isolating else None,
            on_restart=lambda model: self.metrics.model_restarts.labels(model.name).inc(),
            on_failed=self._failed)
        self.pipeline = InvocationPipeline(settings)
        #: Models that are not loaded because their process died (module docstring).
        self.failed: dict[str, Failure] = {}
        #: Called when :attr:`failed` changes (the engine writes its journal).
        self.on_change: Callable[[], None] = lambda: None

    def _changed(self, model: ServedModel, loaded: bool) -> None:
        for listener in self.model_listeners:
            listener(model, loaded)

    def _failed(self, name: str, url: str, reason: str) -> None:
        self.failed[name] = Failure(url, reason)
        self.on_change()

    def _not_serving(self, name: str) -> MMServerError:
        """Why model ``name`` does not serve: once shutdown has begun, 503 (the model is
        draining, not missing); else 404, with the reason when it failed."""
        if self.registry.closing:
            return ShuttingDown(SHUTTING_DOWN_MESSAGE)
        failure = self.failed.get(name)
        why = f": {failure.reason}" if failure is not None else ""
        return ModelNotFound(f"model {name!r} is not loaded{why}")

    def serving(self, name: str) -> ServedModel:
        """The model ``name`` while it serves; else :meth:`_not_serving`'s error."""
        try:
            return self.registry.get(name)
        except ModelNotFound:
            raise self._not_serving(name) from None

    async def row_codecs(self, name: str) -> RowCodecs | None:
        """How another process may decode model ``name``'s requests into rows and encode its
        answers (a row-wise model held here), else None: that process sends bodies whole."""
        return self.serving(name).row_codecs()

    async def load(self, name: str, url: str) -> ServedModel:
        model = await self.registry.load(name, url)
        self._loaded_again(name)
        return model

    def _loaded_again(self, name: str) -> None:
        if self.failed.pop(name, None) is not None:
            self.on_change()

    async def page(self, limit: int | None,
                   next_page_token: str | None) -> tuple[list[ServedModel], str | None]:
        return self.registry.page(limit, next_page_token)

    async def describe(self, name: str) -> dict[str, object]:
        try:
            entry = self.registry.entry(name)
        except ModelNotFound:
            failure = self.failed.get(name)
            if failure is None:
                raise
            return answers.described_failed(name, failure.url, failure.reason)
        return await entry.describe()

    async def unload(self, name: str) -> None:
        if self.failed.pop(name, None) is not None:
            self.on_change()
            return
        await self.registry.unload(name)

    def told(self, error: MMServerError) -> MMServerError:
        """What a client is told of ``error`` from a model's runner: a runner that the drain
        closed (``RunnerClosed`` once shutdown has begun) means the instance is going away,
        503 ``ShuttingDown``, not a missing model. The engine's row path tells its workers
        the same (``engine.workers``)."""
        if isinstance(error, RunnerClosed) and self.registry.closing:
            return ShuttingDown(SHUTTING_DOWN_MESSAGE)
        return error

    async def invoke(self, name: str, headers: ToolkitHeaders | V2Headers, call: Call
                     ) -> Answer:
        model = self.serving(name)
        try:
            return await model.invoke(headers, call, self.pipeline)
        except RunnerClosed as error:
            raise self.told(error) from None

    async def status(self, name: str) -> ModelStatus:
        return self.registry.info(name).status

    async def model_metadata(self, name: str) -> dict[str, object]:
        return await self.serving(name).model_metadata()

    async def model_config(self, name: str) -> dict[str, object]:
        return await self.serving(name).model_config()

    async def model_statistics(self, name: str | None) -> list[dict[str, object]]:
        models = [self.serving(name)] if name is not None else [
            model for model in self.registry.ready() if model.status == ModelStatus.READY]
        stats = []
        for model in models:
            stats.extend(await model.model_statistics())
        return stats

    async def index(self) -> list[ModelInfo]:
        return self.registry.index()

    async def load_folder(self, name: str) -> None:
        await self.registry.load_folder(name)
        self._loaded_again(name)

    async def exposition(self) -> bytes:
        """This process's metrics, and each model's own series kept by another process (an
        isolated model's, from its process)."""
        own = self.metrics.exposition()
        parts = [(own, lambda labels: labels)]
        for model in self.registry.ready():
            theirs = await model.exposition()
            if theirs:
                parts.append((theirs, lambda labels, name=model.name: (
                    labels if labels.get("model") == name else None)))
        return merged_exposition(parts) if len(parts) > 1 else own

    def count_refusal(self, name: str) -> None:
        """An HTTP worker refused an invocation of model ``name`` with a full queue, as the
        engine had told it to, before reading its body: a rejection, counted where the
        model counts its own (its runner's statistics)."""
        try:
            model = self.registry.get(name)
        except ModelNotFound:
            return  # unloaded since
        model.count_refusal()

    def record_stages(self, name: str, answers: list[tuple[float, ...]]) -> None:
        """Answers an HTTP worker encoded, each with its seconds per stage
        (``RequestStages.add``'s arguments), into the model's Triton statistics."""
        try:
            model = self.registry.get(name)
        except ModelNotFound:
            return  # unloaded since
        model.record_stages(answers)

    def count_invocation(self, name: str, status: int, seconds: float,
                         unavailable: str | None = None) -> None:
        """One invocation answered, with its status and seconds (and a 503's reason), into
        the request metrics."""
        self.metrics.request_done(name, status, seconds, unavailable)

    async def start(self) -> None:
        """Load the models the settings name (single-model mode's, then ``preload``)."""
        settings, registry = self.settings, self.registry
        if not settings.multi_model:
            await registry.load_single(SINGLE_MODEL_NAME, settings.single_model_dir)
        for name, url in settings.preload:
            await registry.load(name, url)

    async def close(self) -> None:
        """SIGTERM: answer accepted requests, leaving time to exit before SageMaker's SIGKILL."""
        await self.registry.close(drain_timeout=max(1.0, self.settings.shutdown_timeout_seconds
                                                    - 5))
        self.pipeline.close()
