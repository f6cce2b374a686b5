"""A server setting declared once: its variable, its flag, its Ray argument and its check.

One :class:`Setting` line (``config.SETTINGS``) is the whole of a setting outside the code
that uses its value: ``Settings.from_env`` reads its variable, ``cli`` adds its flag,
``ray.settings`` takes its application argument, and every edge reads the text (or a YAML
value, on Ray) with the same :meth:`Setting.read`, so one value is accepted or refused alike
on every host (``tests/test_settings_agree.py`` tries each declaration on each edge). The
batching knobs have a table of their own (``batching.KNOBS``) because ``mmserver.json``
spells them too. Imports nothing of the package but its readers of text.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from collections.abc import Callable
from pathlib import Path

#: The kind of a setting that names folders (``a:b`` as text, a list on Ray).
FOLDERS = "folders"


def integer(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"must be an integer, got {raw!r}") from None


def number(raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"must be a number, got {raw!r}") from None


def boolean(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"must be true or false, got {raw!r}")


def text(raw: str) -> str:
    return raw


def paths(raw: str) -> tuple[Path, ...]:
    return tuple(Path(p) for p in raw.split(os.pathsep) if p)


_TEXT_READERS: dict[object, Callable[[str], object]] = {
    int: integer, float: number, bool: boolean, str: text, FOLDERS: paths}
#: What a YAML value of each kind may be (a bool is never a number).
_YAML_KINDS: dict[object, tuple[type, ...]] = {
    int: (int,), float: (int, float), bool: (bool,), str: (str,)}
_WHAT = {int: "an integer", float: "a number", bool: "true or false", str: "text"}


@dataclasses.dataclass(frozen=True)
class Setting:
    """How every edge spells one ``config.Settings`` field, and what it allows."""

    field: str
    #: The environment variable; None for an argument of the Ray application only.
    env: str | None
    #: ``int``, ``float``, ``bool``, ``str`` or :data:`FOLDERS`: how text is read.
    kind: object
    help: str
    #: The Ray argument's name, and the flag's with dashes; the field's name by default.
    key: str = ""
    #: ``mmserver serve`` takes it as ``--key-with-dashes`` (or this spelling, when text); every
    #: setting has a flag unless the command line has no use for it.
    flag: bool | str = True
    #: The Ray application takes it as ``key=value`` (``mmserver.ray.settings``).
    ray: bool = False
    #: Repeating the flag adds to the value (folders).
    repeatable: bool = False
    minimum: float | None = None
    #: The value must be greater than this (a size or a time limit of 0 would refuse all).
    above: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    #: The field's value from the edges' (megabytes to bytes); None: the same value.
    to_field: Callable[[object], object] | None = None

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", self.field)

    @property
    def flag_name(self) -> str | None:
        if not self.flag:
            return None
        return self.flag if isinstance(self.flag, str) else "--" + self.key.replace("_", "-")

    def read(self, value: object) -> object:
        """The field's value from an edge's: text (a variable, a flag, ``key=value``) or a
        YAML value; ``ValueError`` says what is wrong, without naming the edge."""
        if isinstance(value, str):
            edge = _TEXT_READERS[self.kind](value.strip())
        elif self.kind is FOLDERS and isinstance(value, (list, tuple)) and \
                all(isinstance(v, str) and v for v in value):
            edge = tuple(Path(v) for v in value)
        elif self.kind is not FOLDERS and isinstance(value, _YAML_KINDS[self.kind]) and \
                not (isinstance(value, bool) and self.kind is not bool):
            edge = value
        else:
            what = (f"folders separated by {os.pathsep!r}, or a list" if self.kind is FOLDERS
                    else _WHAT[self.kind])
            raise ValueError(f"must be {what}, got {value!r}")
        self.check(edge)
        return edge if self.to_field is None else self.to_field(edge)

    def check(self, value: object) -> None:
        """Refuse an edge value outside the declared bounds or choices."""
        if self.kind is FOLDERS and not value:
            raise ValueError("must name at least one folder")
        if self.choices and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(self.choices)}, got {value!r}")
        if self.kind in (int, float):
            if self.kind is float and not math.isfinite(value):
                raise ValueError(f"must be a finite number, got {value!r}")
            if self.minimum is not None and value < self.minimum:
                raise ValueError(f"must be >= {self.minimum:g}, got {value!r}")
            if self.above is not None and value <= self.above:
                raise ValueError(f"must be > {self.above:g}, got {value!r}")
            if self.maximum is not None and value > self.maximum:
                raise ValueError(f"must be <= {self.maximum:g}, got {value!r}")

    def flag_type(self, raw: str) -> object:
        """argparse's ``type``: :meth:`read`, its error as argparse reports one."""
        try:
            return self.read(raw)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
