"""A model folder's ``mmserver.json``, read once into a typed :class:`ModelSettings`.

Every key the file may hold is one field here, and nothing else reads the file:

* the batching knobs, under their ``mmserver.json`` keys (``batching.KNOBS``:
  ``max_batch_size``, ``max_wait_ms``...), kept as written: their values are checked by
  ``BatchSettings.overridden`` when the loader lays them over the server's own settings;
* ``row_wise`` and ``thread_safe``: true or false (a script may declare either too, with
  ``MMSERVER_ROW_WISE`` / ``MMSERVER_THREAD_SAFE``; the file wins);
* ``inputs`` and ``outputs``: the model's signature (:mod:`mmserver.signatures`);
* ``text``: the model takes strings, tokenized in the decode step (:mod:`mmserver.text`:
  ``{"tokenizer": "tokenizer.json", "max_length": 256}``), kept as written here and checked
  by the handler, which knows the folder;
* ``isolation``: ``"process"`` runs the model in a process of its own, ``"none"`` in the
  registry's (``mmserver.engine.isolated``); absent, the server's setting decides.

A key of no field is refused at load (400) with the keys there are, so a typo never
silently does nothing; adding a key is one field and one line of :meth:`ModelSettings.parse`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

from mmserver.batching import KNOBS
from mmserver.config import ISOLATIONS
from mmserver.errors import InvalidModelArtifact
from mmserver.signatures import INPUTS_KEY, OUTPUTS_KEY, TensorSpec, declared_specs
from mmserver.text import TEXT_KEY

SETTINGS_FILE = "mmserver.json"
#: The mmserver.json key, and the script attribute, that declare a script row-wise.
ROW_WISE_KEY = "row_wise"
ROW_WISE_ATTRIBUTE = "MMSERVER_ROW_WISE"
#: The mmserver.json key, and the script attribute, that let a script run on several instances.
THREAD_SAFE_KEY = "thread_safe"
THREAD_SAFE_ATTRIBUTE = "MMSERVER_THREAD_SAFE"
_KNOB_KEYS = frozenset(knob.key for knob in KNOBS)
#: The mmserver.json key that gives a model a process of its own.
ISOLATION_KEY = "isolation"
KEYS = frozenset({ROW_WISE_KEY, THREAD_SAFE_KEY, INPUTS_KEY, OUTPUTS_KEY, ISOLATION_KEY,
                  TEXT_KEY}) | \
    _KNOB_KEYS


@dataclasses.dataclass(frozen=True)
class ModelSettings:
    """What a model folder's ``mmserver.json`` says (all None or empty without one)."""

    #: Batching knobs by their ``mmserver.json`` key, values as written.
    batching: Mapping[str, object] = dataclasses.field(default_factory=dict)
    row_wise: bool | None = None
    thread_safe: bool | None = None
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    #: One of ``config.ISOLATIONS``, or None: the server's ``MMSERVER_ISOLATION`` decides.
    isolation: str | None = None
    #: The ``text`` entry as written (``mmserver.text.TextCodec.declared`` checks it).
    text: object = None

    @classmethod
    def read(cls, model_dir: Path) -> ModelSettings:
        """The folder's ``mmserver.json`` parsed, or the empty settings when it has none."""
        path = model_dir / SETTINGS_FILE
        if not path.is_file():
            return cls()
        try:
            raw = json.loads(path.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise InvalidModelArtifact(f"{SETTINGS_FILE} is not valid JSON: {error}") from None
        if not isinstance(raw, dict):
            raise InvalidModelArtifact(f"{SETTINGS_FILE} must hold a JSON object")
        return cls.parse(raw)

    @classmethod
    def parse(cls, raw: Mapping[str, object]) -> ModelSettings:
        unknown = sorted(set(raw) - KEYS)
        if unknown:
            raise InvalidModelArtifact(f"{SETTINGS_FILE}: unknown keys {unknown}; known: "
                                       f"{sorted(KEYS)}")
        return cls(
            batching={key: value for key, value in raw.items() if key in _KNOB_KEYS},
            row_wise=_yes_or_no(raw, ROW_WISE_KEY),
            thread_safe=_yes_or_no(raw, THREAD_SAFE_KEY),
            inputs=declared_specs(raw.get(INPUTS_KEY), f"{SETTINGS_FILE} {INPUTS_KEY}"),
            outputs=declared_specs(raw.get(OUTPUTS_KEY), f"{SETTINGS_FILE} {OUTPUTS_KEY}"),
            isolation=_isolation(raw.get(ISOLATION_KEY)),
            text=raw.get(TEXT_KEY))


def _yes_or_no(raw: Mapping[str, object], key: str) -> bool | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidModelArtifact(f"{key} ({SETTINGS_FILE}) must be true or false, "
                                   f"got {value!r}")
    return value


def _isolation(value: object) -> str | None:
    if value is not None and value not in ISOLATIONS:
        raise InvalidModelArtifact(f"{ISOLATION_KEY} ({SETTINGS_FILE}) must be one of "
                                   f"{', '.join(map(repr, ISOLATIONS))}, got {value!r}")
    return value
