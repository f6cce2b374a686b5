"""A model in a process of its own: ``"isolation": "process"``, or packages of its own.

A native crash in a model's code (a segfault in an extension, ``abort()``, the OOM
killer) ends the process it runs in, and with it every model that process holds. A model
whose ``mmserver.json`` says ``"isolation": "process"`` (or every model, with
``MMSERVER_ISOLATION=process``) runs instead in an engine of its own: a child process
that is ``mmserver.engine.engine`` holding that one model, reached over its Unix socket
by an :class:`~mmserver.engine.client.EngineService`. A model that ships
``code/requirements.txt`` runs in one too: its packages, installed here, go first on the
child's ``sys.path`` under their real names (``handler.requirements``). The registry holds an
:class:`IsolatedModel` in the model's place, so names, 409, the memory budget, listing
and unloading work as for any model; the model's queue and batching are in the child.

When the child dies, its in-flight requests are answered 503 at once (the client's
connection ended), and so is every request until a new child serves: the message names
the model, and once the death is seen, the signal. The model is loaded again in a new child, within
``MMSERVER_LOAD_TIMEOUT``; the other models never notice. If the new child cannot load
it (it dies again, or the load fails), the model is marked failed with the reason, so a
model that kills its process as it loads is not loaded for ever: describe says why, its
invocations answer 404, and ``POST /models`` loads it again once fixed.

A child dies with the process that started it (``PR_SET_PDEATHSIG``), so no engine
outlives a killed server; its socket is in a folder only the server's user may enter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from pathlib import Path

from collections.abc import Callable
from typing import Any

from mmserver import errors
from mmserver.config import Settings
from mmserver.engine.client import EngineService
from mmserver.engine.journal import Restart
from mmserver.engine.spawn import cause_of_end, spawn_engine, wait_ready
from mmserver.handler.folder import RowCodecs
from mmserver.handler.requirements import InstalledRequirements
from mmserver.http import answers
from mmserver.http.answers import ISOLATED, ISOLATION_KEY
from mmserver.http.service import Call
from mmserver.model_info import ModelInfo, ModelStatus
from mmserver.pipeline import Answer, InvocationPipeline
from mmserver.wires import ToolkitHeaders, V2Headers

__all__ = ["FOLDER_PREFIX", "ISOLATED", "ISOLATION_KEY", "IsolatedModel"]

log = logging.getLogger(__name__)
#: The start of the name of each isolated model's socket folder (in the temporary folder).
FOLDER_PREFIX = "mmserver-model-"


class IsolatedModel:
    """The registry's entry for a model served by a child engine (module docstring).

    ``service``: the class of the service the child engine holds (``spawn_engine``).
    ``on_restart(model)`` is called when its child died and another is started;
    ``on_failed(model, reason)`` when no child could load it again (the registry then
    forgets it and the service describes it as failed). ``packages``: its installed
    ``code/requirements.txt``, given to each child and released once the last has ended.
    """

    def __init__(self, name: str, url: str, path: Path, settings: Settings, *,
                 service: type, on_restart, on_failed,
                 packages: InstalledRequirements | None = None):
        self.name, self.url, self.path = name, url, path
        self._service = service
        #: The child's settings: no preload, and one model.
        self.settings = settings
        self.memory_bytes = 0
        self.unloading = False
        #: Its rows never cross to this process (:meth:`row_codecs` is None).
        self.generation = None
        #: Children of this model that died and were replaced.
        self.restarts = 0
        self._on_restart, self._on_failed = on_restart, on_failed
        self._packages = packages
        self._folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{name}-"))  # mode 0700
        self._process = None
        self._client: EngineService | None = None
        #: Why the model does not serve now (its child died and another is loading it).
        self._down: str | None = None
        self._watching: asyncio.Task | None = None
        self._stopping: list = []

    # -- life ----------------------------------------------------------------------------

    async def load(self) -> None:
        """Start a child and load the model in it; the child is gone again if this raises."""
        try:
            await self._start_child()
        except BaseException:
            await self._end_child(0)
            await self._forget_files()
            raise
        self._watching = asyncio.create_task(self._watch())

    async def start(self) -> None:
        """Nothing: the child serves once :meth:`load` returns (the registry's protocol)."""

    async def _start_child(self) -> None:
        socket_path = str(self._folder / f"engine-{self.restarts}.sock")
        restart = Restart(restore=(), failed={}, restarts=self.restarts) if self.restarts \
            else None
        packages = self._packages.folder if self._packages is not None else None
        self._process, ready = spawn_engine(self.settings, socket_path,
                                            logging.getLevelName(logging.root.level),
                                            restart, service=self._service, isolated=True,
                                            packages=packages)
        answer = await asyncio.to_thread(wait_ready, self._process, ready, self._stopping)
        ready.close()
        if answer is None or answer[0] != ModelStatus.READY:
            why = answer[1] if answer else await self._death()
            raise errors.ModelError(f"the process for model {self.name!r} did not start: {why}")
        self._client = EngineService(self.settings, socket_path, holds=f"model {self.name!r}")
        await self._client.start()
        try:
            await self._client.load(self.name, self.url)
        except errors.EngineUnavailable:
            raise errors.ModelError(f"the process of model {self.name!r} died "
                                    f"({await self._death()}) while it loaded the model"
                                    ) from None
        described = await self._client.describe(self.name)
        self.memory_bytes = int(described.get("memoryBytes") or 0)

    async def _death(self) -> str:
        """How the child ended, once it has (it may still be closing its socket)."""
        await asyncio.to_thread(self._process.join, self.settings.shutdown_timeout_seconds)
        return cause_of_end(self._process.exitcode)

    async def _watch(self) -> None:
        """Replace each child that dies while the model is loaded (module docstring)."""
        while True:
            await _ended(self._process)
            if self.unloading:
                return
            cause = await self._death()
            self._down = (f"the process of model {self.name!r} died ({cause}); it is being "
                          "loaded again in a new one: retry shortly")
            self.restarts += 1
            log.error("model=%s its process (pid %d) died (%s); loading it again in a new "
                      "one (restart %d)", self.name, self._process.pid, cause, self.restarts)
            self._on_restart(self)
            await self._client.close(timeout=0)
            try:
                await self._start_child()
            except Exception as error:  # noqa: BLE001 - any cause is the model's failure
                await self._end_child(0)
                reason = (f"its process died ({cause}) and it did not load again in a new "
                          f"one: {error}; load it (POST /models) once the cause is fixed")
                log.error("model=%s %s", self.name, reason)
                self.unloading = True
                await self._forget_files()
                self._on_failed(self, reason)
                return
            self._down = None
            log.warning("model=%s serves again from a new process (pid %d)", self.name,
                        self._process.pid)

    async def close(self, drain_timeout: float) -> None:
        """Answer accepted requests (at most ``drain_timeout`` s), then end the child."""
        self.unloading = True
        self._stopping.append(True)
        if self._watching is not None:
            self._watching.cancel()
        try:
            await self._end_child(drain_timeout)
        finally:
            await self._forget_files()

    async def _forget_files(self) -> None:
        """No child runs: its socket folder goes, and the hold on its installed packages."""
        shutil.rmtree(self._folder, ignore_errors=True)
        packages, self._packages = self._packages, None
        if packages is not None:
            await packages.release()

    async def _end_child(self, drain_timeout: float) -> None:
        """SIGTERM (the child drains its queue), its answers, its exit, all within
        ``drain_timeout`` s; then a kill."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + drain_timeout
        process = self._process
        if process is not None and process.is_alive():
            process.terminate()
        if self._client is not None:
            await self._client.close(timeout=drain_timeout)
        if process is not None:
            await asyncio.to_thread(process.join, max(0.5, deadline - loop.time()))
            if process.is_alive():
                log.warning("model=%s its process (pid %d) did not stop in time; killing it",
                            self.name, process.pid)
                process.kill()
                await asyncio.to_thread(process.join, 5)

    # -- the served model (``mmserver.served``) -------------------------------------------

    @property
    def status(self) -> ModelStatus:
        if self.unloading:
            return ModelStatus.UNLOADING
        return ModelStatus.LOADING if self._why_down() else ModelStatus.READY

    def info(self) -> ModelInfo:
        return ModelInfo(self.name, self.url, self.status, memory_bytes=self.memory_bytes)

    def _why_down(self) -> str | None:
        """Why the model cannot serve now, or None. The connection to a dying child may
        close before :meth:`_watch` sees the process end: from that moment on, a request
        is told the model is loading again, as describe says, not that an engine died."""
        if self._down is None and self._client is not None and not self._client.connected:
            return (f"the process of model {self.name!r} ended; it is being loaded again in "
                    "a new one: retry shortly")
        return self._down

    def _serving(self) -> EngineService:
        down = self._why_down()
        if down is not None:
            raise errors.ModelStillLoading(down)
        return self._client

    async def describe(self) -> dict[str, object]:
        """The child's describe answer (its ``engine``: pid and restarts), or while its
        process is gone and a new one loads the model, or it is being unloaded, what this
        side knows."""
        if self.unloading:
            return answers.described_isolated(self.info())
        try:
            return answers.described_isolated(await self._serving().describe(self.name))
        except errors.EngineUnavailable as error:
            return answers.described_isolated(self.info(), health=str(error),
                                              restarts=self.restarts)

    def admit(self) -> None:
        """Nothing here: the child's runner admits (its answer comes back as any error)."""

    async def invoke(self, headers: ToolkitHeaders | V2Headers, call: Call,
                     pipeline: InvocationPipeline) -> Answer:
        return await self._serving().invoke(self.name, headers, call)

    def row_codecs(self) -> RowCodecs | None:
        return None  # its bodies go whole to its process, which decodes them

    def submit_rows(self, inputs: list[Any], pipeline: InvocationPipeline,
                    answered: Callable[[int, Any], None]) -> tuple[list[Any], Exception | None]:
        raise errors.MMServerError(f"model {self.name!r} takes no rows decoded elsewhere")

    def watch_admission(self, listener: Callable[[Exception | None], None]) -> None:
        """Nothing: its queue is in its process, which refuses for itself."""

    def count_refusal(self) -> None:
        """Nothing: no other process refuses for it (:meth:`row_codecs` is None)."""

    def record_stages(self, answers: list[tuple[float, ...]]) -> None:
        """Nothing: no other process decodes its rows (:meth:`row_codecs` is None)."""

    async def model_metadata(self) -> dict[str, object]:
        return await self._serving().model_metadata(self.name)

    async def model_config(self) -> dict[str, object]:
        return await self._serving().model_config(self.name)

    async def model_statistics(self) -> list[dict[str, object]]:
        return await self._serving().model_statistics(self.name)

    def export_metrics(self, metrics: Any) -> None:
        """Its restarts are counted here; its process exports the rest (:meth:`exposition`)."""
        metrics.model_restarts.labels(self.name)

    async def exposition(self) -> bytes:
        """The child's metrics (none while it is down)."""
        if self._why_down() is not None or self._client is None:
            return b""
        with contextlib.suppress(errors.EngineUnavailable):
            return await self._client.exposition()
        return b""


async def _ended(process) -> None:
    """Return once ``process`` has ended (its sentinel is readable), without a thread."""
    loop = asyncio.get_running_loop()
    ended = loop.create_future()
    loop.add_reader(process.sentinel, lambda: ended.done() or ended.set_result(None))
    try:
        await ended
    finally:
        loop.remove_reader(process.sentinel)
