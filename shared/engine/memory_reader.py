"""A long-lived read handle on one memory: vectors cached in RAM, refreshed incrementally.

A recall first asks SQLite for the memory's generation (microseconds). When an index run has
committed since, only the rows added after the highest row id seen and the tombstones of the
newer generations are read, inside one read transaction, so the cache always equals one
committed state. Readers never take the writer lock and are never blocked by an index run.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import numpy as np

from shared.engine.store import MemoryStore

_COMPACT_DEAD_FRACTION = 0.25


class _Facets:
    """Small-int codes for block_type and harness, so filters are numpy masks."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}

    def code(self, value: str) -> int:
        return self.codes.setdefault(value, len(self.codes))


class MemoryReader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = MemoryStore.open(path)
        self.lock = threading.RLock()
        meta = self.store.meta()
        self.model_id = meta["model_id"]
        self.dim = int(meta["dim"])
        self._reset()

    def _reset(self) -> None:
        self.generation = -1
        self.max_row_id = 0
        self.n = 0
        self._cap = 0
        self._vecs = np.zeros((0, self.dim), np.float32)
        self._ids = np.zeros(0, np.int64)
        self._alive = np.zeros(0, bool)
        self._block = np.zeros(0, np.int32)
        self._harness = np.zeros(0, np.int32)
        self._epoch = np.zeros(0, np.float64)
        self._pos: dict[int, int] = {}
        self._dead = 0
        self.block_types = _Facets()
        self.harnesses = _Facets()

    def close(self) -> None:
        self.store.close()

    # ---- refresh -------------------------------------------------------------------------
    def refresh(self) -> bool:
        """Catch up with the last committed generation. True when anything changed."""
        with self.lock:
            conn = self.store.conn
            conn.execute("BEGIN")
            try:
                meta = self.store.meta()
                generation = int(meta["generation"])
                if generation == self.generation:
                    return False
                if self.generation < 0 or self.generation < int(meta["tombstone_floor"]):
                    self._reset()
                else:
                    for row_id in self.store.tombstones_since(self.generation):
                        pos = self._pos.pop(row_id, None)
                        if pos is not None and self._alive[pos]:
                            self._alive[pos] = False
                            self._dead += 1
                ids, vecs, facets = self.store.vectors_since(self.max_row_id)
            finally:
                conn.execute("COMMIT")
            self._append(ids, vecs, facets)
            self.generation = generation
            if self._dead > _COMPACT_DEAD_FRACTION * max(self.n, 1):
                self._compact()
            self.store.reload_fts()
            return True

    def _append(self, ids: np.ndarray, vecs: np.ndarray, facets: list[tuple]) -> None:
        need = self.n + len(ids)
        if need > self._cap:
            cap = max(need, 2 * self._cap, 1024)
            self._vecs = _grow(self._vecs, cap)
            self._ids = _grow(self._ids, cap)
            self._alive = _grow(self._alive, cap)
            self._block = _grow(self._block, cap)
            self._harness = _grow(self._harness, cap)
            self._epoch = _grow(self._epoch, cap)
            self._cap = cap
        sl = slice(self.n, need)
        self._vecs[sl] = vecs
        self._ids[sl] = ids
        self._alive[sl] = True
        self._block[sl] = [self.block_types.code(f[0]) for f in facets]
        self._harness[sl] = [self.harnesses.code(f[1]) for f in facets]
        self._epoch[sl] = [math.nan if f[2] is None else f[2] for f in facets]
        for offset, row_id in enumerate(ids.tolist()):
            self._pos[row_id] = self.n + offset
        self.n = need
        if len(ids):
            self.max_row_id = int(ids[-1])

    def _compact(self) -> None:
        keep = np.flatnonzero(self._alive[: self.n])
        for name in ("_vecs", "_ids", "_block", "_harness", "_epoch"):
            setattr(self, name, getattr(self, name)[keep].copy())
        self.n = self._cap = len(keep)
        self._alive = np.ones(self.n, bool)
        self._pos = {int(r): i for i, r in enumerate(self._ids.tolist())}
        self._dead = 0

    # ---- queries (call refresh first, under self.lock) -------------------------------------
    def filter_mask(self, block_type: str | None, harness: str | None) -> np.ndarray:
        mask = self._alive[: self.n].copy()
        if block_type:
            code = self.block_types.codes.get(block_type)
            mask &= self._block[: self.n] == (-1 if code is None else code)
        if harness:
            code = self.harnesses.codes.get(harness)
            mask &= self._harness[: self.n] == (-1 if code is None else code)
        return mask

    def passes(self, row_id: int, mask: np.ndarray) -> bool:
        pos = self._pos.get(row_id)
        return pos is not None and bool(mask[pos])

    def nearest(self, qvec: np.ndarray, limit: int, mask: np.ndarray) -> list[int]:
        return [row_id for row_id, _ in self.nearest_scored(qvec, limit, mask)]

    def nearest_scored(self, qvec: np.ndarray, limit: int, mask: np.ndarray) -> list[tuple[int, float]]:
        """The `limit` rows most similar to `qvec` with their cosine (vectors are unit length)."""
        if self.n == 0 or limit <= 0:
            return []
        sims = self._vecs[: self.n] @ qvec.astype(np.float32)
        sims[~mask] = -np.inf
        allowed = int(mask.sum())
        limit = min(limit, allowed)
        if limit == 0:
            return []
        top = np.argpartition(-sims, limit - 1)[:limit]
        top = top[np.argsort(-sims[top], kind="stable")]
        return [(int(self._ids[i]), float(sims[i])) for i in top]

    def epoch_of(self, row_id: int) -> float | None:
        v = self._epoch[self._pos[row_id]]
        return None if math.isnan(v) else float(v)

def _grow(arr: np.ndarray, cap: int) -> np.ndarray:
    out = np.zeros((cap, *arr.shape[1:]), dtype=arr.dtype)
    out[: len(arr)] = arr
    return out
