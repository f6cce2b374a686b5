"""What this process may use: memory and CPUs, container limits included.

Inside ``docker run --memory 4g --cpus 2`` the host's free memory and core
count are the wrong numbers: admitting models past the container's memory
limit ends in the kernel's OOM killer instead of a 507, and one torch thread
per host core oversubscribes the CPU quota. So both readings here take the
cgroup (v2, then v1) limits into account.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _host_available_memory_bytes() -> int:
    meminfo = _read(Path("/proc/meminfo"))
    if meminfo:
        for line in meminfo.splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _cgroup_memory_headroom_bytes() -> int | None:
    """Limit minus usage of this process's memory cgroup, or None when unlimited."""
    for limit_file, usage_file in (("memory.max", "memory.current"),
                                   ("memory/memory.limit_in_bytes",
                                    "memory/memory.usage_in_bytes")):
        limit, usage = _read(CGROUP / limit_file), _read(CGROUP / usage_file)
        if limit is None or usage is None:
            continue
        if limit == "max" or int(limit) >= 2**60:  # v1 writes "unlimited" as a huge number
            return None
        return max(0, int(limit) - int(usage))
    return None


def process_resident_bytes() -> int:
    """This process's resident set size, from /proc (0 where there is none)."""
    statm = _read(Path("/proc/self/statm"))
    return int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE") if statm else 0


def memory_in_use_bytes(device) -> int:
    """What a model on ``device`` takes memory from: device memory on CUDA, else the process's."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.memory_allocated(device)
    return process_resident_bytes()


def available_memory_bytes() -> int:
    """Memory this process can still take: the host's, capped by its container's limit."""
    host = _host_available_memory_bytes()
    headroom = _cgroup_memory_headroom_bytes()
    return host if headroom is None else min(host, headroom)


def _cgroup_cpu_quota() -> float | None:
    """CPUs' worth of time per period the cgroup allows (v2, then v1), or None when unlimited."""
    v2 = _read(CGROUP / "cpu.max")
    if v2:
        limit, period = v2.split()
    else:
        limit = _read(CGROUP / "cpu/cpu.cfs_quota_us")
        period = _read(CGROUP / "cpu/cpu.cfs_period_us")
    if not limit or not period or limit == "max" or int(limit) <= 0:  # v1 writes -1
        return None
    return int(limit) / int(period)


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity, capped by a cgroup CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)
