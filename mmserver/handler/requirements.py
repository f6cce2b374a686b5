"""A model's ``code/requirements.txt``: installed by pip, then put first on a process's path.

SageMaker's toolkit runs ``pip install -r code/requirements.txt`` into the container's
Python before its model server starts, so a script may import what the file lists.
mmserver loads models later, and many share one process, so:

* pip (``sys.executable -m pip``, with pip's own configuration: its index, ``pip.conf``,
  ``PIP_*`` variables) installs with ``--target`` into ``<cache>/<sha256 of the file>``,
  the cache being a folder of this server process in the temporary directory
  (``TMPDIR``). It runs at load, inside the load timeout; a pip still running when the
  load gives up is killed with its whole process group.
* Models whose files hold the same bytes share one folder, installed once (a load that
  arrives during the install waits for it). The folder is removed when the last model
  using it is unloaded, and the cache when the server stops.
* The packages keep their real names: a model that ships the file runs in a process of
  its own (:func:`needs_own_process`), which puts the folder first on *its*
  ``sys.path`` (:func:`put_first_on_path`), as MMS and TorchServe do. Renaming them
  per model cannot work: real packages import their own submodules by their full
  names at run time (``transformers`` resolves its lazy attributes through
  ``importlib.import_module``, and through ``huggingface_hub``'s real name).

Loading a model therefore runs pip, and pip runs code from the index (a source
distribution's build) and installs whatever the file names, another index or a URL
included. Who may load which folder is decided by the management token and the model
roots; ``MMSERVER_INSTALL_REQUIREMENTS=0`` turns installing off.
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import hashlib
import importlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from mmserver.errors import InvalidModelArtifact

if TYPE_CHECKING:
    from mmserver.config import Settings

log = logging.getLogger(__name__)

REQUIREMENTS_FILE = "requirements.txt"
#: How much of pip's output a failed install answers with: its last lines say why.
PIP_TAIL_LINES = 10
PIP_TAIL_CHARS = 2000
#: Folders under a pip ``--target`` that hold no importable top-level module.
_NOT_MODULES = frozenset({"bin", "__pycache__"})
#: This process's path is one process's: folders put on it, each with the names of its
#: modules this process had imported before (those stay the ones imported).
_on_path: dict[Path, frozenset[str]] = {}
#: Folders another process installed for this one (an isolated model's engine), by digest.
_given: dict[str, Path] = {}


def needs_own_process(folder: Path, settings: Settings) -> bool:
    """Whether the model of ``folder`` must run in an engine process of its own: it ships
    ``code/requirements.txt`` and installing is on, so its packages go on a process's path
    under their real names, where no other model's can meet them."""
    return settings.install_requirements and (folder / "code" / REQUIREMENTS_FILE).is_file()


def put_first_on_path(folder: Path) -> frozenset[str]:
    """Put ``folder`` first on this process's ``sys.path``, before site-packages, for the
    rest of the process's life; the installed top-level names this process had already
    imported, which stay the modules imported (none when the folder was already there)."""
    if folder in _on_path:
        return frozenset()
    already = frozenset(n for n in installed_module_names(folder) if n in sys.modules)
    _on_path[folder] = already
    sys.path.insert(0, str(folder))
    importlib.invalidate_caches()
    return already


def take_installed(folder: Path) -> None:
    """This process is given ``folder``, installed by its parent for the file whose SHA-256
    names it: a load of that file here uses it instead of running pip (:func:`given_for`)."""
    _given[folder.name] = folder


def given_for(requirements_file: Path) -> Path | None:
    """The folder this process was given for ``requirements_file`` as it is now, if any."""
    return _given.get(hashlib.sha256(requirements_file.read_bytes()).hexdigest())


@dataclasses.dataclass(eq=False)
class _Install:
    """One requirements file's folder: pip's run, the models using it, its removal."""

    digest: str
    folder: Path
    task: asyncio.Task | None = None
    users: int = 0
    #: Set once the folder is on its way out: a new load of the same file waits for ``gone``,
    #: set when the folder's name is free again, before it installs afresh.
    closing: bool = False
    gone: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class InstalledRequirements:
    """A model's hold on its installed folder; :meth:`release` once its modules are dropped."""

    def __init__(self, cache: RequirementsCache, install: _Install):
        self._cache = cache
        self._install: _Install | None = install
        self.folder = install.folder

    async def release(self) -> None:
        """The model no longer imports from the folder; the last release removes it."""
        install, self._install = self._install, None
        if install is not None:
            await self._cache._leave(install)


class RequirementsCache:
    """The requirements folders of one server process, keyed by the file's SHA-256."""

    def __init__(self, parent: Path | None = None):
        self._parent = parent
        self._root: Path | None = None
        self._installs: dict[str, _Install] = {}

    async def install(self, model_name: str, requirements_file: Path) -> InstalledRequirements:
        """The installed folder for this file: pip's, or the one already there.

        Raises :class:`InvalidModelArtifact` (400) with pip's last lines when pip fails.
        Cancelled (the load timed out), it kills a pip no other load is waiting for.
        """
        digest = hashlib.sha256(requirements_file.read_bytes()).hexdigest()
        while (install := self._installs.get(digest)) is not None and install.closing:
            await install.gone.wait()
        if install is None:
            install = self._installs[digest] = _Install(digest, self._cache_root() / digest)
            log.info("model=%s installing code/%s (sha256 %s) with pip into %s", model_name,
                     REQUIREMENTS_FILE, digest, install.folder)
            install.task = asyncio.create_task(self._pip(install, requirements_file, model_name))
        elif install.task.done():
            log.info("model=%s reuses the packages of code/%s (sha256 %s) in %s", model_name,
                     REQUIREMENTS_FILE, digest, install.folder)
        else:
            log.info("model=%s waits for the pip already running on code/%s (sha256 %s)",
                     model_name, REQUIREMENTS_FILE, digest)
        install.users += 1
        try:
            await asyncio.shield(install.task)
        except BaseException:
            await self._leave(install)
            raise
        return InstalledRequirements(self, install)

    async def close(self) -> None:
        """Stop any pip still running and remove every folder (the server stops)."""
        for install in list(self._installs.values()):
            if install.task is not None and not install.task.done():
                install.task.cancel()
                await asyncio.wait([install.task])
        self._installs.clear()
        root, self._root = self._root, None
        if root is not None:
            await asyncio.to_thread(shutil.rmtree, root, True)

    def _cache_root(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="mmserver-requirements-",
                                               dir=self._parent))
        return self._root

    async def _pip(self, install: _Install, requirements_file: Path, model_name: str) -> None:
        """Run pip into the folder; on failure or cancellation, remove what it left."""
        started = time.perf_counter()
        try:
            await _run_pip(requirements_file, install.folder)
        except BaseException as error:
            install.closing = True
            await self._remove(install)
            if isinstance(error, InvalidModelArtifact):
                log.warning("model=%s pip failed on code/%s (sha256 %s)", model_name,
                            REQUIREMENTS_FILE, install.digest)
            raise
        log.info("model=%s installed code/%s (sha256 %s) in %.1f s", model_name,
                 REQUIREMENTS_FILE, install.digest, time.perf_counter() - started)

    async def _leave(self, install: _Install) -> None:
        install.users -= 1
        if install.users or install.closing:
            return
        install.closing = True
        task = install.task
        if not task.done():  # nobody waits for this pip any more: its task kills it
            task.cancel()
            await asyncio.wait([task])
        else:
            await self._remove(install)
            log.info("removed the packages of code/%s (sha256 %s): no loaded model uses them",
                     REQUIREMENTS_FILE, install.digest)

    async def _remove(self, install: _Install) -> None:
        """Rename the folder away, so its name is free for the next install, then delete it."""
        doomed = None
        try:
            if install.folder.exists():
                doomed = install.folder.with_name(
                    f"{install.folder.name}.removed-{uuid.uuid4().hex}")
                os.rename(install.folder, doomed)
        finally:
            if self._installs.get(install.digest) is install:
                del self._installs[install.digest]
            install.gone.set()
        if doomed is not None:
            await asyncio.to_thread(shutil.rmtree, doomed, True)


async def _run_pip(requirements_file: Path, target: Path) -> None:
    """``pip install --target`` in a process group of its own, killed whole if cancelled."""
    command = [sys.executable, "-m", "pip", "install", "--target", str(target),
               "--requirement", str(requirements_file), "--no-input",
               "--disable-pip-version-check", "--no-warn-script-location"]
    process = await asyncio.create_subprocess_exec(
        *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT, cwd=requirements_file.parent,
        start_new_session=True)
    try:
        output, _ = await process.communicate()
    except BaseException:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        await process.wait()
        raise
    if process.returncode != 0:
        raise InvalidModelArtifact(
            f"code/{REQUIREMENTS_FILE} could not be installed: pip exited with "
            f"{process.returncode}; its last lines:\n{pip_tail(output)}")


def pip_tail(output: bytes) -> str:
    """pip's last non-empty lines, where it says what failed."""
    lines = [line.rstrip() for line in output.decode(errors="replace").splitlines()
             if line.strip()]
    return "\n".join(lines[-PIP_TAIL_LINES:])[-PIP_TAIL_CHARS:]


def installed_module_names(folder: Path) -> frozenset[str]:
    """Top-level modules and packages pip put in the folder, from each distribution's RECORD.

    The RECORD lists every installed file, so namespace packages (no ``__init__.py``)
    count and the folder's ``bin/`` of scripts does not.
    """
    names = set()
    for record in folder.glob("*.dist-info/RECORD"):
        with open(record, newline="", encoding="utf-8") as lines:
            for row in csv.reader(lines):
                if not row:
                    continue
                first, _, rest = row[0].replace("\\", "/").partition("/")
                if rest:
                    if not first.endswith((".dist-info", ".data")):
                        names.add(first)
                elif first.endswith(".py"):
                    names.add(first[:-3])
                elif first.endswith((".so", ".pyd")):
                    names.add(first.split(".", 1)[0])
    return frozenset(n for n in names if n.isidentifier() and n not in _NOT_MODULES)
