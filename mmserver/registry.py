"""The set of loaded models: load, get, list with a cursor, unload.

Each loaded model is a :class:`ModelEntry` with its own ``ModelRunner``.
Loading and unloading are asynchronous and guarded so that a name is never
loaded twice: a name is *taken* from the moment its load starts until its
unload has freed the model. The registry raises domain errors only; ``app``
maps them to status codes.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import dataclasses
import gc
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from mmserver.batching import ModelRunner
from mmserver.config import DEFAULT_MEMORY_BUDGET_SHARE, BatchSettings, Settings
from mmserver.errors import (
    InsufficientResources,
    InvalidRequest,
    ModelAlreadyLoaded,
    ModelLoading,
    ModelNotFound,
    ModelUrlNotFound,
    UrlOutsideModelRoots,
)
from mmserver.resources import available_memory_bytes
from mmserver.handlers import (
    ModelHandler,
    batch_settings_for,
    estimated_memory_bytes,
    is_out_of_memory,
)

log = logging.getLogger(__name__)

#: Letters, digits, '.', '_' and '-', starting with a letter or digit (no '/' and no '..').
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
DEFAULT_PAGE_LIMIT = 100
MAX_PAGE_LIMIT = 1000
_TOKEN_PREFIX = "after:"


@dataclasses.dataclass(eq=False)
class ModelEntry:
    name: str
    url: str
    path: Path
    state: str = "loading"
    #: Estimated from the files while loading, measured from the model once loaded.
    memory_bytes: int = 0
    handler: ModelHandler | None = None
    runner: ModelRunner | None = None
    batch: BatchSettings | None = None
    invocations: int = 0
    idle: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @contextlib.contextmanager
    def invocation(self) -> Iterator[None]:
        """Mark an invocation in progress; unload waits for the last one to be encoded."""
        self.invocations += 1
        self.idle.clear()
        try:
            yield
        finally:
            self.invocations -= 1
            if self.invocations == 0:
                self.idle.set()

    def describe(self) -> dict:
        described = {"modelName": self.name, "modelUrl": self.url, "status": self.state}
        if self.runner is not None:
            stats = self.runner.stats
            described.update({
                "device": str(self.runner.device),
                "memoryBytes": self.memory_bytes,
                "batching": self.batch.as_dict(),
                "stats": {
                    "queueDepth": self.runner.queue_depth,
                    "requestsCompleted": stats.requests_completed,
                    "requestsFailed": stats.requests_failed,
                    "requestsRejected": stats.requests_rejected,
                    "batches": stats.batches,
                    "meanBatchSize": round(stats.mean_batch_size, 3),
                },
            })
        return described


class ModelRegistry:
    def __init__(self, settings: Settings,
                 on_loaded: Callable[[ModelEntry], None] | None = None,
                 on_unloaded: Callable[[ModelEntry], None] | None = None):
        self.settings = settings
        self.device = torch.device(settings.device) if settings.device else (
            torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
        self.memory_budget_bytes = (settings.memory_budget_bytes
                                    if settings.memory_budget_bytes is not None
                                    else default_memory_budget_bytes(self.device))
        self._roots = tuple(Path(os.path.realpath(r)) for r in settings.model_roots)
        self._entries: dict[str, ModelEntry] = {}
        self._on_loaded = on_loaded
        self._on_unloaded = on_unloaded

    # -- loading -------------------------------------------------------------

    def resolve_url(self, url: str) -> Path:
        """A url (a path, optionally ``file://``) to a real directory inside a model root."""
        raw = url[len("file://"):] if url.startswith("file://") else url
        if not raw or "\x00" in raw:
            raise InvalidRequest("url must be a non-empty path to a model directory")
        candidates = [Path(raw)] if os.path.isabs(raw) else [root / raw for root in self._roots]
        for candidate in candidates:
            real = Path(os.path.realpath(candidate))
            if not any(real == root or real.is_relative_to(root) for root in self._roots):
                raise UrlOutsideModelRoots(
                    f"url {url!r} resolves outside the model roots "
                    f"({', '.join(str(r) for r in self._roots)})")
            if real.exists():
                if not real.is_dir():
                    raise InvalidRequest(f"url {url!r} is a file; it must be a model directory")
                return real
        raise ModelUrlNotFound(f"url {url!r} does not exist")

    async def load(self, name: str, url: str) -> ModelEntry:
        """Load the model directory ``url`` as ``name`` (checked against the model roots)."""
        validate_name(name)
        return await self._load(name, url, self.resolve_url(url))

    async def load_single(self, name: str, model_dir: Path) -> ModelEntry:
        """Single-model mode: the model SageMaker unpacked into /opt/ml/model."""
        if not Path(model_dir).is_dir():
            raise ModelUrlNotFound(f"single-model directory {str(model_dir)!r} does not exist")
        return await self._load(name, str(model_dir), Path(os.path.realpath(model_dir)))

    async def _load(self, name: str, url: str, path: Path) -> ModelEntry:
        if name in self._entries:
            state = self._entries[name].state
            raise ModelAlreadyLoaded(f"model {name!r} is already {state}")
        estimate = estimated_memory_bytes(path)
        self._check_capacity(estimate)
        entry = ModelEntry(name=name, url=url, path=path, memory_bytes=estimate)
        self._entries[name] = entry
        started = time.perf_counter()
        try:
            handler = await asyncio.get_running_loop().run_in_executor(
                None, lambda: ModelHandler(path, device=self.device,
                                           program=self.settings.program))
            batch = batch_settings_for(self.settings.batch, handler.batch_overrides)
            runner = ModelRunner(handler.predict, max_batch_size=batch.max_batch_size,
                                 max_wait=batch.max_wait_seconds,
                                 max_queue_size=batch.max_queue_size, policy=batch.policy,
                                 device=self.device, name=name)
            await runner.start()
        except BaseException as error:
            del self._entries[name]
            if is_out_of_memory(error):
                raise InsufficientResources(
                    f"out of memory while loading model {name!r}: {error}") from error
            raise
        entry.handler, entry.runner, entry.batch = handler, runner, batch
        entry.memory_bytes = handler.memory_bytes or estimate
        entry.state = "ready"
        log.info("model=%s loaded from %s in %.2f s (%d bytes, %s)", name, path,
                 time.perf_counter() - started, entry.memory_bytes, self.device)
        if self._on_loaded:
            self._on_loaded(entry)
        return entry

    def _check_capacity(self, needed: int) -> None:
        if self.settings.max_models is not None and len(self._entries) >= self.settings.max_models:
            raise InsufficientResources(
                f"{len(self._entries)} models are loaded or loading, the most allowed "
                f"(MMSERVER_MAX_MODELS={self.settings.max_models}); unload one first")
        used = self.memory_used_bytes()
        if used + needed > self.memory_budget_bytes:
            raise InsufficientResources(
                f"the model needs about {needed / 2**20:.1f} MiB but only "
                f"{max(0, self.memory_budget_bytes - used) / 2**20:.1f} MiB of the "
                f"{self.memory_budget_bytes / 2**20:.1f} MiB budget is free "
                "(MMSERVER_MEMORY_BUDGET_MB); unload a model first")

    def memory_used_bytes(self) -> int:
        return sum(e.memory_bytes for e in self._entries.values())

    # -- lookup --------------------------------------------------------------

    def find(self, name: str) -> ModelEntry:
        """The model in any state, loading and unloading included (to describe it)."""
        entry = self._entries.get(name)
        if entry is None:
            raise ModelNotFound(f"model {name!r} is not loaded")
        return entry

    def get(self, name: str) -> ModelEntry:
        """The model, ready to serve."""
        entry = self.find(name)
        if entry.state != "ready":
            raise ModelNotFound(f"model {name!r} is not loaded")
        return entry

    def ready(self) -> list[ModelEntry]:
        return [e for e in self._entries.values() if e.state == "ready"]

    def page(self, limit: int | None = None,
             next_page_token: str | None = None) -> tuple[list[ModelEntry], str | None]:
        """Models sorted by name after the cursor; the token names the last one returned.

        The cursor is a name, not an offset, so models loaded or unloaded between
        pages neither repeat nor hide the ones present throughout.
        """
        limit = DEFAULT_PAGE_LIMIT if limit is None else limit
        if not 1 <= limit <= MAX_PAGE_LIMIT:
            raise InvalidRequest(f"limit must be between 1 and {MAX_PAGE_LIMIT}, got {limit}")
        after = decode_page_token(next_page_token) if next_page_token else None
        names = sorted(e.name for e in self.ready() if after is None or e.name > after)
        page = [self._entries[n] for n in names[:limit]]
        token = encode_page_token(page[-1].name) if len(names) > limit else None
        return page, token

    # -- unloading -----------------------------------------------------------

    async def unload(self, name: str) -> None:
        """Let accepted requests finish, then free the model (CUDA cache included)."""
        if name in self._entries and self._entries[name].state == "loading":
            raise ModelLoading(f"model {name!r} is still loading; unload it once it is ready")
        entry = self.get(name)
        entry.state = "unloading"
        try:
            await entry.runner.stop()
            if entry.invocations:  # answered by the runner, maybe still in output_fn
                await entry.idle.wait()
        finally:
            entry.handler.close()
            entry.handler = None
            entry.runner = None
            del self._entries[name]
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            log.info("model=%s unloaded", name)
            if self._on_unloaded:
                self._on_unloaded(entry)

    async def close(self) -> None:
        """Unload everything (on shutdown), answering accepted requests first."""
        await asyncio.gather(*(self.unload(e.name) for e in self.ready()),
                             return_exceptions=True)


def validate_name(name: object) -> str:
    if not isinstance(name, str) or not MODEL_NAME.fullmatch(name) or ".." in name:
        raise InvalidRequest(
            f"model_name must be 1-128 letters, digits, '.', '_' or '-', starting with a letter "
            f"or digit, without '..'; got {name!r}")
    return name


def encode_page_token(last_name: str) -> str:
    return base64.urlsafe_b64encode((_TOKEN_PREFIX + last_name).encode()).decode().rstrip("=")


def decode_page_token(token: str) -> str:
    try:
        padded = token + "=" * (-len(token) % 4)
        text = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
    except (binascii.Error, UnicodeError, ValueError):
        text = ""
    if not text.startswith(_TOKEN_PREFIX):
        raise InvalidRequest(f"next_page_token {token!r} is not a token this server issued")
    return text[len(_TOKEN_PREFIX):]


def default_memory_budget_bytes(device: torch.device) -> int:
    """A share of the memory free now: of the GPU for CUDA models, else of RAM (container limits
    included)."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free * DEFAULT_MEMORY_BUDGET_SHARE)
    return int(available_memory_bytes() * DEFAULT_MEMORY_BUDGET_SHARE)

