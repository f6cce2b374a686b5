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

The packages of the model's ``code/requirements.txt`` (installed by
:mod:`mmserver.handler.requirements` into a folder of their own) are imported the same way:
that folder comes second in the package's ``__path__``, and its top-level names
join the folder's, so ``import transformers`` in the script, and every import
among the installed packages, finds this model's copy. What this does not cover:

* a top-level name the server process has already imported (``torch``, ``numpy``,
  ...) stays the server's module: one process cannot hold two copies of most
  compiled libraries, so a requirement pinning another version of them is
  installed but not used (:attr:`UserCode.left_to_the_server` lists them);
* imports that bypass ``__import__`` (``importlib.import_module("name")`` with an
  absolute name), and imports made by modules the server itself imported;
* ``.pth`` files and console scripts of the installed packages;
* compiled extension modules are loaded under the private name and are not
  promised to work (a library may refuse a second copy in one process);
* pickles that name a module of the folder name the private package.

Installed *distributions* are the model's too: many packages read their own version or
entry points through :mod:`importlib.metadata` as they import (``huggingface_hub``
does). The same finder that finds the folder's modules answers ``importlib.metadata``'s
search for distributions, first, with the ``*.dist-info`` of the requirements folder
of the model whose code is asking; the asking model is the nearest frame on the
caller's stack that runs a module of a ``mmserver_models.m<hex>`` package, so a call
made from the model's script, from a package it installed, or from a thread either
started is answered for that model, and a call from any other code (the server,
another model) never sees them.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import threading
import types
import uuid
from pathlib import Path
from typing import Any

from mmserver.handler.requirements import installed_module_names

ROOT_PACKAGE = "mmserver_models"

_real_import = builtins.__import__
_lock = threading.Lock()
#: Package name of each imported model folder -> the builtins its modules run with.
_builtins_by_package: dict[str, dict[str, Any]] = {}
#: Package name of a model folder -> where its ``code/requirements.txt`` was installed.
_packages_dir_by_package: dict[str, str] = {}


class UserCode:
    """One model's imported script and the private package its sibling modules live in."""

    def __init__(self, package: str, module: types.ModuleType,
                 left_to_the_server: frozenset[str] = frozenset()):
        self.package = package
        self.module = module
        #: Installed top-level names the server had already imported: those stay the server's.
        self.left_to_the_server = left_to_the_server

    def close(self) -> None:
        """Forget every module of this model, so unloading really frees them."""
        with _lock:
            _builtins_by_package.pop(self.package, None)
            _packages_dir_by_package.pop(self.package, None)
        prefix = self.package + "."
        for name in [n for n in list(sys.modules) if n == self.package or n.startswith(prefix)]:
            sys.modules.pop(name, None)


def import_program(code_dir: Path, program: str, packages_dir: Path | None = None) -> UserCode:
    """Execute ``code_dir/program`` as this model's own module (any exception propagates).

    ``packages_dir``: where this model's ``code/requirements.txt`` was installed; its
    modules are found after the folder's own.
    """
    _install_finder()
    package = f"{ROOT_PACKAGE}.m{uuid.uuid4().hex}"
    local_names, search_path = _local_module_names(code_dir), [str(code_dir)]
    left_to_the_server: frozenset[str] = frozenset()
    if packages_dir is not None:
        installed = installed_module_names(packages_dir)
        left_to_the_server = frozenset(n for n in installed if n in sys.modules)
        local_names |= installed - left_to_the_server
        search_path.append(str(packages_dir))
    private_builtins = dict(builtins.__dict__)
    private_builtins["__import__"] = _import_for(package, local_names)
    with _lock:
        _builtins_by_package[package] = private_builtins
        if packages_dir is not None:
            _packages_dir_by_package[package] = str(packages_dir)
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
    code = UserCode(package, module, left_to_the_server)
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


    @staticmethod
    def find_distributions(context=importlib.metadata.DistributionFinder.Context()):
        """The asking model's installed distributions (module docstring), else none."""
        if "path" in vars(context):  # the caller searches folders of its own choosing
            return iter(())
        packages_dir = _asking_models_packages()
        if packages_dir is None:
            return iter(())
        return importlib.metadata.MetadataPathFinder.find_distributions(
            importlib.metadata.DistributionFinder.Context(name=context.name,
                                                          path=[packages_dir]))


def _asking_models_packages() -> str | None:
    """The requirements folder of the model whose module is nearest on the caller's stack."""
    frame = sys._getframe(1)
    prefix = ROOT_PACKAGE + "."
    while frame is not None:
        name = frame.f_globals.get("__name__")
        if isinstance(name, str) and name.startswith(prefix):
            package = ".".join(name.split(".", 2)[:2])
            with _lock:
                return _packages_dir_by_package.get(package)
        frame = frame.f_back
    return None


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
