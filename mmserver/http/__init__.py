"""The HTTP layer: SageMaker's multi-model routes and KServe's v2 protocol, for every host.

``table`` lists every route (method, path, operation, token, protocol); ``sagemaker``
and ``v2`` hold the operations, each a function of a ``service.ModelService`` and a
framework-free ``service.Call``; ``requests`` reads what a request must hold,
``answers`` and ``triton`` build the answers, ``errors`` maps errors to statuses and
bodies. ``local`` is the service of this process's models and ``app`` the aiohttp host
that serves it; the Ray Serve ingress (``mmserver.ray.ingress``) is the second host,
over the cluster's service (``mmserver.ray.service``).
"""
