"""The application's ``key=value`` arguments: what ``mmserver serve`` is told, plus the cluster's shape.

``serve run mmserver.ray:app model_roots=/models max_batch_size=32 num_replicas=4``
passes every argument as text; ``deploy/ray_serve.yaml``'s ``args`` may pass numbers
and lists. Either way :meth:`ClusterSettings.from_args` reads them on top of
:meth:`mmserver.config.Settings.from_env` (the ``MMSERVER_*`` and ``SAGEMAKER_*``
variables of the process that builds the application), refuses an unknown key
with the list of known ones, and names the key of a bad value. The batching knobs
are :data:`mmserver.batching.KNOBS`' ``mmserver.json`` keys, and the server's settings
those of :data:`mmserver.config.SETTINGS` declared ``ray=True``, each read and checked by
its declaration as its variable and its flag are, so a new one is an argument here too
without a line in this module.

Per replica, as ``mmserver serve`` is per process: ``model_roots``, ``memory_budget_mb``
and ``max_models`` (Ray's ``max_num_models_per_replica``). For the cluster:
``num_replicas`` (model hosts), ``replica_cpus`` (Ray CPUs each host reserves),
``max_ongoing_requests`` (what one host takes at once before Ray's router tries
another, which then loads the model: see docs/design.md section 11) and
``max_replicas_per_node``. Imports nothing of Ray, so it is checked without a cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from mmserver.batching.settings import KNOBS_BY_KEY
from mmserver.config import EDGE_PARSERS, SETTINGS, Settings
from mmserver.setting import Setting

#: Ray Serve's own default is 5, which would cap every batch at 5 requests.
DEFAULT_MAX_ONGOING_REQUESTS = 64
DEFAULT_NUM_REPLICAS = 2


#: The arguments of the cluster's shape (no variable, no flag: ``mmserver serve`` has none).
CLUSTER_SETTINGS = (
    Setting("num_replicas", None, int, "model hosts", flag=False, ray=True, minimum=1),
    Setting("replica_cpus", None, float, "Ray CPUs each model host reserves", flag=False, ray=True,
            minimum=0),
    Setting("max_ongoing_requests", None, int,
            "requests one host takes at once before Ray's router tries another",
            flag=False, ray=True,
            minimum=1),
    Setting("max_replicas_per_node", None, int, "model hosts a node may hold", flag=False, ray=True,
            minimum=1),
)
#: The server's settings a replica takes from the application's arguments (``config.SETTINGS``
#: lines with ``ray=True``), by argument.
SERVER_ARGUMENTS = {setting.key: setting for setting in SETTINGS if setting.ray}
_CLUSTER_ARGUMENTS = {setting.key: setting for setting in CLUSTER_SETTINGS}
#: Every argument the application takes.
ARGUMENTS = tuple(sorted([*SERVER_ARGUMENTS, *_CLUSTER_ARGUMENTS, *KNOBS_BY_KEY]))


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
        knobs, server, cluster = {}, {}, {}
        for key, raw in args.items():
            try:
                if key in KNOBS_BY_KEY:
                    knobs[key] = _knob_value(key, raw)
                elif key in SERVER_ARGUMENTS:
                    server[SERVER_ARGUMENTS[key].field] = SERVER_ARGUMENTS[key].read(raw)
                else:
                    cluster[_CLUSTER_ARGUMENTS[key].field] = _CLUSTER_ARGUMENTS[key].read(raw)
            except ValueError as error:
                raise ValueError(f"{key}={raw!r}: {error}") from None
        base = Settings.from_env(environ)
        batch = base.batch.overridden(knobs)
        return cls(server=dataclasses.replace(base, batch=batch, **server), **cluster)


def _knob_value(key: str, raw: object) -> object:
    """A batching knob's edge value: text parsed by its kind; a YAML value as it is
    (``BatchSettings`` checks both)."""
    knob = KNOBS_BY_KEY[key]
    return EDGE_PARSERS[knob.kind](raw.strip()) if isinstance(raw, str) else raw

