"""The models of this process: the :class:`~mmserver.http.service.ModelService` of ``mmserver serve``.

A thin layer over the :class:`~mmserver.registry.ModelRegistry` (loading, the memory
rule, unloading) and the :class:`~mmserver.pipeline.InvocationPipeline` (admission,
the body, the queue, the deadline); the aiohttp host (``http.app``) serves it.

A model with ``isolation: process`` runs in a child process of this one
(:class:`~mmserver.engine.isolated.IsolatedModel`): its operations go there, and its
metrics are merged into this process's. A model whose process died and could not load
it again (or, under ``--http-workers``, that killed the engine as it loaded) is
*failed* (:attr:`LocalService.failed`): described with the reason, invoked 404 with it,
until it is loaded again or deleted.
"""

from __future__ import annotations

from collections.abc import Callable

from mmserver.config import Settings
from mmserver.engine.isolated import IsolatedModel
from mmserver.handler.folder import RowCodecs
from mmserver.engine.journal import Failure
from mmserver.errors import ModelNotFound
from mmserver.http import answers, triton
from mmserver.http.requests import SINGLE_MODEL_NAME
from mmserver.http.service import Call
from mmserver.loaded_model import LoadedModel, ModelInfo, ModelStatus
from mmserver.metrics import Metrics, merged_exposition
from mmserver.pipeline import Answer, Invocation, InvocationPipeline
from mmserver.registry import ModelRegistry
from mmserver.wires import ToolkitHeaders, V2Headers


class LocalService:
    """Every model in this process and its isolated models' processes, under one server's
    settings. ``isolating=False``: an isolated model's own engine, which isolates nothing."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None, *,
                 isolating: bool = True):
        self.settings = settings
        self.metrics = metrics or Metrics()
        #: Called with each model as it is loaded (True) and unloaded (False).
        self.model_listeners: list[Callable[[LoadedModel | IsolatedModel, bool], None]] = [
            lambda model, loaded: (self.metrics.model_loaded if loaded
                                   else self.metrics.model_unloaded)(model)]
        self.registry = ModelRegistry(
            settings, on_loaded=lambda model: self._changed(model, True),
            on_unloaded=lambda model: self._changed(model, False), isolating=isolating,
            on_restart=lambda model: self.metrics.model_restarts.labels(model.name).inc(),
            on_failed=self._failed)
        self.pipeline = InvocationPipeline(settings)
        #: Models that are not loaded because their process died (module docstring).
        self.failed: dict[str, Failure] = {}
        #: Called when :attr:`failed` changes (the engine writes its journal).
        self.on_change: Callable[[], None] = lambda: None

    def _changed(self, model: LoadedModel | IsolatedModel, loaded: bool) -> None:
        for listener in self.model_listeners:
            listener(model, loaded)

    def _failed(self, name: str, url: str, reason: str) -> None:
        self.failed[name] = Failure(url, reason)
        self.on_change()

    def _not_loaded(self, name: str) -> ModelNotFound:
        """The 404 of a model that is not loaded, with the reason when it failed."""
        failure = self.failed.get(name)
        why = f": {failure.reason}" if failure is not None else ""
        return ModelNotFound(f"model {name!r} is not loaded{why}")

    def serving(self, name: str) -> LoadedModel | IsolatedModel:
        """The model ``name`` while it serves; else 404, with the reason when it failed."""
        try:
            return self.registry.get(name)
        except ModelNotFound:
            raise self._not_loaded(name) from None

    async def row_codecs(self, name: str) -> RowCodecs | None:
        """How another process may decode model ``name``'s requests into rows and encode its
        answers (a row-wise model held here), else None: that process sends bodies whole."""
        model = self.serving(name)
        return model.handler.row_codecs(model.generation) if isinstance(model, LoadedModel) \
            else None

    async def load(self, name: str, url: str) -> LoadedModel | IsolatedModel:
        model = await self.registry.load(name, url)
        self._loaded_again(name)
        return model

    def _loaded_again(self, name: str) -> None:
        if self.failed.pop(name, None) is not None:
            self.on_change()

    async def page(self, limit: int | None,
                   next_page_token: str | None) -> tuple[list[LoadedModel], str | None]:
        return self.registry.page(limit, next_page_token)

    async def describe(self, name: str) -> dict[str, object]:
        try:
            info = self.registry.info(name)
        except ModelNotFound:
            failure = self.failed.get(name)
            if failure is None:
                raise
            return {"modelName": name, "modelUrl": failure.url, "status": "failed",
                    "failure": failure.reason}
        model = next((m for m in self.registry.ready() if m.name == name), None)
        if isinstance(model, IsolatedModel):
            return await model.describe()
        return answers.described(info)

    async def unload(self, name: str) -> None:
        if self.failed.pop(name, None) is not None:
            self.on_change()
            return
        await self.registry.unload(name)

    async def invoke(self, name: str, headers: ToolkitHeaders | V2Headers, call: Call
                     ) -> Answer:
        model = self.serving(name)
        if isinstance(model, IsolatedModel):
            return await model.invoke(headers, call)
        return await self.pipeline.run(model, Invocation(
            wire=headers.wire(model.name, model.handler, self.settings.default_accept),
            content_length=call.content_length, read_body=call.read_body,
            body_arrived=call.body_arrived))

    async def status(self, name: str) -> ModelStatus:
        return self.registry.info(name).status

    async def model_metadata(self, name: str) -> dict[str, object]:
        model = self.serving(name)
        if isinstance(model, IsolatedModel):
            return await model.model_metadata()
        return triton.model_metadata(model)

    async def model_config(self, name: str) -> dict[str, object]:
        model = self.serving(name)
        if isinstance(model, IsolatedModel):
            return await model.model_config()
        return triton.model_config(model)

    async def model_statistics(self, name: str | None) -> list[dict[str, object]]:
        models = [self.serving(name)] if name is not None else [
            model for model in self.registry.ready() if model.status == ModelStatus.READY]
        stats = []
        for model in models:
            if isinstance(model, IsolatedModel):
                stats.extend(await model.model_statistics())
            else:
                stats.append(triton.model_stats(model))
        return stats

    async def index(self) -> list[ModelInfo]:
        return self.registry.index()

    async def load_folder(self, name: str) -> None:
        await self.registry.load_folder(name)
        self._loaded_again(name)

    async def exposition(self) -> bytes:
        """This process's metrics, and each isolated model's own series from its process."""
        own = self.metrics.exposition()
        isolated = [model for model in self.registry.ready() if isinstance(model, IsolatedModel)]
        if not isolated:
            return own
        parts = [(own, lambda labels: labels)]
        for model in isolated:
            parts.append((await model.exposition(), lambda labels, name=model.name: (
                labels if labels.get("model") == name else None)))
        return merged_exposition(parts)

    def count_refusal(self, name: str) -> None:
        """An HTTP worker refused an invocation of model ``name`` with a full queue, as the
        engine had told it to, before reading its body: a rejection, as one process counts."""
        try:
            model = self.registry.get(name)
        except ModelNotFound:
            return  # unloaded since
        if isinstance(model, LoadedModel):
            model.runner.stats.requests_rejected += 1

    def count_invocation(self, name: str, status: int, seconds: float) -> None:
        """One invocation answered, with its status and seconds, into the request metrics."""
        self.metrics.request_done(name, status, seconds)

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
