"""A model host: one Ray Serve replica that loads, batches and serves models as ``mmserver serve`` does.

Each replica is a small ``mmserver serve`` without HTTP: its own
:class:`~mmserver.registry.ModelRegistry` (the url sandbox, the memory rule and
its budget, ``code/requirements.txt``, the load timeout), each model a
:class:`~mmserver.loaded_model.LoadedModel` with its ``ModelRunner``, and the
:class:`~mmserver.pipeline.InvocationPipeline` (decoding, the queue and its 503,
the deadline, encoding, failure isolation per request). Ray's multiplexer
(``multiplex.ModelCache``) decides which models the replica keeps, least
recently used first, and tells Serve's routers which replica holds what.

A model is loaded here when a request for it arrives and the replica does not
hold it, if the cluster's registrations (``registrations``) say it may be:
past ``max_models`` Ray evicts the least recently used model first; past the
memory budget (507 from the registry) this host evicts the least recently used
one and tries again, until the model fits or nothing is left to evict, when the
model fits on no replica (every replica has the same budget) and the answer is
507. An evicted model is unloaded as on one machine: its accepted requests are
answered first. A name nobody registered answers 404 before anything is evicted.

Each replica keeps its own metrics (``mmserver.metrics``): its models' batches and
queues, and the invocations it ran, by the status the ingress answers them; the
cluster's ``/metrics`` shows every replica's, labelled (``service``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from ray.serve.handle import DeploymentHandle

from mmserver.allocator import keep_freed_memory_in_heap
from mmserver.config import Settings
from mmserver.errors import InsufficientResources, MMServerError, ModelNotFound, RunnerClosed
from mmserver.http import triton
from mmserver.http.errors import status_for
from mmserver.http.table import SAGEMAKER, V2
from mmserver.loaded_model import LoadedModel, ModelInfo
from mmserver.metrics import Metrics
from mmserver.pipeline import Answer, Invocation, InvocationPipeline
from mmserver.ray.multiplex import HeldModel, ModelCache
from mmserver.ray.registrations import Registration
from mmserver.ray.replicas import ReplicaRef
from mmserver.registry import ModelRegistry
from mmserver.wires import ToolkitHeaders, V2Headers

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Invoked:
    """One invocation's answer, and which replica gave it."""

    answer: Answer
    replica: ReplicaRef
    #: The replica did not hold the model when the request arrived (a miss: it waited for a load).
    loaded: bool


@dataclasses.dataclass(frozen=True)
class Held:
    """A model held by one replica, as describe reports it."""

    replica: ReplicaRef
    info: ModelInfo


class ModelHost:
    """The model host deployment's replica (see the module docstring)."""

    def __init__(self, settings: Settings, registrations: DeploymentHandle):
        if settings.tune_malloc:  # before any model runs, as mmserver serve does
            keep_freed_memory_in_heap()
        self.settings = settings
        self.metrics = Metrics()
        # The count of models is Ray's multiplexer's to cap; the registry keeps the memory rule.
        self.models = ModelRegistry(dataclasses.replace(settings, max_models=None),
                                    on_loaded=self.metrics.model_loaded,
                                    on_unloaded=self.metrics.model_unloaded)
        self.pipeline = InvocationPipeline(settings)
        self.registrations = registrations
        self.cache = ModelCache(self._load, settings.max_models)
        self.replica = ReplicaRef.current()
        # Serve awaits a replica's __del__ on graceful shutdown; an instance attribute, so the
        # garbage collector never calls a coroutine function unawaited.
        self.__del__ = self._shutdown

    # -- what the ingress calls --------------------------------------------------

    async def invoke(self, name: str, headers: ToolkitHeaders | V2Headers, body: bytes
                     ) -> Invoked:
        """Serve one invocation of ``name``, loading the model first if this replica lacks it;
        counted in this replica's request metrics with the status the ingress will answer."""
        started, status, unavailable = time.perf_counter(), 200, None
        try:
            return await self._invoke(name, headers, body)
        except MMServerError as error:
            status = status_for(error, V2 if isinstance(headers, V2Headers) else SAGEMAKER) or 500
            unavailable = error.unavailable if status == 503 else None
            raise
        except Exception:
            status = 500
            raise
        finally:
            self.metrics.request_done(name, status, time.perf_counter() - started, unavailable)

    async def _invoke(self, name: str, headers: ToolkitHeaders | V2Headers, body: bytes
                      ) -> Invoked:
        loaded, held = await self._held(name)
        try:
            return await self._run(held, headers, body, loaded)
        except RunnerClosed:
            if not held.model.unloading:
                raise
        # Evicted between the lookup and the queue: load it again, once.
        return await self._run(await self.cache.get(name), headers, body, loaded=True)

    async def _held(self, name: str) -> tuple[bool, HeldModel]:
        """This replica's copy of ``name``, loaded first if it lacks one (and whether it did)."""
        loaded = not self.cache.holds(name)
        if loaded:  # 404 before Ray's cap evicts anything for a name nobody registered
            await self._registration(name, serving=True)
        return loaded, await self.cache.get(name)

    async def metadata(self, name: str) -> dict[str, Any]:
        """v2's metadata of ``name``, read off this replica's copy."""
        return triton.model_metadata((await self._held(name))[1].model)

    async def config(self, name: str) -> dict[str, Any]:
        """Triton's configuration of ``name``, read off this replica's copy."""
        return triton.model_config((await self._held(name))[1].model)

    async def statistics(self, name: str | None) -> list[dict[str, Any]]:
        """Triton's statistics of this replica's copy of ``name`` (of every model it holds
        when ``name`` is None); none when it holds no copy (broadcast)."""
        models = self.models.ready()
        return [triton.model_stats(model) for model in models
                if name is None or model.name == name]

    async def exposition(self) -> tuple[str, bytes]:
        """This replica's metrics in Prometheus' text format, and its id (broadcast)."""
        return self.replica.replica_id, self.metrics.exposition()

    async def warm(self, name: str) -> Held:
        """The first load of a new registration (``POST /models``), here."""
        held = await self.cache.get(name)
        return Held(self.replica, held.model.info())

    async def holding(self, name: str) -> Held | None:
        """This replica's copy of ``name``, if it holds one (describe, broadcast)."""
        held = self.cache.held(name)
        return None if held is None else Held(self.replica, held.model.info())

    async def drop(self, name: str) -> ReplicaRef | None:
        """Unload ``name`` here, answering its accepted requests first (``DELETE``, broadcast);
        this replica when it held the model."""
        return self.replica if await self.cache.evict(name) else None

    # -- loading and evicting ------------------------------------------------------

    async def _load(self, name: str) -> HeldModel:
        """Ray's multiplexer calls this, holding its lock, for a model the replica lacks."""
        registration = await self._registration(name, serving=False)
        model = await self._load_within_budget(registration)
        if await self.registrations.current.remote(name) != registration:
            await self.models.unload(name, drain_timeout=0)  # unloaded (and maybe reloaded)
            raise ModelNotFound(f"model {name!r} was unloaded while this replica loaded it")
        return HeldModel(model, self._release)

    async def _registration(self, name: str, *, serving: bool) -> Registration:
        """What may be loaded for ``name``: ready only for an invocation (``serving``); loading
        too for the first load."""
        method = self.registrations.serving if serving else self.registrations.current
        registration = await method.remote(name)
        if registration is None:
            raise ModelNotFound(f"model {name!r} is not loaded")
        return registration

    async def _load_within_budget(self, registration: Registration) -> LoadedModel:
        """Load, evicting the least recently used model while the budget refuses it (507)."""
        while True:
            try:
                return await self.models.load(registration.name, registration.url)
            except InsufficientResources as error:
                if not await self.cache.evict_least_recent():
                    raise InsufficientResources(
                        f"model {registration.name!r} fits on no replica: {error} (each "
                        "replica has this budget, and this one holds no other model)") from None

    async def _release(self, name: str) -> None:
        """An evicted model: its accepted requests are answered, then it is freed."""
        await self.models.unload(name)

    async def _run(self, held: HeldModel, headers: ToolkitHeaders | V2Headers, body: bytes,
                   loaded: bool) -> Invoked:
        async def read_body(limit: int) -> bytes:  # the ingress read it within the limit
            return body

        model = held.model
        answer = await self.pipeline.run(model, Invocation(
            wire=headers.wire(model.name, model.handler, self.settings.default_accept),
            content_length=len(body), read_body=read_body, body_arrived=True))
        return Invoked(answer, self.replica, loaded)

    async def _shutdown(self) -> None:
        await self.cache.close()
        await self.models.close()
        self.pipeline.close()
