"""After a heavy index run: give the memory it used back to the system.

An indexer crept to ~1 GB over a day of huge pastes and kept it (docs/benchmarks.md, round 33):
- onnxruntime's CPU arena keeps the largest run's buffers for the session's life (~250 MB
  after a paste of 512-token chunks): each loaded embedder's `release_arena` frees what no
  run holds now;
- glibc keeps what the process frees in its arenas for later allocations and returns only the
  free top of each heap: `malloc_trim(0)` hands every arena's free pages back (MADV_DONTNEED).
Both take milliseconds and locks the runs also take, so they follow a heavy run, not every run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

from shared.engine.embedder import loaded_embedders


@cache
def _malloc_trim():
    """glibc's malloc_trim, or None with another C library (musl, macOS): nothing to call then."""
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        return None


def return_free_memory() -> None:
    """Free the embedders' unused arena regions, then return the allocator's free pages."""
    for embedder in loaded_embedders():
        embedder.release_arena()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
