"""Which model host answered: a replica named as Ray Serve names it, with its process and node.

Every invocation's answer carries its replica's id (:data:`REPLICA_HEADER`), so a
client sees stickiness (the same model, the same replica, while it stays loaded)
and whether its request had to wait for a load (:data:`LOADED_HEADER`). Describe
lists each replica holding a model with its process id and node, which is how
the tests find the process to kill.
"""

from __future__ import annotations

import dataclasses
import os

#: The Serve replica id of the model host that answered an invocation.
REPLICA_HEADER = "X-Mmserver-Replica"
#: "1" when that host did not hold the model when the request arrived (it waited for a
#: load: a miss), "0" when it did (a hit).
LOADED_HEADER = "X-Mmserver-Loaded"


@dataclasses.dataclass(frozen=True)
class ReplicaRef:
    """One model host replica, as plain data that crosses processes."""

    #: Serve's id of the replica, unique within its deployment (``serve.get_replica_context``).
    replica_id: str
    pid: int
    #: The Ray node it runs on (hex id).
    node_id: str

    @classmethod
    def current(cls) -> ReplicaRef:
        """The replica this code runs in (only inside a Serve replica)."""
        import ray
        from ray import serve

        return cls(replica_id=serve.get_replica_context().replica_id.unique_id,
                   pid=os.getpid(), node_id=ray.get_runtime_context().get_node_id())
