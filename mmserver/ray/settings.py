"""The application's ``key=value`` arguments: what ``mmserver serve`` is told, plus the cluster's shape.

``serve run mmserver.ray:app model_roots=/models max_batch_size=32 num_replicas=4``
passes every argument as text; ``deploy/ray_serve.yaml``'s ``args`` may pass numbers
and lists. Either way :meth:`ClusterSettings.from_args` reads them on top of
:meth:`mmserver.config.Settings.from_env` (the ``MMSERVER_*`` and ``SAGEMAKER_*``
variables of the process that builds the application), refuses an unknown key
with the list of known ones, and names the key of a bad value. The batching knobs
are :data:`mmserver.batching.KNOBS`' ``mmserver.json`` keys, so a new knob is an
argument here too without a line in this module.

Per replica, as ``mmserver serve`` is per process: ``memory_budget_mb`` and
``max_models`` (Ray's ``max_num_models_per_replica``). For the cluster:
``num_replicas`` (model hosts), ``replica_cpus`` (Ray CPUs each host reserves),
``max_ongoing_requests`` (what one host takes at once before Ray's router tries
another, which then loads the model: see docs/design.md section 11) and
``max_replicas_per_node``. Imports nothing of Ray, so it is checked without a cluster.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from mmserver.batching.settings import KNOBS_BY_KEY
from mmserver.config import EDGE_PARSERS, Settings, integer, number, paths

#: Ray Serve's own default is 5, which would cap every batch at 5 requests.
DEFAULT_MAX_ONGOING_REQUESTS = 64
DEFAULT_NUM_REPLICAS = 2


def _typed(parse_text: Callable[[str], object], kinds: tuple[type, ...], what: str):
    """A reader of one argument: text through ``parse_text``, or a YAML value of ``kinds``."""

    def read(value: object) -> object:
        if isinstance(value, str):
            return parse_text(value.strip())
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise ValueError(f"must be {what}, got {value!r}")
        return value
    return read


def _at_least(read: Callable[[object], object], low: float, inclusive: bool = True):
    def checked(value: object) -> object:
        number_ = read(value)
        if number_ < low or (not inclusive and number_ == low):
            bound = f">= {low:g}" if inclusive else f"> {low:g}"
            raise ValueError(f"must be {bound}, got {number_!r}")
        return number_
    return checked


def _model_roots(value: object) -> tuple[Path, ...]:
    """``a:b`` as text, or a YAML list of folders."""
    if isinstance(value, str):
        roots = paths(value.strip())
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) and v for v in value):
        roots = tuple(Path(v) for v in value)
    else:
        raise ValueError(f"must be folders separated by {os.pathsep!r}, or a list, got {value!r}")
    if not roots:
        raise ValueError("must name at least one folder")
    return roots


_integer = _typed(integer, (int,), "an integer")
_number = _typed(number, (int, float), "a number")

#: The arguments that are not batching knobs: key -> reader of its value.
_READERS: dict[str, Callable[[object], object]] = {
    "model_roots": _model_roots,
    "memory_budget_mb": _at_least(_number, 0, inclusive=False),
    "max_models": _at_least(_integer, 1),
    "num_replicas": _at_least(_integer, 1),
    "replica_cpus": _at_least(_number, 0),
    "max_ongoing_requests": _at_least(_integer, 1),
    "max_replicas_per_node": _at_least(_integer, 1),
}
#: Every argument the application takes.
ARGUMENTS = tuple(sorted([*_READERS, *KNOBS_BY_KEY]))


@dataclasses.dataclass(frozen=True)
class ClusterSettings:
    """What each model host serves with, and how many hosts there are and where."""

    #: One replica's settings, as ``mmserver serve``'s: model roots, batching, limits,
    #: ``memory_budget_bytes`` and ``max_models`` per replica.
    server: Settings
    num_replicas: int = DEFAULT_NUM_REPLICAS
    #: Ray CPUs each model host reserves (its torch threads follow Ray's OMP_NUM_THREADS).
    replica_cpus: float = 1.0
    max_ongoing_requests: int = DEFAULT_MAX_ONGOING_REQUESTS
    max_replicas_per_node: int | None = None

    @classmethod
    def from_args(cls, args: Mapping[str, object] | None,
                  environ: Mapping[str, str] | None = None) -> ClusterSettings:
        """The builder's ``args`` over the environment's settings; ``ValueError`` names the key."""
        args = dict(args or {})
        unknown = sorted(set(args) - set(ARGUMENTS))
        if unknown:
            raise ValueError(f"unknown arguments {unknown}; known: {', '.join(ARGUMENTS)}")
        values = {}
        for key, raw in args.items():
            try:
                values[key] = _knob_value(key, raw) if key in KNOBS_BY_KEY else _READERS[key](raw)
            except ValueError as error:
                raise ValueError(f"{key}={raw!r}: {error}") from None
        server = Settings.from_env(environ)
        batch = server.batch.overridden({k: v for k, v in values.items() if k in KNOBS_BY_KEY})
        server = dataclasses.replace(server, batch=batch, **_given({
            "model_roots": values.get("model_roots"),
            "memory_budget_bytes": (None if "memory_budget_mb" not in values
                                    else int(values["memory_budget_mb"] * 2**20)),
            "max_models": values.get("max_models"),
        }))
        return cls(server=server, **_given({
            "num_replicas": values.get("num_replicas"),
            "replica_cpus": values.get("replica_cpus"),
            "max_ongoing_requests": values.get("max_ongoing_requests"),
            "max_replicas_per_node": values.get("max_replicas_per_node"),
        }))


def _knob_value(key: str, raw: object) -> object:
    """A batching knob's edge value: text parsed by its kind; a YAML value as it is
    (``BatchSettings`` checks both)."""
    knob = KNOBS_BY_KEY[key]
    return EDGE_PARSERS[knob.kind](raw.strip()) if isinstance(raw, str) else raw


def _given(values: dict[str, object]) -> dict[str, object]:
    return {key: value for key, value in values.items() if value is not None}

