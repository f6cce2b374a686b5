"""Ray Serve's model multiplexer as one replica's cache of models, least recently used first.

``@serve.multiplexed(max_num_models_per_replica=N)`` keeps a replica's models in
an ordered dict, least recently used first; past ``N`` it evicts the first one
before loading another, and it reports the names it holds (and is loading) to
Serve's controller every 0.1 s, so that routers send a model's requests to the
replicas holding it (docs/design.md section 11). On eviction it awaits the
model's ``__del__`` when that is a coroutine function; so does the replica's
graceful shutdown, for every model left.

mmserver needs three things beyond that public API: evict the least recently
used model when the *memory budget* is full, not the count (a load that answers
507 evicts and tries again); evict one named model (``DELETE`` on every
replica); and ask whether a model is held without loading it (a request's
miss, and a 404 that must not evict anything). :class:`ModelCache` is the one
place that reaches into the multiplexer for them, through four names of Ray
2.60's ``_ModelMultiplexWrapper`` (:data:`RAY_INTERNALS`); ``ray[serve]`` is
pinned to 2.60.0 and ``tests/test_ray_cluster.py`` checks that they exist.

The cap ``N`` is a setting, so the multiplexed function is built per replica in
``__init__`` around a plain function (Ray keeps its cache as an attribute of the
function it wraps), which Ray 2.60 detects as multiplexing at run time.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from ray import serve

from mmserver.loaded_model import LoadedModel

log = logging.getLogger(__name__)

#: Where Ray keeps a multiplexed function's cache (an attribute of the wrapped function).
WRAPPER_ATTRIBUTE = "__serve_multiplex_wrapper"
#: What :class:`ModelCache` uses of Ray's ``_ModelMultiplexWrapper`` besides its public call.
RAY_INTERNALS = ("models", "unload_model_lru", "_model_cache_lock",
                 "_push_multiplexed_replica_info")


class HeldModel:
    """A :class:`LoadedModel` as the multiplexer holds it.

    Ray evicts a model by awaiting its ``__del__``. Here that is an *instance*
    attribute bound to ``release``: Ray finds and awaits it, while the garbage
    collector, which looks ``__del__`` up on the class, never calls a coroutine
    function that nobody awaits.
    """

    def __init__(self, model: LoadedModel, release: Callable[[str], Awaitable[None]]):
        self.model = model
        self._release = release
        self.__del__ = self._evicted

    async def _evicted(self) -> None:
        await self._release(self.model.name)


class ModelCache:
    """One replica's models: ``await cache.get(name)`` holds or loads ``name`` (see above)."""

    def __init__(self, load: Callable[[str], Awaitable[HeldModel]], max_models: int | None):
        async def load_model(model_id: str) -> HeldModel:
            return await load(model_id)

        self._function = load_model
        #: Ray's multiplexed call: the held model, or ``load(name)`` after evicting past the cap.
        self.get: Callable[[str], Awaitable[HeldModel]] = serve.multiplexed(
            max_num_models_per_replica=max_models if max_models is not None else -1)(load_model)

    def _wrapper(self):
        """Ray's cache, created at the first :meth:`get` (None before)."""
        return getattr(self._function, WRAPPER_ATTRIBUTE, None)

    def holds(self, name: str) -> bool:
        wrapper = self._wrapper()
        return wrapper is not None and name in wrapper.models

    def held(self, name: str) -> HeldModel | None:
        """The held model without touching its recency."""
        wrapper = self._wrapper()
        return None if wrapper is None else wrapper.models.get(name)

    async def evict_least_recent(self) -> bool:
        """Evict the least recently used model; False when none is held.

        For a load in progress: Ray holds its cache lock while it runs ``load``.
        """
        wrapper = self._wrapper()
        if wrapper is None or not wrapper.models:
            return False
        log.info("evicting model=%s (least recently used) to make room",
                 next(iter(wrapper.models)))
        await _unload_front(wrapper)
        return True

    async def evict(self, name: str) -> bool:
        """Evict ``name`` if held, after any load in progress; True when it was held."""
        wrapper = self._wrapper()
        if wrapper is None:
            return False
        async with wrapper._model_cache_lock:
            if name not in wrapper.models:
                return False
            wrapper.models.move_to_end(name, last=False)
            await _unload_front(wrapper)
            return True

    async def close(self) -> None:
        """Evict every model (a replica's graceful shutdown)."""
        wrapper = self._wrapper()
        if wrapper is not None:
            await wrapper.shutdown()


async def _unload_front(wrapper) -> None:
    """Unload the model at the front of Ray's cache (its least recently used) and tell the
    routers at once, not at the next 0.1 s report."""
    await wrapper.unload_model_lru()
    wrapper._push_multiplexed_replica_info = True
