"""Import a model's ``code/`` folder so that its modules belong to that model alone.

Toolkit users split their code the way training scripts are split: ``code/model.py``
defines ``Net``, ``code/inference.py`` does ``from model import Net``. Python keeps
one ``sys.modules["model"]`` per process, so a second model shipping its own
``code/model.py`` would silently get the first one's ``Net``; and putting folders
on ``sys.path`` while loads run at the same moment in separate threads races.

So each model's folder becomes a package of its own, ``mmserver_models.m<hex>``,
whose ``__path__`` is the folder. Its modules are executed with a private
``__import__`` that turns a top-level import of a name the folder holds
(``import model``, ``from utils import f``, also inside functions at request
time) into an import of ``mmserver_models.m<hex>.model``; every other import
goes to Python as usual. Nothing touches ``sys.path``, two models never share a
module, and :meth:`UserCode.close` drops them all from ``sys.modules``.
Bytecode is never written into the model's folder (it may be read-only, and it
is not ours).

Third-party packages are never renamed: only the folder's own modules are. A model
that ships ``code/requirements.txt`` runs in a process of its own, with its packages
first on that process's ``sys.path`` under their real names
(:mod:`mmserver.handler.requirements`), because real packages import their own
submodules by name (``importlib.import_module("transformers.models")``), which no
per-model alias can follow.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import sys
import threading
import types
import uuid
from pathlib import Path
from typing import Any

ROOT_PACKAGE = "mmserver_models"

_real_import = builtins.__import__
_lock = threading.Lock()
#: Package name of each imported model folder -> the builtins its modules run with.
_builtins_by_package: dict[str, dict[str, Any]] = {}


class UserCode:
    """One model's imported script and the private package its sibling modules live in."""

    def __init__(self, package: str, module: types.ModuleType):
        self.package = package
        self.module = module

    def close(self) -> None:
        """Forget every module of this model, so unloading really frees them."""
        with _lock:
            _builtins_by_package.pop(self.package, None)
        prefix = self.package + "."
        for name in [n for n in list(sys.modules) if n == self.package or n.startswith(prefix)]:
            sys.modules.pop(name, None)


def import_program(code_dir: Path, program: str) -> UserCode:
    """Execute ``code_dir/program`` as this model's own module (any exception propagates)."""
    _install_finder()
    package = f"{ROOT_PACKAGE}.m{uuid.uuid4().hex}"
    local_names, search_path = _local_module_names(code_dir), [str(code_dir)]
    private_builtins = dict(builtins.__dict__)
    private_builtins["__import__"] = _import_for(package, local_names)
    with _lock:
        _builtins_by_package[package] = private_builtins
    folder = types.ModuleType(package)
    folder.__path__ = search_path
    folder.__spec__ = importlib.machinery.ModuleSpec(package, None, is_package=True)
    folder.__spec__.submodule_search_locations = folder.__path__
    sys.modules[package] = folder
    name = f"{package}.{Path(program).stem.replace('.', '_')}"
    loader = _FolderLoader(name, str(code_dir / program), private_builtins)
    spec = importlib.util.spec_from_file_location(name, code_dir / program, loader=loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    code = UserCode(package, module)
    try:
        loader.exec_module(module)
    except BaseException:
        code.close()
        raise
    return code


def _local_module_names(code_dir: Path) -> frozenset[str]:
    """Top-level names the folder provides: ``x.py`` files and ``x/__init__.py`` packages."""
    names = {p.stem for p in code_dir.glob("*.py")}
    names.update(p.parent.name for p in code_dir.glob("*/__init__.py"))
    return frozenset(n for n in names if n.isidentifier())


def _import_for(package: str, local_names: frozenset[str]):
    def import_(name, globals=None, locals=None, fromlist=(), level=0):
        top = name.partition(".")[0]
        if level == 0 and top in local_names:
            module = _real_import(f"{package}.{name}", globals, locals, fromlist, 0)
            return module if fromlist else sys.modules[f"{package}.{top}"]
        return _real_import(name, globals, locals, fromlist, level)

    return import_


class _FolderLoader(importlib.machinery.SourceFileLoader):
    """Runs a module of a model's folder with that model's private ``__import__``."""

    def __init__(self, fullname: str, path: str, private_builtins: dict[str, Any]):
        super().__init__(fullname, path)
        self._builtins = private_builtins

    def exec_module(self, module: types.ModuleType) -> None:
        module.__builtins__ = self._builtins
        super().exec_module(module)

    def set_data(self, path, data, *, _mode=0o666) -> None:
        """Never write ``__pycache__`` into the model's folder."""


class _FolderFinder:
    """Finds the modules of ``mmserver_models.m<hex>`` packages and hands them a folder loader."""

    @staticmethod
    def find_spec(fullname: str, path=None, target=None):
        parts = fullname.split(".")
        if parts[0] != ROOT_PACKAGE or len(parts) < 3:
            return None
        with _lock:
            private_builtins = _builtins_by_package.get(".".join(parts[:2]))
        if private_builtins is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
            spec.loader = _FolderLoader(fullname, spec.origin, private_builtins)
        return spec


_finder = _FolderFinder()


def _install_finder() -> None:
    with _lock:
        if ROOT_PACKAGE not in sys.modules:
            root = types.ModuleType(ROOT_PACKAGE)
            root.__path__ = []
            root.__spec__ = importlib.machinery.ModuleSpec(ROOT_PACKAGE, None, is_package=True)
            sys.modules[ROOT_PACKAGE] = root
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)
