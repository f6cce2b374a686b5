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
from collections.abc import Callable
from pathlib import Path

import torch

from mmserver.batching import BatchSettings, ModelRunner, is_out_of_memory
from mmserver.config import DEFAULT_MEMORY_BUDGET_SHARE, Settings
from mmserver.errors import (
    InsufficientResources,
    InvalidModelArtifact,
    InvalidRequest,
    LoadTimeout,
    ModelAlreadyLoaded,
    ModelLoading,
    ModelNotFound,
    ModelUrlNotFound,
    UrlOutsideModelRoots,
)
from mmserver.handlers import SETTINGS_FILE, ModelHandler, estimated_memory_bytes
from mmserver.resources import available_memory_bytes, memory_in_use_bytes
from mmserver.workers import WorkerPool

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
    #: Runs this model's own input_fn/output_fn, so a stuck one holds no other model's thread.
    codec_pool: WorkerPool | None = None
    invocations: int = 0
    idle: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    unloading: asyncio.Task | None = None

    @property
    def status(self) -> str:
        """``loading``, ``ready``, ``unhealthy`` (a call is stuck) or ``unloading``."""
        if self.state == "ready" and self.runner is not None and self.runner.stuck_seconds:
            return "unhealthy"
        return self.state

    def invocation(self) -> _InvocationInProgress:
        """``with entry.invocation():`` marks one in progress; unload waits for the last one."""
        return _InvocationInProgress(self)

    def describe(self) -> dict:
        described = {"modelName": self.name, "modelUrl": self.url, "status": self.status}
        if self.status == "unhealthy":
            described["health"] = (
                f"a call into the model has run for {self.runner.stuck_seconds:.0f} s, past its "
                f"{self.runner.call_timeout:g} s limit (SAGEMAKER_MODEL_SERVER_TIMEOUT); new "
                "requests get 503 until it returns; DELETE unloads it without waiting for it")
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
            if self.runner.sizer is not None:
                described["stats"]["measuredBatchSize"] = self.runner.sizer.best
        return described


class _InvocationInProgress:
    """A plain context manager (a generator-based one costs more on every request)."""

    __slots__ = ("entry",)

    def __init__(self, entry: ModelEntry):
        self.entry = entry

    def __enter__(self) -> None:
        self.entry.invocations += 1
        self.entry.idle.clear()

    def __exit__(self, *exc_info: object) -> None:
        entry = self.entry
        entry.invocations -= 1
        if entry.invocations == 0:
            entry.idle.set()


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
            try:
                real = Path(os.path.realpath(candidate))
                exists = real.exists()
            except (OSError, ValueError) as error:  # a name too long, say
                raise InvalidRequest(f"url {url[:300]!r} is not a usable path: "
                                     f"{getattr(error, 'strerror', None) or error}") from None
            self._check_inside_roots(real, f"url {url!r}")
            if exists:
                if not real.is_dir():
                    raise InvalidRequest(f"url {url!r} is a file; it must be a model directory")
                return real
        raise ModelUrlNotFound(f"url {url!r} does not exist")

    def _check_inside_roots(self, real: Path, what: str) -> None:
        if not any(real == root or real.is_relative_to(root) for root in self._roots):
            raise UrlOutsideModelRoots(
                f"{what} resolves outside the model roots "
                f"({', '.join(str(r) for r in self._roots)})")

    def check_model_files(self, model_dir: Path) -> None:
        """Every file the folder holds (``code/``, weights, ``mmserver.json``) stays inside a root.

        A symlink inside a model folder could otherwise make the server run code or
        read weights from anywhere; it is refused before any of the folder's code runs.
        """
        for folder, subfolders, files in os.walk(model_dir):
            for name in [*subfolders, *files]:
                path = Path(folder) / name
                if path.is_symlink():
                    self._check_inside_roots(Path(os.path.realpath(path)),
                                             f"{path.relative_to(model_dir)} in the model folder")

    async def load(self, name: str, url: str) -> ModelEntry:
        """Load the model directory ``url`` as ``name`` (checked against the model roots)."""
        validate_name(name)
        path = self.resolve_url(url)
        self.check_model_files(path)
        return await self._load(name, url, path)

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
        self._check_model_cap()
        self._check_memory(estimate, "estimated from its files")
        entry = ModelEntry(name=name, url=url, path=path, memory_bytes=estimate)
        self._entries[name] = entry
        started = time.perf_counter()
        try:
            handler = await self._build_handler(name, path)
            entry.memory_bytes = max(handler.memory_bytes, estimate)
            self._check_memory(entry.memory_bytes, "measured", loading=entry)
            batch = _batch_settings(self.settings.batch, handler.batch_overrides)
            runner = ModelRunner(handler.predict, batch, device=self.device, name=name,
                                 concatenate=handler.row_wise,
                                 call_timeout=self.settings.model_server_timeout_seconds)
            await runner.start()
        except BaseException as error:
            del self._entries[name]
            if is_out_of_memory(error):
                raise InsufficientResources(
                    f"out of memory while loading model {name!r}: {error}") from error
            raise
        entry.handler, entry.runner, entry.batch = handler, runner, batch
        entry.codec_pool = WorkerPool(f"{name}-codec", workers=2)
        entry.state = "ready"
        log.info("model=%s loaded from %s in %.2f s (%d bytes, %s)", name, path,
                 time.perf_counter() - started, entry.memory_bytes, self.device)
        if self._on_loaded:
            self._on_loaded(entry)
        return entry

    async def _build_handler(self, name: str, path: Path) -> ModelHandler:
        """Build the handler in a thread of its own, within the load timeout.

        The memory the load took (process memory, and device memory on CUDA) is
        measured around it, so what ``model_fn`` allocates beyond the weight files
        counts against the budget. A load that never returns leaves its daemon
        thread behind and frees the name.
        """
        timeout = self.settings.load_timeout_seconds

        def build() -> ModelHandler:
            before = memory_in_use_bytes(self.device)
            handler = ModelHandler(path, device=self.device, program=self.settings.program)
            handler.memory_bytes = max(handler.memory_bytes,
                                       memory_in_use_bytes(self.device) - before)
            return handler

        pool = WorkerPool(f"load-{name}")
        try:
            async with asyncio.timeout(timeout):
                return await pool.run(build)
        except TimeoutError:
            log.error("model=%s load did not finish within %g s; abandoned", name, timeout)
            raise LoadTimeout(f"loading model {name!r} took longer than {timeout:g} s "
                              "(MMSERVER_LOAD_TIMEOUT)") from None
        finally:
            pool.close()

    def _check_model_cap(self) -> None:
        if self.settings.max_models is not None and len(self._entries) >= self.settings.max_models:
            raise InsufficientResources(
                f"{len(self._entries)} models are loaded or loading, the most allowed "
                f"(MMSERVER_MAX_MODELS={self.settings.max_models}); unload one first")

    def _check_memory(self, needed: int, how: str, loading: ModelEntry | None = None) -> None:
        """507 when ``needed`` bytes do not fit beside the other models (``loading`` aside)."""
        used = sum(e.memory_bytes for e in self._entries.values() if e is not loading)
        if used + needed > self.memory_budget_bytes:
            raise InsufficientResources(
                f"the model needs {needed / 2**20:.1f} MiB ({how}) but only "
                f"{max(0, self.memory_budget_bytes - used) / 2**20:.1f} MiB of the "
                f"{self.memory_budget_bytes / 2**20:.1f} MiB budget is free "
                "(MMSERVER_MEMORY_BUDGET_MB); unload a model first")

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
        """Models that serve (an unhealthy one included: it answers 503 while stuck)."""
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

    async def unload(self, name: str, drain_timeout: float | None = None) -> None:
        """Let accepted requests finish, then free the model (CUDA cache included).

        The unload runs as a task of its own, so a client that hangs up on its
        ``DELETE`` cannot interrupt it half-way. Draining takes at most
        ``drain_timeout`` seconds (default: the invocation timeout, which no
        accepted request outlives); a stuck call is not waited for.
        """
        entry = self._entries.get(name)
        if entry is not None and entry.state == "loading":
            raise ModelLoading(f"model {name!r} is still loading; unload it once it is ready")
        entry = self.get(name)
        entry.state = "unloading"
        timeout = self.settings.model_server_timeout_seconds if drain_timeout is None \
            else drain_timeout
        entry.unloading = asyncio.create_task(self._unload(entry, timeout))
        await asyncio.shield(entry.unloading)

    async def _unload(self, entry: ModelEntry, timeout: float) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        try:
            await entry.runner.stop(timeout)
            if entry.invocations:  # answered by the runner, maybe still in output_fn
                remaining = max(0.0, deadline - asyncio.get_running_loop().time())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(entry.idle.wait(), remaining)
        finally:
            entry.handler.close()
            entry.codec_pool.close()
            entry.handler = entry.runner = entry.codec_pool = None
            del self._entries[entry.name]
            gc.collect()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            log.info("model=%s unloaded", entry.name)
            if self._on_unloaded:
                self._on_unloaded(entry)

    async def close(self, drain_timeout: float | None = None) -> None:
        """Unload everything (on shutdown), answering accepted requests first."""
        await asyncio.gather(*(self.unload(e.name, drain_timeout) for e in self.ready()),
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



def _batch_settings(defaults: BatchSettings, overrides: dict) -> BatchSettings:
    try:
        return defaults.overridden(overrides)
    except ValueError as error:
        raise InvalidModelArtifact(f"{SETTINGS_FILE}: {error}") from None
