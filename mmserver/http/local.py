"""The models of this process: the :class:`~mmserver.http.service.ModelService` of ``mmserver serve``.

A thin layer over the :class:`~mmserver.registry.ModelRegistry` (loading, the memory
rule, unloading) and the :class:`~mmserver.pipeline.InvocationPipeline` (admission,
the body, the queue, the deadline); the aiohttp host (``http.app``) serves it.
"""

from __future__ import annotations

from mmserver.config import Settings
from mmserver.http import answers, triton
from mmserver.http.requests import SINGLE_MODEL_NAME
from mmserver.http.service import Call
from mmserver.loaded_model import LoadedModel, ModelInfo, ModelStatus
from mmserver.metrics import Metrics
from mmserver.pipeline import Answer, Invocation, InvocationPipeline
from mmserver.registry import ModelRegistry
from mmserver.wires import ToolkitHeaders, V2Headers


class LocalService:
    """Every model in this process, under one server's settings."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None):
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.registry = ModelRegistry(settings, on_loaded=self.metrics.model_loaded,
                                      on_unloaded=self.metrics.model_unloaded)
        self.pipeline = InvocationPipeline(settings)

    async def load(self, name: str, url: str) -> LoadedModel:
        return await self.registry.load(name, url)

    async def page(self, limit: int | None,
                   next_page_token: str | None) -> tuple[list[LoadedModel], str | None]:
        return self.registry.page(limit, next_page_token)

    async def describe(self, name: str) -> dict[str, object]:
        return answers.described(self.registry.info(name))

    async def unload(self, name: str) -> None:
        await self.registry.unload(name)

    async def invoke(self, name: str, headers: ToolkitHeaders | V2Headers, call: Call
                     ) -> Answer:
        model = self.registry.get(name)
        return await self.pipeline.run(model, Invocation(
            wire=headers.wire(model, self.settings.default_accept),
            content_length=call.content_length, read_body=call.read_body,
            body_arrived=call.body_arrived))

    async def status(self, name: str) -> ModelStatus:
        return self.registry.info(name).status

    async def model_metadata(self, name: str) -> dict[str, object]:
        return triton.model_metadata(self.registry.get(name))

    async def model_config(self, name: str) -> dict[str, object]:
        return triton.model_config(self.registry.get(name))

    async def model_statistics(self, name: str | None) -> list[dict[str, object]]:
        models = [self.registry.get(name)] if name is not None else [
            model for model in self.registry.ready() if model.status == ModelStatus.READY]
        return [triton.model_stats(model) for model in models]

    async def index(self) -> list[ModelInfo]:
        return self.registry.index()

    async def load_folder(self, name: str) -> None:
        await self.registry.load_folder(name)

    async def exposition(self) -> bytes:
        return self.metrics.exposition()

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
