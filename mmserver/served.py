"""The served model: what the service of a process asks of every model it holds.

One interface, whatever the kind of model behind it: a model loaded in this process
(:class:`~mmserver.loaded_model.LoadedModel`) or a model in an engine of its own
(:class:`~mmserver.engine.isolated.IsolatedModel`). Only the factory that builds served
models (``registry``) knows their kinds; the service (``http.local``), the metrics and the
engine's connections call this protocol, so a third kind of model is one class and one
line of the factory, not a branch in each of them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from mmserver.handler.folder import RowCodecs
from mmserver.http.service import Call
from mmserver.model_info import ModelInfo, ModelStatus
from mmserver.pipeline import Answer, InvocationPipeline
from mmserver.wires import ToolkitHeaders, V2Headers


class ServedModel(Protocol):
    """A model that serves, from its load until :meth:`close` has returned."""

    name: str
    url: str
    path: Path
    memory_bytes: int
    #: Set when its unload starts: it takes no new request.
    unloading: bool
    #: This load of the model among every load of this process (None: rows never cross).
    generation: int | None

    @property
    def status(self) -> ModelStatus: ...

    def info(self) -> ModelInfo:
        """What it is and does now, as plain data (its listing, the index, the budget)."""

    async def start(self) -> None:
        """Serve from now on (after the factory's memory check)."""

    async def close(self, drain_timeout: float) -> None:
        """Answer accepted requests (at most ``drain_timeout`` s), then free everything."""

    def admit(self) -> None:
        """Refuse (503) before a body is read what the model's queue would refuse."""

    async def invoke(self, headers: ToolkitHeaders | V2Headers, call: Call,
                     pipeline: InvocationPipeline) -> Answer:
        """One invocation, body to answer, within the pipeline's limits and deadline."""

    def row_codecs(self) -> RowCodecs | None:
        """How another process may decode its requests into rows and encode its answers
        (``engine.client``), else None: that process sends bodies whole."""

    def submit_rows(self, inputs: list[Any], pipeline: InvocationPipeline,
                    answered: Callable[[int, Any], None]) -> tuple[list[Any], Exception | None]:
        """Requests another process decoded with :meth:`row_codecs` (each one's rows), queued
        together with the pipeline's deadline (``InvocationPipeline.submit_rows``): the queued
        requests, each answer on its ``future`` and told to ``answered(position, request)``,
        and the refusal of the rest."""

    def watch_admission(self, listener: Callable[[Exception | None], None]) -> None:
        """Call ``listener`` when its queue starts (an error) or stops (None) refusing."""

    def count_refusal(self) -> None:
        """Another process refused an invocation as :meth:`admit` would: one rejection."""

    def record_stages(self, answers: list[tuple[float, ...]]) -> None:
        """Another process encoded answers of rows it decoded: each one's seconds per Triton
        stage (``batching.stats.RequestStages.add``'s arguments), into the model's statistics."""

    async def describe(self) -> dict[str, object]:
        """``GET /models/{name}``'s answer (``http.answers``)."""

    async def model_metadata(self) -> dict[str, object]:
        """v2's model metadata (``http.triton``)."""

    async def model_config(self) -> dict[str, object]:
        """Triton's model configuration (``http.triton``)."""

    async def model_statistics(self) -> list[dict[str, object]]:
        """Triton's statistics of the model (``http.triton``)."""

    def export_metrics(self, metrics: Any) -> None:
        """Declare its series in ``metrics`` (``mmserver.metrics.Metrics``) as it loads."""

    async def exposition(self) -> bytes:
        """Its series kept by another process, in Prometheus' text format (b"": none)."""
