"""The HTTP layer: SageMaker's multi-model routes and KServe's v2 protocol over aiohttp.

``app`` builds the aiohttp application and its route table; ``routes`` holds what
every handler shares (the app's keys, body reading); ``v2`` the v2 protocol's
handlers and ``triton`` its Triton extensions (model configuration, statistics);
``requests`` the framework-free checks of a request, ``answers`` the camelCase
answers and ``errors`` the mapping of errors to statuses and the middleware. The
Ray ingress (``mmserver.ray.ingress``) answers through the same ``answers``,
``errors`` and ``requests``.
"""
