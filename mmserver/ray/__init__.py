"""mmserver on a Ray cluster: SageMaker's multi-model routes as a Ray Serve application.

``serve run mmserver.ray:app model_roots=/models`` (or ``serve deploy
deploy/ray_serve.yaml``) serves the routes of ``mmserver serve`` from a cluster:
an ingress (the HTTP routes), the cluster's registered models, and model hosts
that each load, batch and serve models as one ``mmserver serve`` process does,
keeping the least recently used ones out when they are full. One idea a module:

* ``application``: :func:`app`, the builder wiring the three deployments;
* ``settings``: the builder's ``key=value`` arguments;
* ``ingress``: the HTTP routes (the HTTP layer's second host);
* ``service``: the cluster's models as the HTTP operations see them;
* ``registrations``: names to urls, cluster-wide;
* ``host``: a model host replica;
* ``multiplex``: Ray's multiplexer as a replica's cache of models;
* ``replicas``: which replica answered.

Needs the ``ray`` extra (``pip install 'mmserver[ray]'``); docs/design.md section 11.
``app`` is imported on first use, so that ``mmserver.ray.testing`` can set Ray's
environment before anything imports Ray.
"""

__all__ = ["app"]


def __getattr__(name: str):
    if name == "app":
        from mmserver.ray.application import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
