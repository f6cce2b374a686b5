"""Keep the garbage collector's full passes off the request path.

CPython frees most objects by reference counting; its cyclic collector runs besides, by
generations, and now and then a *full* pass walks every object the interpreter tracks,
holding the interpreter lock throughout. A serving process tracks a great many long-lived
objects (torch, aiohttp, the models and their code), so a full pass is long: on the 2-core
development machine one took 130-150 ms, about once every 6 s of the simulated V100's
64-user load (``bench/device_busy.py``). The model's worker thread cannot return from a
call, nor start the next, while the lock is held; the device idled, and that call's
requests waited, for the length of the pass: it cost the device 2-3 % of the window and
set the p99.

``gc.freeze()`` moves every object alive at that moment into a permanent generation that
the collector never walks. Long-lived objects are what a process has once it has loaded
its models, so :func:`settle` is called then: after start-up and after every load.
Frozen objects are still freed by reference counting; only cycles among them would
outlive their last reference, so :func:`release`, called when a model is unloaded,
unfreezes, collects everything once, and freezes what is left. Each call costs one full
pass itself, once, at a moment that already waits for a load or an unload.
"""

from __future__ import annotations

import gc

__all__ = ["release", "settle"]


def settle() -> None:
    """Collect what is garbage now, then freeze everything alive: it is the process's
    long-lived state (after start-up, or after a model was loaded)."""
    gc.collect()
    gc.freeze()


def release() -> None:
    """After long-lived objects were let go (a model unloaded): collect the frozen ones
    too, cycles included, and freeze what is still alive."""
    gc.unfreeze()
    settle()
