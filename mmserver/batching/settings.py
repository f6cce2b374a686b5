"""The knobs of one ``ModelRunner``, each declared once.

A knob is a :class:`BatchSettings` field (its default and its check) plus one
:class:`Knob` line that says how every edge spells it: the ``mmserver.json``
key, the command-line flag (the key with dashes), the environment variable,
and the unit the edges use (``max_wait`` is seconds inside, milliseconds at
every edge). The environment, the command line, ``mmserver.json`` and the
describe answer all derive from :data:`KNOBS`; nothing else repeats a knob.
See the package docstring of ``mmserver.batching`` for what each knob does to
latency and throughput.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

POLICIES = ("greedy", "timer")
SIZINGS = ("max", "measured")


@dataclasses.dataclass(frozen=True)
class Knob:
    """How the edges spell one :class:`BatchSettings` field."""

    field: str
    #: The ``mmserver.json`` key; ``--key-with-dashes`` on the command line.
    key: str
    env: str
    #: The edges' unit, for help texts ("rows", "ms", "requests"); empty for a word.
    unit: str
    help: str
    #: The Python type an edge value has (int, float or str).
    kind: type
    #: Edge value = field value x this (1000 for a wait in ms held in seconds).
    edge_per_field: float = 1
    choices: tuple[str, ...] = ()
    #: A variable read when ``env`` is unset (SageMaker's own name for the same setting).
    fallback_env: str | None = None
    #: The smallest field value allowed (numbers only; a word must be one of ``choices``).
    minimum: float = 0
    #: The field's own unit, where it differs from the edges' (``max_wait``: seconds).
    field_unit: str = ""

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def edge_value(self, settings: BatchSettings) -> object:
        value = getattr(settings, self.field)
        return value * self.edge_per_field if self.edge_per_field != 1 else value

    def check(self, value: object) -> None:
        """Refuse a field value this knob's kind, minimum or choices do not allow."""
        if self.choices:
            if value not in self.choices:
                raise ValueError(f"{self.field} must be one of {self.choices}, got {value!r}")
            return
        number = not isinstance(value, bool) and isinstance(value, self.kind | int)
        if self.kind is int and not (number and value >= self.minimum):
            raise ValueError(f"{self.field} must be an integer >= {self.minimum}, got {value!r}")
        if self.kind is float and not (number and value >= self.minimum and math.isfinite(value)):
            unit = f" of {self.field_unit}" if self.field_unit else ""
            raise ValueError(f"{self.field} must be a finite number{unit} >= {self.minimum}, "
                             f"got {value!r}")

    def field_value(self, edge_value: object) -> object:
        if self.edge_per_field == 1:
            return edge_value
        if isinstance(edge_value, bool) or not isinstance(edge_value, (int, float)):
            raise ValueError(f"{self.key} must be a number, got {edge_value!r}")
        return edge_value / self.edge_per_field


@dataclasses.dataclass(frozen=True)
class BatchSettings:
    """The knobs of one runner, each checked by its :class:`Knob` (see the module docstring)."""

    max_batch_size: int = 16
    max_wait: float = 0.005
    max_queue_size: int = 256
    policy: str = "greedy"
    batch_sizing: str = "max"
    instances: int = 1
    #: A text model's bound on a call's padded tokens (rows x longest row); 0: none.
    max_batch_tokens: int = 0

    def __post_init__(self):
        for knob in KNOBS:
            knob.check(getattr(self, knob.field))

    def overridden(self, overrides: Mapping[str, object]) -> BatchSettings:
        """These settings with edge values on top (``mmserver.json`` keys); unknown keys are refused.

        A ``ValueError`` names the edge key (``max_wait_ms``), not the field.
        """
        unknown = set(overrides) - KNOBS_BY_KEY.keys()
        if unknown:
            raise ValueError(f"unknown batching settings {sorted(unknown)}; "
                             f"known: {sorted(KNOBS_BY_KEY)}")
        changes = {KNOBS_BY_KEY[key].field: KNOBS_BY_KEY[key].field_value(value)
                   for key, value in overrides.items()}
        try:
            return dataclasses.replace(self, **changes)
        except ValueError as error:
            knob = KNOBS_BY_FIELD.get(str(error).partition(" ")[0])
            if knob is None or knob.key == knob.field:
                raise
            raise ValueError(f"{knob.key}={overrides[knob.key]!r} is not allowed: {error}") from None


KNOBS = (
    Knob("max_batch_size", "max_batch_size", "MMSERVER_MAX_BATCH_SIZE", "rows",
         "the most rows one model call sees", int, minimum=1),
    Knob("max_batch_tokens", "max_batch_tokens", "MMSERVER_MAX_BATCH_TOKENS", "tokens",
         "for a text model, the most padded tokens (rows x longest row) one model call sees; "
         "a longer request runs alone; 0: no token budget", int, minimum=0),
    Knob("max_wait", "max_wait_ms", "MMSERVER_MAX_WAIT_MS", "ms",
         "how long the oldest queued request may wait for company", float, edge_per_field=1000,
         minimum=0, field_unit="seconds"),
    Knob("max_queue_size", "max_queue_size", "MMSERVER_MAX_QUEUE_SIZE", "requests",
         "requests admitted and not yet running; past it, 503", int, minimum=1),
    Knob("policy", "policy", "MMSERVER_BATCH_POLICY", "",
         "when a batch runs: greedy (when the model is idle) or timer (the book's rule)", str,
         choices=POLICIES),
    Knob("batch_sizing", "batch_sizing", "MMSERVER_BATCH_SIZING", "",
         "when a batch is full: at max_batch_size rows, or at the size measured to serve the "
         "most rows/s", str, choices=SIZINGS),
    Knob("instances", "instances", "MMSERVER_INSTANCES", "",
         "batches of one model run at once, on threads sharing one copy of its weights "
         "(a script: only if it declares itself thread-safe)", int, minimum=1,
         fallback_env="SAGEMAKER_MODEL_SERVER_WORKERS"),
)
KNOBS_BY_KEY = {knob.key: knob for knob in KNOBS}
KNOBS_BY_FIELD = {knob.field: knob for knob in KNOBS}
