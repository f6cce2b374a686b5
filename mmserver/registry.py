"""The set of models: names mapped to a model being loaded or a served model.

It is the factory of served models (``mmserver.served``), the one place that knows their
kinds: a :class:`LoadedModel` in this process, or an
:class:`~mmserver.engine.isolated.IsolatedModel` in an engine of its own.

A name is *taken* from the moment its load starts until its unload has freed
the model, so it is never loaded twice (409). Before a load the registry asks
the url sandbox (``model_roots``) and the capacity policy (``capacity``); the
load itself is ``loader``'s and a model's life is its own (``loaded_model``).
Listing pages by an opaque cursor (``paging``). The index (:meth:`ModelRegistry.index`) lists
the model roots' folders beside the loaded models, for Triton's repository
extension, which loads a folder by its name (:meth:`ModelRegistry.load_folder`).
Domain errors only; the HTTP layer maps them to status codes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
import torch

from mmserver import heap
from mmserver.capacity import CapacityPolicy, default_memory_budget_bytes, estimated_memory_bytes
from mmserver.config import Settings
from mmserver.engine.isolated import IsolatedModel
from mmserver.errors import (
    InvalidRequest,
    ModelAlreadyLoaded,
    ModelLoading,
    ModelNotFound,
    ModelUrlNotFound,
)
from mmserver.handler.folder import is_model_folder
from mmserver.handler.requirements import RequirementsCache, needs_own_process
from mmserver.handler.settings import ModelSettings
from mmserver.http import answers
from mmserver.loaded_model import NOT_LOADED, LoadedModel, ModelInfo, ModelStatus
from mmserver.loader import install_requirements, load_model
from mmserver.model_roots import ModelRoots
from mmserver.paging import paginate
from mmserver.served import ServedModel

log = logging.getLogger(__name__)

@dataclasses.dataclass(eq=False)
class Loading:
    """A name whose load is under way: it holds its estimated memory and refuses a second load."""

    name: str
    url: str
    memory_bytes: int
    status: ModelStatus = ModelStatus.LOADING

    def info(self) -> ModelInfo:
        return ModelInfo(name=self.name, url=self.url, status=self.status)

    async def describe(self) -> dict[str, object]:
        return answers.described(self.info())


#: Letters, digits, '.', '_' and '-', starting with a letter or digit (no '/' and no '..').
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def pick_device(requested: str | None) -> torch.device:
    """The device models run on: the one asked for, else CUDA when present, else the CPU."""
    if requested:
        return torch.device(requested)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class ModelRegistry:
    """``isolate_in``: the class of the service an isolated model's own engine holds; given,
    a model whose settings ask for a process of its own gets one (``engine.isolated``),
    reported through ``on_restart(model)`` when that process died
    and another loads it, and ``on_failed(name, url, reason)`` when none could."""

    def __init__(self, settings: Settings,
                 on_loaded: Callable[[ServedModel], None] | None = None,
                 on_unloaded: Callable[[ServedModel], None] | None = None, *,
                 isolate_in: type | None = None,
                 on_restart: Callable[[IsolatedModel], None] | None = None,
                 on_failed: Callable[[str, str, str], None] | None = None):
        self.settings = settings
        self.isolate_in = isolate_in
        self.isolating = isolate_in is not None
        self.device = pick_device(settings.device)
        self.capacity = CapacityPolicy(
            memory_budget_bytes=(settings.memory_budget_bytes
                                 if settings.memory_budget_bytes is not None
                                 else default_memory_budget_bytes(self.device)),
            max_models=settings.max_models)
        self.roots = ModelRoots(settings.model_roots)
        #: Where models' code/requirements.txt are installed; None when installing is off.
        self.requirements = RequirementsCache() if settings.install_requirements else None
        self._models: dict[str, Loading | ServedModel] = {}
        #: Unloads under way, held here so that they finish even if their caller goes away.
        self._unloads: dict[str, asyncio.Task] = {}
        self._on_loaded = on_loaded
        self._on_unloaded = on_unloaded
        self._on_restart = on_restart
        self._on_failed = on_failed
        #: Set when :meth:`close` begins (SIGTERM): the models are draining for good.
        self.closing = False

    # -- loading -------------------------------------------------------------

    async def load(self, name: str, url: str) -> LoadedModel:
        """Load the model directory ``url`` as ``name`` (checked against the model roots)."""
        validate_name(name)
        return await self._load(name, url, self.roots.resolve(url))

    async def load_folder(self, name: str) -> LoadedModel:
        """Load the folder ``name`` of a model root as ``name``; a model already loaded
        from that folder under that name is returned as it is, not loaded again."""
        validate_name(name)
        path = self.roots.resolve(name)
        existing = self._models.get(name)
        if existing is not None and not isinstance(existing, Loading) and \
                not existing.unloading and existing.path == path:
            return existing
        return await self._load(name, name, path)

    async def load_single(self, name: str, model_dir: Path) -> LoadedModel:
        """Single-model mode: the model SageMaker unpacked into /opt/ml/model."""
        if not Path(model_dir).is_dir():
            raise ModelUrlNotFound(f"single-model directory {str(model_dir)!r} does not exist")
        return await self._load(name, str(model_dir), Path(os.path.realpath(model_dir)),
                                isolate=False)

    async def _load(self, name: str, url: str, path: Path, isolate: bool = True
                    ) -> ServedModel:
        if name in self._models:
            raise ModelAlreadyLoaded(f"model {name!r} is already {self._models[name].status}")
        isolated = isolate and self._isolates(path)
        estimate = estimated_memory_bytes(path)
        self.capacity.check_room(len(self._models))
        self.capacity.check_memory(estimate, self._memory_of_others(None),
                                   "estimated from its files")
        placeholder = self._models[name] = Loading(name, url, estimate)
        started = time.perf_counter()
        model = None
        try:
            settings = self.settings
            if isolated:
                model = await self._load_isolated(name, url, path)
            else:
                model = await load_model(
                    name, url, path, device=self.device, batch=settings.batch,
                    program=settings.program, load_timeout_seconds=settings.load_timeout_seconds,
                    call_timeout_seconds=settings.model_server_timeout_seconds,
                    estimate_bytes=estimate, requirements=self.requirements)
            self.capacity.check_memory(model.memory_bytes, self._memory_of_others(placeholder),
                                       "measured")
            await model.start()
        except BaseException:
            del self._models[name]
            if model is not None:
                await model.close(drain_timeout=0)
            raise
        self._models[name] = model
        heap.settle()
        log.info("model=%s loaded from %s in %.2f s (%d bytes, %s)", name, path,
                 time.perf_counter() - started, model.memory_bytes, self.device)
        if self._on_loaded:
            self._on_loaded(model)
        return model

    def _isolates(self, path: Path) -> bool:
        """Whether the model of folder ``path`` gets a process of its own: it ships packages
        of its own (``code/requirements.txt``), or its ``mmserver.json`` says so, or says
        nothing and the server's setting does."""
        if not self.isolating:
            return False
        isolation = ModelSettings.read(path).isolation or self.settings.isolation
        return needs_own_process(path, self.settings) or isolation == "process"

    async def _load_isolated(self, name: str, url: str, path: Path) -> IsolatedModel:
        packages = await install_requirements(name, path, self.requirements,
                                              self.settings.load_timeout_seconds)
        model = IsolatedModel(name, url, path, dataclasses.replace(
            self.settings, preload=(), multi_model=True, http_workers=1),
            service=self.isolate_in, on_restart=self._on_restart or (lambda model: None),
            on_failed=self._failed, packages=packages)
        await model.load()
        return model

    def _failed(self, model: IsolatedModel, reason: str) -> None:
        """An isolated model that no new process could load again: forgotten here, and
        reported to the service, which describes it as failed."""
        if self._models.get(model.name) is not model:
            return
        del self._models[model.name]
        if self._on_unloaded:
            self._on_unloaded(model)
        if self._on_failed:
            self._on_failed(model.name, model.url, reason)

    def _memory_of_others(self, besides: Loading | None) -> int:
        return sum(m.memory_bytes for m in self._models.values() if m is not besides)

    # -- lookup --------------------------------------------------------------

    def info(self, name: str) -> ModelInfo:
        """What the model is and does, in any state (loading and unloading included)."""
        model = self._models.get(name)
        if model is None:
            raise ModelNotFound(f"model {name!r} is not loaded")
        return model.info()

    def entry(self, name: str) -> Loading | ServedModel:
        """What holds the name now: a load under way, or the model (unloading included)."""
        model = self._models.get(name)
        if model is None:
            raise ModelNotFound(f"model {name!r} is not loaded")
        return model

    def get(self, name: str) -> ServedModel:
        """The model, ready to serve (an unhealthy one included: it answers 503 while stuck)."""
        model = self._models.get(name)
        if model is None or isinstance(model, Loading) or model.unloading:
            raise ModelNotFound(f"model {name!r} is not loaded")
        return model

    def ready(self) -> list[ServedModel]:
        """Models that serve (an unhealthy one included: it answers 503 while stuck)."""
        return [m for m in self._models.values()
                if not isinstance(m, Loading) and not m.unloading]

    def index(self) -> list[ModelInfo]:
        """The model roots' model folders and the registry's models, sorted by name.

        A folder no model of its name comes from has the status :data:`NOT_LOADED`;
        a model's own entry wins over a folder of its name.
        """
        entries = folder_index(self.roots, self.settings.program)
        entries.update((name, model.info()) for name, model in self._models.items())
        return [entries[name] for name in sorted(entries)]

    def page(self, limit: int | None = None,
             next_page_token: str | None = None) -> tuple[list[LoadedModel], str | None]:
        """Models sorted by name after the cursor (:func:`paginate`)."""
        return paginate(self.ready(), limit, next_page_token)

    # -- unloading -----------------------------------------------------------

    async def unload(self, name: str, drain_timeout: float | None = None) -> None:
        """Let accepted requests finish, then free the model (CUDA cache included).

        The unload runs as a task of its own, so a client that hangs up on its
        ``DELETE`` cannot interrupt it half-way. Draining takes at most
        ``drain_timeout`` seconds (default: the invocation timeout, which no
        accepted request outlives); a stuck call is not waited for.
        """
        if isinstance(self._models.get(name), Loading):
            raise ModelLoading(f"model {name!r} is still loading; unload it once it is ready")
        model = self.get(name)
        model.unloading = True
        timeout = self.settings.model_server_timeout_seconds if drain_timeout is None \
            else drain_timeout
        task = self._unloads[name] = asyncio.create_task(self._unload(model, timeout))
        await asyncio.shield(task)

    async def _unload(self, model: ServedModel, timeout: float) -> None:
        try:
            await model.close(timeout)
        finally:
            del self._models[model.name]
            self._unloads.pop(model.name, None)
            log.info("model=%s unloaded", model.name)
            if self._on_unloaded:
                self._on_unloaded(model)

    async def close(self, drain_timeout: float | None = None) -> None:
        """Unload everything (on shutdown), answering accepted requests first."""
        self.closing = True
        await asyncio.gather(*(self.unload(m.name, drain_timeout) for m in self.ready()),
                             return_exceptions=True)
        if self.requirements is not None:
            await self.requirements.close()


def folder_index(roots: ModelRoots, program: str) -> dict[str, ModelInfo]:
    """Each model folder directly under ``roots`` whose name is a valid model name, as not
    loaded: the start of v2's repository index, here and on a Ray cluster."""
    return {name: ModelInfo(name=name, url=name, status=NOT_LOADED)
            for name, path in roots.folders().items()
            if MODEL_NAME.fullmatch(name) and is_model_folder(path, program)}


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not MODEL_NAME.fullmatch(name) or ".." in name:
        raise InvalidRequest(
            f"model_name must be 1-128 letters, digits, '.', '_' or '-', starting with a letter "
            f"or digit, without '..'; got {name!r}")
    return name
