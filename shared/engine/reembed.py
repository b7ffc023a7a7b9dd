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
database file changed under its path. An abort (a lost or yielded lock) or a crash before the
exchange leaves the live memory untouched. The build commits in slices (index_run.py), so the
next attempt goes on from what `.reembed/` holds when it was built with the same model (else it
starts over): a tenant whose forgets keep interrupting a long re-embed still gets there.
A forget meanwhile reaches both memories without waiting for the re-embed
(`remove_deleted_sources`); `.reembed/` is removed after the switch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from shared.engine.api import chunk_count
from shared.engine.embedder import Embedder, embedder_for_stamp
from shared.engine.index_run import Checkpoint, index_tree, memory_dir
from shared.engine.memory_lock import memory_lock
from shared.engine.store import MemoryDamaged, MemoryStore

STAGING = ".reembed"

Progress = Callable[[int, int], None]  # (chunks embedded so far, chunks of the live memory)


def stamp_of(home: Path) -> tuple[str, int] | None:
    """(model id, dim) the memory under `home` was built with; None when there is none, or only a
    damaged one (its next index run rebuilds it with the configured model)."""
    path = memory_dir(home)
    if not MemoryStore.exists(path):
        return None
    try:
        store = MemoryStore.open(path)
    except MemoryDamaged:
        return None
    try:
        meta = store.meta()
    finally:
        store.close()
    return meta["model_id"], int(meta["dim"])


def model_stamp(embedder: Embedder) -> tuple[str, int]:
    """What `stamp_of` reads back from a memory this embedder built."""
    return embedder.spec.model_id, embedder.dim


def needs_reembed(home: Path, embedder: Embedder) -> bool:
    stamp = stamp_of(home)
    return stamp is not None and stamp != model_stamp(embedder)


class _ReportingEmbedder:
    """The new model, counting what the build has embedded (the index run embeds in batches)."""

    def __init__(self, embedder: Embedder, progress: Progress, total: int, done: int) -> None:
        self.spec, self.dim = embedder.spec, embedder.dim
        self._embedder, self._progress, self._total = embedder, progress, total
        self._done = done  # what an earlier attempt committed

    def embed_query(self, text: str) -> np.ndarray:
        return self._embedder.embed_query(text)

    def text_log_prob(self, text: str) -> float | None:
        return self._embedder.text_log_prob(text)

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        self._progress(self._done, self._total)
        out = self._embedder.embed(texts, batch_size)
        self._done += len(texts)
        self._progress(self._done, self._total)
        return out


def _keep_staging_of(home: Path, embedder: Embedder) -> Path:
    """The staging home, holding an earlier attempt's committed slices only when they were
    embedded by `embedder` (a staging memory that cannot be read is never trusted, nor files
    without a database: what a kill -9 mid-removal left, the snapshot's stems among them)."""
    staging = home / STAGING
    try:
        reusable = stamp_of(staging) == model_stamp(embedder)
    except Exception:
        reusable = False
    if not reusable:
        shutil.rmtree(staging, ignore_errors=True)
    return staging


def reembed_memory(home: Path, src: Path, embedder: Embedder, progress: Progress | None = None,
                   lock_wait_s: float = 5.0, checkpoint: Checkpoint | None = None) -> int:
    """Rebuild `$home/memory` with `embedder` beside the live one and switch atomically.
    Returns the number of chunks of the new memory. MemoryBusy if the live lock stays held;
    an exception from `checkpoint` (called as in `index_tree`, and once more right before the
    switch) aborts with the live memory untouched and the build's committed slices kept."""
    staging = _keep_staging_of(home, embedder)
    kwargs = {"checkpoint": checkpoint} if checkpoint else {}
    building = (_ReportingEmbedder(embedder, progress, chunk_count(memory_dir(home)),
                                   chunk_count(memory_dir(staging)))
                if progress else embedder)
    index_tree(staging, src, building, **kwargs)
    with memory_lock(home, lock_wait_s):
        if not src.is_dir() or not MemoryStore.exists(memory_dir(home)):
            shutil.rmtree(staging, ignore_errors=True)  # forgotten meanwhile: nothing may stay behind
            return 0
        index_tree(staging, src, embedder, purge=True, **kwargs)
        if checkpoint:
            checkpoint("before_commit")
        exchange(memory_dir(staging), memory_dir(home))
    shutil.rmtree(staging, ignore_errors=True)  # the old memory
    return chunk_count(memory_dir(home))


# A forget holds the user's index lock, so the memory's writer lock is held only by a run that gave
# that lock up (it lets go at its next checkpoint, one embedding batch, longer on a loaded host)
# or by an operator's command. After 5 s it failed with MemoryBusy and was redelivered, counting
# a delivery; the wait ends early when the forget's own run is stopped (its checkpoint).
REMOVAL_LOCK_WAIT_S = 60.0


def remove_deleted_sources(home: Path, src: Path, embedder: Embedder, checkpoint: Checkpoint | None = None) -> None:
    """After sources were deleted (a forget): scrub every row whose text `src` no longer holds
    from the live memory and from a re-embed's staging memory, embedding nothing. A forget waits
    neither for a re-embed nor for a backlog of new conversations (a large first import): the
    next index run does that work. The live memory is opened with the model it was built with; one
    of a model that cannot run here is re-embedded first (nothing else can write to it)."""
    kwargs = {"checkpoint": checkpoint} if checkpoint else {}
    stamp = stamp_of(home)
    if stamp is not None or MemoryStore.exists(memory_dir(home)):  # a damaged one is rebuilt without the removed
        own_model = embedder if stamp in (None, model_stamp(embedder)) else embedder_for_stamp(stamp[0])
        if own_model is None:
            reembed_memory(home, src, embedder, **kwargs)
            own_model = embedder
        index_tree(home, src, own_model, lock_wait_s=REMOVAL_LOCK_WAIT_S, purge=True, only_removals=True, **kwargs)
    staging = _keep_staging_of(home, embedder)
    if MemoryStore.exists(memory_dir(staging)):
        index_tree(staging, src, embedder, lock_wait_s=REMOVAL_LOCK_WAIT_S, purge=True, only_removals=True, **kwargs)


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
