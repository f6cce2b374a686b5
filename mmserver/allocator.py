"""Keep a model call's activation buffers in the heap between calls (glibc only).

On the CPU, torch allocates each call's activations with ``malloc``. glibc
serves a request over its *mmap threshold* with a fresh ``mmap`` and hands it
back with ``munmap`` on free, so every call pays page faults to zero those
pages again. The threshold starts at 128 KiB and moves up when such a chunk is
freed, so whether a given batch size pays depends on the order of earlier
calls. The small CNN of ``bench/peers.py`` on one core: a batch of 16 ran at
2,350-2,650 rows/s in most fresh processes and at 3,560-3,660 in others. With
the thresholds below it ran at 3,740-3,810 rows/s whatever came first.

:func:`keep_freed_memory_in_heap` fixes the mmap threshold at 32 MiB (glibc's
maximum on 64-bit) and the trim threshold at 256 MiB, so buffers up to 32 MiB
are reused from the heap, and up to 256 MiB of free heap is kept instead of
being returned to the system after every call. This is what the
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` variables do, and
what PyTorch's CPU tuning guide gets by preloading jemalloc or tcmalloc.
The price is resident memory that stays at its high-water mark.

It is skipped when the user already chose: any ``MALLOC_*`` variable set, or
an allocator in ``LD_PRELOAD``. ``mmserver serve`` does not call it with
``MMSERVER_TUNE_MALLOC=0`` (``Settings.tune_malloc``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Mapping

log = logging.getLogger(__name__)

#: glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 256 * 2**20


def keep_freed_memory_in_heap(env: Mapping[str, str] = os.environ) -> bool:
    """Set glibc's thresholds (see the module docstring); True when they were set."""
    if not sys.platform.startswith("linux"):
        return False
    if any(key.startswith("MALLOC_") for key in env) or env.get("LD_PRELOAD"):
        return False
    try:  # the C library the process already runs on; no library search at start-up
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and \
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not done:
        log.warning("could not set glibc's malloc thresholds; model calls may pay page faults")
    return done
