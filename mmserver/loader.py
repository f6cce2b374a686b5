"""Loading: a model folder to a :class:`LoadedModel`, within the load timeout.

The folder's ``code/requirements.txt`` is installed first (``requirements``) and put
first on this process's path: a process that loads such a model here holds it alone (an
isolated model's engine, given the folder by its parent; single-model mode) or is a
Ray replica (docs/design.md section 6). Then its code runs in a thread of its own
(``model_fn`` may take minutes, or never return), and the memory that load takes is
measured around it (``capacity.measured_load``). Both share the load timeout. The batch settings are
the server's with the folder's ``mmserver.json`` on top. The runner is built here
but not started: the registry first checks the measured memory against the budget.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import torch

from mmserver.batching import BatchSettings, ModelRunner, is_out_of_memory
from mmserver.capacity import measured_load
from mmserver.errors import InsufficientResources, InvalidModelArtifact, LoadTimeout
from mmserver.handler.folder import ModelHandler
from mmserver.handler.requirements import (
    REQUIREMENTS_FILE,
    InstalledRequirements,
    RequirementsCache,
    given_for,
    put_first_on_path,
)
from mmserver.loaded_model import LoadedModel
from mmserver.handler.settings import SETTINGS_FILE, THREAD_SAFE_ATTRIBUTE, THREAD_SAFE_KEY
from mmserver.workers import WorkerPool

log = logging.getLogger(__name__)


async def load_model(name: str, url: str, path: Path, *, device: torch.device,
                     batch: BatchSettings, program: str, load_timeout_seconds: float,
                     call_timeout_seconds: float, estimate_bytes: int = 0,
                     requirements: RequirementsCache | None = None) -> LoadedModel:
    """Build the model's handler in its own thread and wrap it with a runner (not started).

    ``code/requirements.txt`` is installed first, inside the same timeout, by
    ``requirements`` (None: installing is off, and the file is only warned about), unless
    this process was given its folder, and the folder is put first on this process's
    path for the rest of its life. Raises :class:`LoadTimeout` past
    ``load_timeout_seconds`` (the thread, a daemon, is abandoned; a pip still running is
    killed), :class:`InsufficientResources` when memory ran out, and
    :class:`InvalidModelArtifact` for a folder that cannot be served (pip's failure
    included).
    """
    pool = WorkerPool(f"load-{name}")
    installing = False
    try:
        async with asyncio.timeout(load_timeout_seconds):
            requirements_file = path / "code" / REQUIREMENTS_FILE
            folder = given_for(requirements_file) if requirements_file.is_file() else None
            if folder is None:
                installing = True
                packages = await _install(name, requirements_file, requirements)
                installing = False
                folder = packages.folder if packages is not None else None
            if folder is not None:
                _put_on_path(name, folder)
            handler, measured = await pool.run(
                measured_load, device,
                lambda: ModelHandler(path, device=device, program=program),
                lambda loaded: loaded.model)
    except TimeoutError:
        raise _timed_out(name, load_timeout_seconds, installing) from None
    except BaseException as error:
        if is_out_of_memory(error):
            raise InsufficientResources(
                f"out of memory while loading model {name!r}: {error}") from error
        raise
    finally:
        pool.close()
    try:
        settings = batch.overridden(handler.settings.batching)
    except ValueError as error:
        handler.close()
        raise InvalidModelArtifact(f"{SETTINGS_FILE}: {error}") from None
    notes = []
    if settings.instances > 1 and not handler.thread_safe:
        notes.append(f"runs on 1 instance, not {settings.instances}: its code/ does not declare "
                     f"itself thread-safe ({THREAD_SAFE_ATTRIBUTE} = True in the script, or "
                     f'"{THREAD_SAFE_KEY}": true in {SETTINGS_FILE})')
        log.warning("model=%s %s", name, notes[-1])
        settings = dataclasses.replace(settings, instances=1)
    runner = ModelRunner(handler.predict, settings, device=device, name=name,
                         concatenate=handler.row_wise, call_timeout=call_timeout_seconds)
    return LoadedModel(name, url, path, handler, runner, max(measured, estimate_bytes),
                       notes=tuple(notes))


async def install_requirements(name: str, path: Path, requirements: RequirementsCache | None,
                               load_timeout_seconds: float) -> InstalledRequirements | None:
    """The folder of ``path``'s ``code/requirements.txt``, installed within the load timeout
    for a model that will run in a process of its own (``engine.isolated``), which is given
    it; None when the folder ships no such file or installing is off. The caller releases
    it once that process has ended."""
    try:
        async with asyncio.timeout(load_timeout_seconds):
            return await _install(name, path / "code" / REQUIREMENTS_FILE, requirements)
    except TimeoutError:
        raise _timed_out(name, load_timeout_seconds, installing=True) from None


async def _install(name: str, requirements_file: Path, requirements: RequirementsCache | None
                   ) -> InstalledRequirements | None:
    if not requirements_file.is_file():
        return None
    if requirements is None:
        log.warning("model=%s has code/%s; not installed (MMSERVER_INSTALL_REQUIREMENTS=0)",
                    name, REQUIREMENTS_FILE)
        return None
    return await requirements.install(name, requirements_file)


def _put_on_path(name: str, folder: Path) -> None:
    """The folder first on this process's path; it stays there, installed, while the process
    lives (its modules may be imported at any time), so the hold on it is never released."""
    already = put_first_on_path(folder)
    if already:
        log.warning("model=%s code/%s installed %s, which this process had already imported; "
                    "the model uses the modules imported", name, REQUIREMENTS_FILE,
                    ", ".join(sorted(already)))


def _timed_out(name: str, load_timeout_seconds: float, installing: bool) -> LoadTimeout:
    during = f"; pip was still installing code/{REQUIREMENTS_FILE}" if installing else ""
    log.error("model=%s load did not finish within %g s%s; abandoned", name,
              load_timeout_seconds, during)
    return LoadTimeout(f"loading model {name!r} took longer than {load_timeout_seconds:g} s "
                       f"(MMSERVER_LOAD_TIMEOUT){during}")
