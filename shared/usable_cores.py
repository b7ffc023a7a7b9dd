"""How many cores this process may keep busy: its CPU affinity, capped by a cgroup CPU quota.

`os.cpu_count()` counts the machine's cores, which in a container is the node's: a pod limited
to 2 cores on a 32-core node would size itself for 32.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cores(cgroup_root: Path = CGROUP_ROOT) -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_quota(cgroup_root)
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def _cgroup_quota(root: Path) -> float | None:
    """Cores' worth of CPU time the cgroup allows (cgroup v2 `cpu.max`, else v1's CFS quota),
    None when unlimited or unreadable."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None
