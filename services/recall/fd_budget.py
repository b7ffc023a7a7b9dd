"""Open files the embedded engine's reader cache may use.

Each open tenant memory holds file descriptors (SQLite's database, WAL and shared-memory files,
the mapped vector snapshot: 4, measured with bench/chaos_read.py and tests). With the default
cache of 256 readers that is about 1,000 descriptors, the usual soft limit of a process started
outside a container (1024). Past the limit, opening the next tenant's memory fails, so a tenant
with a memory is told "memory is unavailable", and the HTTP server cannot accept connections.
So the service raises its soft limit to the hard one at start, and keeps the cache within what
that limit leaves after sockets, model files and the artifact search's own readers.
"""

from __future__ import annotations

import resource

FDS_PER_READER = 4
# Sockets of concurrent clients, Redis, logs, model and library files, the artifacts database.
RESERVED_FDS = 128


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # not allowed here: plan with the soft limit we have
    return soft


def readers_within(open_file_limit: int, wanted: int, other_readers: int) -> int:
    """How many tenant readers fit beside `other_readers` (the artifact search's) and the reserve."""
    fit = (open_file_limit - RESERVED_FDS) // FDS_PER_READER - other_readers
    return max(1, min(wanted, fit))
