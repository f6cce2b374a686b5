"""The url sandbox: a model url, and every file its folder uses, must stay inside the model roots.

``POST /models`` names a folder to load and run code from, so a url that
resolves (after symlinks) outside the configured roots is refused (400), and
so is a symlink inside the folder that points outside them: otherwise the
server could be made to run code or read weights from anywhere.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from mmserver.errors import InvalidRequest, ModelUrlNotFound, UrlOutsideModelRoots


class ModelRoots:
    """The folders model urls must resolve inside, resolved once."""

    def __init__(self, roots: Iterable[Path | str]):
        self.roots = tuple(Path(os.path.realpath(r)) for r in roots)

    def resolve(self, url: str) -> Path:
        """A url (a path, optionally ``file://``) to a real directory inside a root.

        A relative url is looked up under each root in turn. Every file of the folder
        is checked too (:meth:`check_files`) before the path is returned.
        """
        raw = url[len("file://"):] if url.startswith("file://") else url
        if not raw or "\x00" in raw:
            raise InvalidRequest("url must be a non-empty path to a model directory")
        candidates = [Path(raw)] if os.path.isabs(raw) else [root / raw for root in self.roots]
        for candidate in candidates:
            try:
                real = Path(os.path.realpath(candidate))
                exists = real.exists()
            except (OSError, ValueError) as error:  # a name too long, say
                raise InvalidRequest(f"url {url[:300]!r} is not a usable path: "
                                     f"{getattr(error, 'strerror', None) or error}") from None
            self._check_inside(real, f"url {url!r}")
            if exists:
                if not real.is_dir():
                    raise InvalidRequest(f"url {url!r} is a file; it must be a model directory")
                self.check_files(real)
                return real
        raise ModelUrlNotFound(f"url {url!r} does not exist")

    def folders(self) -> dict[str, Path]:
        """The folders directly under the roots by name (the first root's wins), those that
        resolve inside a root."""
        found: dict[str, Path] = {}
        for root in self.roots:
            try:
                children = sorted(root.iterdir())
            except OSError:
                continue
            for child in children:
                real = Path(os.path.realpath(child))
                if child.name not in found and real.is_dir() and any(
                        real == r or real.is_relative_to(r) for r in self.roots):
                    found[child.name] = real
        return found

    def check_files(self, model_dir: Path) -> None:
        """Every symlink in the folder (``code/``, weights, ``mmserver.json``) stays inside a root."""
        for folder, subfolders, files in os.walk(model_dir):
            for name in [*subfolders, *files]:
                path = Path(folder) / name
                if path.is_symlink():
                    self._check_inside(Path(os.path.realpath(path)),
                                       f"{path.relative_to(model_dir)} in the model folder")

    def _check_inside(self, real: Path, what: str) -> None:
        if not any(real == root or real.is_relative_to(root) for root in self.roots):
            raise UrlOutsideModelRoots(
                f"{what} resolves outside the model roots "
                f"({', '.join(str(r) for r in self.roots)})")
