"""What the HTTP operations need from a server, and the request and answer they speak.

Every operation of ``http.table`` (``http.sagemaker`` and ``http.v2``) is written
against a :class:`ModelService` and a :class:`Call`, and answers a :class:`Reply`:
no web framework, no registry, no Ray. A host turns its framework's request into a
``Call`` and the ``Reply`` into its response; a service says where the models are:

* :class:`mmserver.http.local.LocalService`: in this process, over the registry and
  the invocation pipeline (``mmserver serve``, served by aiohttp, ``http.app``);
* :class:`mmserver.ray.service.ClusterService`: on a Ray cluster's model hosts, over
  the cluster's registrations (served by the Serve ingress, ``mmserver.ray.ingress``).

A service raises :mod:`mmserver.errors`' domain errors; each host answers them in the
route's protocol (``http.errors``). Answers that read a loaded model (v2 metadata,
Triton's configuration and statistics) come back as JSON-ready dicts, built where the
model is by ``http.triton``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from mmserver.http.answers import Registered
from mmserver.model_info import ModelInfo, ModelStatus
from mmserver.pipeline import Answer
from mmserver.wires import ToolkitHeaders, V2Headers

JSON_TYPE = "application/json"


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One HTTP request as an operation sees it."""

    #: The route's path parameters (``name``, ``version``).
    params: Mapping[str, str]
    query: Mapping[str, str]
    #: Looked up without regard to case, as HTTP says.
    headers: Mapping[str, str]
    content_length: int | None
    #: Reads the whole body, raising :class:`~mmserver.errors.PayloadTooLarge` past the given
    #: number of bytes as it arrives.
    read_body: Callable[[int], Awaitable[bytes]]
    #: The whole body is already buffered (the common small request): no timeout needed.
    body_arrived: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    """An answer before any framework: 200 and no body unless said otherwise."""

    body: bytes = b""
    content_type: str | None = None
    headers: Mapping[str, str] | None = None
    status: int = 200

    @classmethod
    def json(cls, value: object) -> Reply:
        return cls(json.dumps(value).encode(), JSON_TYPE)

    def all_headers(self) -> dict[str, str]:
        """The headers to send, ``Content-Type`` among them when there is one."""
        headers = dict(self.headers) if self.headers else {}
        if self.content_type is not None:
            headers["Content-Type"] = self.content_type
        return headers

    @classmethod
    def of(cls, answer: Answer) -> Reply:
        """An invocation's answer, as the model's wire encoded it."""
        return cls(answer.body, answer.content_type, answer.headers)


class ModelService(Protocol):
    """The models of one server, wherever they run (module docstring)."""

    # -- SageMaker's model management ----------------------------------------------------

    async def load(self, name: str, url: str) -> Registered:
        """Load the folder ``url`` as ``name`` (409 while the name is taken, 507 when it fits
        nowhere)."""

    async def page(self, limit: int | None,
                   next_page_token: str | None) -> tuple[Sequence[Registered], str | None]:
        """The ready models sorted by name after the cursor, and the next page's token."""

    async def describe(self, name: str) -> dict[str, object]:
        """``GET /models/{name}``'s answer (``http.answers``)."""

    async def unload(self, name: str) -> None:
        """Answer the model's accepted requests, then free it."""

    # -- invocation ---------------------------------------------------------------------

    async def invoke(self, name: str, headers: ToolkitHeaders | V2Headers, call: Call
                     ) -> Answer:
        """Run model ``name`` on ``call``'s body through the wire ``headers`` describe."""

    # -- the Open Inference Protocol's reads and repository ---------------------------------

    async def status(self, name: str) -> ModelStatus:
        """Where model ``name`` is in its life (404 when there is no such model)."""

    async def model_metadata(self, name: str) -> dict[str, object]:
        """v2 model metadata: platform, inputs, outputs."""

    async def model_config(self, name: str) -> dict[str, object]:
        """Triton's model configuration."""

    async def model_statistics(self, name: str | None) -> list[dict[str, object]]:
        """Triton's statistics of model ``name``, or of every ready model."""

    async def index(self) -> list[ModelInfo]:
        """The model roots' folders and the loaded models, sorted by name."""

    async def load_folder(self, name: str) -> None:
        """Load the model roots' folder ``name`` as ``name`` (nothing when it is loaded)."""

    # -- health and metrics -------------------------------------------------------------------

    async def exposition(self) -> bytes:
        """The server's metrics in Prometheus' text format."""
