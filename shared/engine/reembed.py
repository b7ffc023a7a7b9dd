"""Moving a memory to another embedding model without mixing vectors or going dark.

A memory is stamped with the model that embedded it (store.py). When the configured model
differs, `reembed_memory` builds a complete second memory with the new model beside the live
one and exchanges the two directories in one step:
1. build: `$home/.reembed/` is a FUNES_HOME of its own (own lock, own `memory/`), indexed from
   the tenant's `src/` with the new model. The live memory is not locked: readers keep
   answering from it (with the model it was built with, see `embedder_for_stamp`);
2. switch, under the live memory's lock: an incremental run brings the new memory up to what
   `src/` holds now (purging anything deleted meanwhile), then `renameat2(RENAME_EXCHANGE)`
   swaps `memory/` and `.reembed/memory/` atomically, and the old memory is deleted.
A reader sees the old memory or the new one, never a mix: the engine reopens a memory whose
database file changed under its path. A crash in step 1 leaves the live memory untouched (the
next attempt starts over); a crash in step 2 before the exchange does too, after it the new
memory is live and the leftover `.reembed/` is removed by the next attempt.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shared.engine.embedder import Embedder
from shared.engine.index_run import index_tree, memory_dir
from shared.engine.memory_lock import memory_lock
from shared.engine.store import MemoryStore

STAGING = ".reembed"
PROGRESS_BATCH = 256

Progress = Callable[[int, int], None]  # (chunks embedded, chunks to embed)


def stamp_of(home: Path) -> tuple[str, int] | None:
    """(model id, dim) the memory under `home` was built with; None when there is none."""
    path = memory_dir(home)
    if not MemoryStore.exists(path):
        return None
    store = MemoryStore.open(path)
    try:
        meta = store.meta()
    finally:
        store.close()
    return meta["model_id"], int(meta["dim"])


def needs_reembed(home: Path, embedder: Embedder) -> bool:
    stamp = stamp_of(home)
    return stamp is not None and stamp != (embedder.spec.model_id, embedder.dim)


class _ReportingEmbedder:
    """The new model, embedding in slices so an index run over it reports its progress."""

    def __init__(self, embedder: Embedder, progress: Progress) -> None:
        self.spec, self.dim = embedder.spec, embedder.dim
        self._embedder, self._progress = embedder, progress

    def embed_query(self, text: str) -> np.ndarray:
        return self._embedder.embed_query(text)

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        out = []
        self._progress(0, len(texts))
        for start in range(0, len(texts), PROGRESS_BATCH):
            out.append(self._embedder.embed(texts[start : start + PROGRESS_BATCH], batch_size))
            self._progress(min(start + PROGRESS_BATCH, len(texts)), len(texts))
        return np.concatenate(out) if out else self._embedder.embed([])


def reembed_memory(home: Path, src: Path, embedder: Embedder, progress: Progress | None = None,
                   lock_wait_s: float = 5.0) -> int:
    """Rebuild `$home/memory` with `embedder` beside the live one and switch atomically.
    Returns the number of chunks of the new memory. MemoryBusy if the live lock stays held."""
    staging = home / STAGING
    shutil.rmtree(staging, ignore_errors=True)  # an earlier attempt's leftovers, never trusted
    index_tree(staging, src, _ReportingEmbedder(embedder, progress) if progress else embedder)
    with memory_lock(home, lock_wait_s):
        index_tree(staging, src, embedder, purge=True)
        if MemoryStore.exists(memory_dir(home)):
            exchange(memory_dir(staging), memory_dir(home))
        else:  # forgotten meanwhile: nothing to replace
            os.rename(memory_dir(staging), memory_dir(home))
    store = MemoryStore.open(memory_dir(home))
    try:
        chunks, _ = store.counts()
    finally:
        store.close()
    shutil.rmtree(staging, ignore_errors=True)
    return chunks


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> None:
    """Swap two directories in one step (Linux renameat2). Elsewhere, two renames: a reader
    that opens the memory in the microseconds between them finds none and answers "no results"."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
            return
        errno = ctypes.get_errno()
        if errno not in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: filesystem or kernel without it
            raise OSError(errno, os.strerror(errno), str(b))
    parked = b.with_name(f".{b.name}.swap")
    os.rename(b, parked)
    os.rename(a, b)
    os.rename(parked, a)
