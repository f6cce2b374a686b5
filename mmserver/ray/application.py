"""``mmserver.ray:app``: the Serve application builder, three deployments wired together.

``serve run mmserver.ray:app model_roots=/models num_replicas=2`` and
``serve deploy deploy/ray_serve.yaml`` both call :func:`app` with the
``key=value`` arguments (``settings.ClusterSettings``). The application:

* ``mmserver-ingress``: one replica, the HTTP routes (``ingress``);
* ``mmserver-registrations``: one replica, the registered names (``registrations``);
* ``mmserver-model-host``: ``num_replicas`` replicas, each loading, batching and
  serving models (``host``), at most ``max_replicas_per_node`` on a node.

The ingress and the registrations reserve no CPU and run on the head node
(Ray's ``node:__internal_head__`` resource), so that losing a worker node loses
neither the routes nor a registration; the model hosts go where Ray's scheduler
puts them (it spreads a deployment's replicas over the nodes).
"""

from __future__ import annotations

from collections.abc import Mapping

from ray import serve
from ray.serve import Application

from mmserver.ray.host import ModelHost
from mmserver.ray.ingress import Ingress
from mmserver.ray.registrations import Registrations
from mmserver.ray.replies import errors_returned
from mmserver.ray.settings import ClusterSettings

#: Ray's resource that only the head node has; a tiny share of it pins an actor there.
ON_HEAD_NODE = {"num_cpus": 0, "resources": {"node:__internal_head__": 0.001}}
#: The ingress and the registrations answer many requests at once, none of them heavy.
CONTROL_MAX_ONGOING_REQUESTS = 1000


def app(args: Mapping[str, object]) -> Application:
    """The application for ``args`` (see ``mmserver.ray.settings`` for every key)."""
    cluster = ClusterSettings.from_args(args)
    registrations = serve.deployment(
        errors_returned(Registrations), name="mmserver-registrations", num_replicas=1,
        max_ongoing_requests=CONTROL_MAX_ONGOING_REQUESTS,
        ray_actor_options=ON_HEAD_NODE).bind()
    spread = ({} if cluster.max_replicas_per_node is None
              else {"max_replicas_per_node": cluster.max_replicas_per_node})
    hosts = serve.deployment(
        errors_returned(ModelHost), name="mmserver-model-host", num_replicas=cluster.num_replicas,
        max_ongoing_requests=cluster.max_ongoing_requests,
        ray_actor_options={"num_cpus": cluster.replica_cpus}, **spread,
    ).bind(cluster.server, registrations)
    return serve.deployment(
        Ingress, name="mmserver-ingress", num_replicas=1,
        max_ongoing_requests=CONTROL_MAX_ONGOING_REQUESTS,
        ray_actor_options=ON_HEAD_NODE).bind(cluster.server, hosts, registrations)
