"""What the engine holds, written beside its socket, so that a new engine can take over.

When the engine process dies (a segfault in a model's native code, ``abort()``, the
kernel's OOM killer) the models die with it, but the supervisor and the HTTP workers
live on. The supervisor starts a new engine and gives it a :class:`Restart`: the models
to load again, and the models that may not be loaded again. It learns both from the
:class:`Journal` the dead engine kept:

* ``held``: the models the engine served, in the order they were loaded (the memory
  budget admits them again in that order);
* ``loading``: the models whose loads were under way. An engine that died while loading
  a model was most likely killed by it, so that model is not loaded again: it is marked
  failed with the reason, and the server does not crash-loop on it;
* ``failed``: the models marked so far, name → (url, reason); loading the name again
  (``POST /models``) clears its mark.

The journal is rewritten whole (a temporary file, then ``os.replace``) at each load's
start and end and after each unload: a few hundred bytes per management call, nothing
per invocation.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Failure:
    """A model that killed its engine while loading: it stays unloaded, with the reason."""

    url: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Restart:
    """What the supervisor hands a new engine after the last one died."""

    #: The models to load again, (name, url), in their first load's order.
    restore: tuple[tuple[str, str], ...]
    failed: Mapping[str, Failure]
    #: Engines that died before this one, since the server started.
    restarts: int


@dataclasses.dataclass(frozen=True)
class State:
    held: tuple[tuple[str, str], ...] = ()
    loading: tuple[tuple[str, str], ...] = ()
    failed: Mapping[str, Failure] = dataclasses.field(default_factory=dict)


class Journal:
    """The engine's side: written by the engine, read by the supervisor once it died."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, held: Iterable[tuple[str, str]], loading: Iterable[tuple[str, str]],
              failed: Mapping[str, Failure]) -> None:
        state = {"held": [list(model) for model in held],
                 "loading": [list(model) for model in loading],
                 "failed": {name: dataclasses.asdict(f) for name, f in failed.items()}}
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(state))
        os.replace(partial, self.path)

    def read(self) -> State:
        """What the last write said; nothing when there was none."""
        try:
            state = json.loads(self.path.read_text())
        except FileNotFoundError:
            return State()
        return State(held=tuple(tuple(model) for model in state["held"]),
                     loading=tuple(tuple(model) for model in state["loading"]),
                     failed={name: Failure(**f) for name, f in state["failed"].items()})


def journal_beside(socket_path: str) -> Journal:
    """The journal of the engine serving ``socket_path``, in the socket's private folder."""
    return Journal(Path(socket_path).with_name("journal.json"))
