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

    @property
    def flag(self) -> str:
        return "--" + self.key.replace("_", "-")

    def edge_value(self, settings: BatchSettings) -> object:
        value = getattr(settings, self.field)
        return value * self.edge_per_field if self.edge_per_field != 1 else value

    def field_value(self, edge_value: object) -> object:
        if self.edge_per_field == 1:
            return edge_value
        if isinstance(edge_value, bool) or not isinstance(edge_value, (int, float)):
            raise ValueError(f"{self.key} must be a number, got {edge_value!r}")
        return edge_value / self.edge_per_field


@dataclasses.dataclass(frozen=True)
class BatchSettings:
    """The knobs of one runner, checked once here (see the module docstring)."""

    max_batch_size: int = 16
    max_wait: float = 0.005
    max_queue_size: int = 256
    policy: str = "greedy"
    batch_sizing: str = "max"
    instances: int = 1

    def __post_init__(self):
        if isinstance(self.max_batch_size, bool) or not isinstance(self.max_batch_size, int) \
                or self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1, got {self.max_batch_size!r}")
        if isinstance(self.max_wait, bool) or not isinstance(self.max_wait, (int, float)) \
                or not (self.max_wait >= 0 and math.isfinite(self.max_wait)):
            raise ValueError(f"max_wait must be a finite number of seconds >= 0, "
                             f"got {self.max_wait!r}")
        if isinstance(self.max_queue_size, bool) or not isinstance(self.max_queue_size, int) \
                or self.max_queue_size < 1:
            raise ValueError(f"max_queue_size must be an integer >= 1, got {self.max_queue_size!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.batch_sizing not in SIZINGS:
            raise ValueError(f"batch_sizing must be one of {SIZINGS}, got {self.batch_sizing!r}")
        if isinstance(self.instances, bool) or not isinstance(self.instances, int) \
                or self.instances < 1:
            raise ValueError(f"instances must be an integer >= 1, got {self.instances!r}")

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
            knob = KNOBS_BY_FIELD.get(str(error).split(" ", 1)[0])
            if knob is None or knob.key == knob.field:
                raise
            raise ValueError(f"{knob.key}={overrides[knob.key]!r} is not allowed: {error}") from None


KNOBS = (
    Knob("max_batch_size", "max_batch_size", "MMSERVER_MAX_BATCH_SIZE", "rows",
         "the most rows one model call sees", int),
    Knob("max_wait", "max_wait_ms", "MMSERVER_MAX_WAIT_MS", "ms",
         "how long the oldest queued request may wait for company", float, edge_per_field=1000),
    Knob("max_queue_size", "max_queue_size", "MMSERVER_MAX_QUEUE_SIZE", "requests",
         "requests admitted and not yet in a batch; past it, 503", int),
    Knob("policy", "policy", "MMSERVER_BATCH_POLICY", "",
         "when a batch runs: greedy (when the model is idle) or timer (the book's rule)", str,
         choices=POLICIES),
    Knob("batch_sizing", "batch_sizing", "MMSERVER_BATCH_SIZING", "",
         "when a batch is full: at max_batch_size rows, or at the size measured to serve the "
         "most rows/s", str, choices=SIZINGS),
    Knob("instances", "instances", "MMSERVER_INSTANCES", "",
         "batches of one model run at once, on threads sharing one copy of its weights "
         "(a script: only if it declares itself thread-safe)", int,
         fallback_env="SAGEMAKER_MODEL_SERVER_WORKERS"),
)
KNOBS_BY_KEY = {knob.key: knob for knob in KNOBS}
KNOBS_BY_FIELD = {knob.field: knob for knob in KNOBS}
