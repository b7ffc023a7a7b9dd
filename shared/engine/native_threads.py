"""Thread pools of the native libraries the engine loads, set explicitly and never spinning.

Two libraries bring their own worker threads, and each busy-waits between calls by default,
which on a small shared machine steals the core the next stage (or the next request) needs:
- OpenBLAS (numpy's matmul in the dense scan): one thread; the scan is memory-bound and a
  second thread spinning between calls cost 3x the CPU per recall (issue 15's profile).
- onnxruntime: explicit intra/inter-op counts and `session.intra_op.allow_spinning=0`, set on
  each session (see `ort_session_options`).

Pools and lanes are sized by `usable_cores`: the CPU affinity capped by a cgroup CPU quota.
`os.cpu_count()` counts the machine's cores, which in a container is the node's: a pod limited
to 2 cores on a 32-core node would size itself for 32.
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

_blas_pinned = threading.Event()


def pin_blas_threads() -> None:
    """OpenBLAS (or any BLAS numpy loaded) runs in the calling thread only."""
    if _blas_pinned.is_set():
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    _blas_pinned.set()


def ort_session_options(threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return opts


CGROUP_ROOT = Path("/sys/fs/cgroup")


def usable_cores(cgroup_root: Path = CGROUP_ROOT) -> int:
    """Cores this process may keep busy (module docstring), at least 1."""
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
