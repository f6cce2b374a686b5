"""Where a model is in its life: the one spelling of a status in every process and host.

A leaf (it imports nothing of the package), so the Ray registrations, the engine's
handshake, the HTTP answers and v2's repository states all name statuses from here
without loading torch or a model.
"""

from __future__ import annotations

import enum


class ModelStatus(enum.StrEnum):
    """A string, so answers and logs show its value as it is."""

    LOADING = "loading"
    READY = "ready"
    #: A call into the model is stuck past its time limit; new requests get 503.
    UNHEALTHY = "unhealthy"
    UNLOADING = "unloading"
    #: In the registry's index only: a folder of the model roots no model is loaded from.
    NOT_LOADED = "not loaded"
    #: Its engine died and the new one could not load it again (``--http-workers``); also
    #: what an engine answers its supervisor when it could not start.
    FAILED = "failed"


NOT_LOADED = ModelStatus.NOT_LOADED
