"""The cluster's registered models: names to urls, one copy for every replica and ingress.

On one machine a model is loaded or not. On a cluster a *registration* (this
module) says that a name may be served and from which folder, and each model
host loads its own copy when a request for it arrives (``host``). The
registrations live in one Serve replica of their own (``application`` pins it
to the head node), apart from the model hosts and the ingress, so a host's
death or a worker node's removal loses no registration; the head node's loss
ends the cluster anyway.

A name is taken from ``claim`` until ``release``: a second load of it answers
409 while it loads, is ready or is being unloaded, as ``mmserver serve``'s
registry does. Each registration carries a ``token``, so a host that loaded a
model can tell whether the registration it loaded for still stands (an unload
and a new load of the same name in between make another token). Plain Python,
no Ray: the application wraps the class as a deployment, and errors are
domain errors, which the ingress answers. The methods are coroutines that never
await, so on the replica's event loop each runs whole before the next (Serve
would run plain methods in threads, side by side).
"""

from __future__ import annotations

import dataclasses
import itertools

from mmserver.errors import ModelAlreadyLoaded, ModelLoading, ModelNotFound
from mmserver.paging import paginate
from mmserver.status import ModelStatus

#: A registration's states are model statuses, so describe and v2 read them as they are.
LOADING, READY, UNLOADING = ModelStatus.LOADING, ModelStatus.READY, ModelStatus.UNLOADING
#: Every state a registration takes.
STATES = (LOADING, READY, UNLOADING)


@dataclasses.dataclass(frozen=True)
class Registration:
    """One registered model (``name`` and ``url`` are what ``POST /models`` was given)."""

    name: str
    url: str
    #: Tells this registration from an earlier or later one of the same name.
    token: int
    #: :data:`LOADING` (its first load runs on a replica), :data:`READY`, :data:`UNLOADING`.
    state: ModelStatus = LOADING


class Registrations:
    """Every registration of one application (see the module docstring)."""

    def __init__(self) -> None:
        self._by_name: dict[str, Registration] = {}
        self._tokens = itertools.count(1)

    async def claim(self, name: str, url: str) -> Registration:
        """Take ``name`` for ``url``; its first load is the caller's to run."""
        taken = self._by_name.get(name)
        if taken is not None:
            raise ModelAlreadyLoaded(f"model {name!r} is already {_described(taken)}")
        registration = self._by_name[name] = Registration(name, url, next(self._tokens))
        return registration

    async def confirm(self, name: str, token: int) -> Registration:
        """The first load succeeded: the model may be invoked."""
        registration = self._current(name, token)
        ready = self._by_name[name] = dataclasses.replace(registration, state=READY)
        return ready

    async def begin_unload(self, name: str) -> Registration:
        """No new invocation may load ``name`` from now; the caller unloads every copy."""
        registration = self._get(name)
        if registration.state == LOADING:
            raise ModelLoading(f"model {name!r} is still loading; unload it once it is ready")
        if registration.state == UNLOADING:
            raise ModelNotFound(f"model {name!r} is being unloaded")
        unloading = self._by_name[name] = dataclasses.replace(registration, state=UNLOADING)
        return unloading

    async def release(self, name: str, token: int) -> None:
        """Free ``name`` (its first load failed, or its unload finished) if ``token`` holds it."""
        registration = self._by_name.get(name)
        if registration is not None and registration.token == token:
            del self._by_name[name]

    async def get(self, name: str) -> Registration:
        """The registration in any state; :class:`ModelNotFound` when there is none."""
        return self._get(name)

    async def current(self, name: str) -> Registration | None:
        """What a host may load for ``name`` now: a loading or ready registration, else None."""
        registration = self._by_name.get(name)
        return None if registration is None or registration.state == UNLOADING else registration

    async def serving(self, name: str) -> Registration | None:
        """What an invocation may load: a ready registration, else None (404, as a model
        still loading answers on one machine)."""
        registration = self._by_name.get(name)
        return registration if registration is not None and registration.state == READY else None

    async def every(self) -> list[Registration]:
        """Every registration, in any state (v2's repository index)."""
        return list(self._by_name.values())

    async def page(self, limit: int | None = None,
             next_page_token: str | None = None) -> tuple[list[Registration], str | None]:
        """Ready registrations by name after the cursor, as ``mmserver serve`` lists models."""
        return paginate([r for r in self._by_name.values() if r.state == READY], limit,
                        next_page_token)

    def _get(self, name: str) -> Registration:
        registration = self._by_name.get(name)
        if registration is None:
            raise ModelNotFound(f"model {name!r} is not loaded")
        return registration

    def _current(self, name: str, token: int) -> Registration:
        registration = self._by_name.get(name)
        if registration is None or registration.token != token:
            raise ModelNotFound(f"model {name!r} was unloaded while it loaded")
        return registration


#: How a 409 names a taken registration's state.
_DESCRIBED = {LOADING: "loading", READY: "loaded", UNLOADING: "being unloaded"}


def _described(registration: Registration) -> str:
    return _DESCRIBED[registration.state]
