"""A long-lived read handle on one memory: the int8 snapshot mapped, later rows in RAM.

A reader maps `vectors.i8` (the snapshot an index run published; see vector_file.py) and
reads from SQLite only what was committed after it: rows above the snapshot's highest row id
and the tombstones of the newer generations, inside one read transaction, so the view always
equals one committed state. Each call first asks SQLite whether any other connection
committed since (`PRAGMA data_version`, one statement without a transaction); only then does
it read the generation. A newer snapshot file is picked up on the next call.

The state is an immutable `ReaderView` swapped in one assignment, so any number of searches
run on it at once without a lock; only catching up is serialised. Readers never take the
writer lock and are never blocked by an index run.

Dense search: the int8 scan picks the best `max(64, 4 * limit)` snapshot rows, which are
re-scored exactly from their float32 vectors in SQLite; rows after the snapshot are scored
exactly in float32. The top `limit` equals an exact float32 search unless a true top row falls
outside the rescored pool (int8 error is ~1e-3 of a cosine; tested). Ties go to the lower row
id at every step, as in an exact search. A snapshot large enough to hold a 4-bit copy
(vector_file.py) is scanned in 4 bits first, and only its best rows (16 per pool row, at
least 2,048) get their int8 scores. That is a bet on the data, not a bound: on real e5 vectors
every final top 30 was the int8 scan's (docs/benchmarks.md, round 21), but a row whose few
large values take its blocks' whole 4-bit range can rank far lower there than it should.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import compress, islice
from pathlib import Path

import numpy as np

from shared.engine.store import FTS_DIR, MemoryStore, Row, journal_mode
from shared.engine.text_analysis import ANALYZER, held_stems
from shared.engine.vector_file import (VectorFile, approximate_scores, approximate_scores_at, conversation_code,
                                       current_identity, open_vector_file, prefilter_depth, prefilter_scores)

_log = logging.getLogger("recall.engine.reader")
RESCORE_MIN = 64
RESCORE_FACTOR = 4
BM25_SLACK = 10  # hits read beyond the limit before reading the full depth (MemoryReader.bm25)
# The reader's SQLite file is read through a memory map (WAL mode only: a map on a network
# volume, where RECALL_SQLITE_JOURNAL_MODE=delete is used, turns an I/O error into a signal):
# the re-score, hydration and neighbour statements then copy no page through read(2). This
# is address space, not memory: the pages are the page cache.
SQLITE_MMAP_BYTES = 1 << 34
SAMPLE_STRIDE = 16  # largest_positions: every 16th score estimates the threshold of the best few


def largest_positions(values: np.ndarray, k: int) -> np.ndarray:
    """Positions of the `k` largest `values` (1 <= k <= len(values)), ascending; of the values
    equal to the k-th, the lowest positions (rows are in id order, so an exact search's ties).
    ~10x cheaper than a full partition over a snapshot's 60k scores: every 16th value gives a
    threshold that about 2k + 128 values reach, and the partition runs over those only. The set
    is exact whatever the sample: if fewer than `k` values reach the threshold, it looks at all."""
    sample = values[::SAMPLE_STRIDE]
    wanted = 2 * (k // SAMPLE_STRIDE) + 8  # twice the sample's expected share of the k, plus slack
    reach = None
    if wanted < len(sample):
        threshold = np.partition(sample, len(sample) - wanted)[len(sample) - wanted]
        reach = np.flatnonzero(values >= threshold)
        if len(reach) < k:
            reach = None
    reached = values if reach is None else values[reach]
    kth = np.partition(reached, len(reached) - k)[len(reached) - k]
    chosen = np.flatnonzero(reached >= kth)  # ascending
    if len(chosen) > k:  # values equal to the k-th beyond the k: the last of them go
        tied = np.flatnonzero(reached[chosen] == kth)
        chosen = np.delete(chosen, tied[len(tied) - (len(chosen) - k):])
    return chosen if reach is None else reach[chosen]


def _pool_positions(vf: VectorFile, q: np.ndarray, pool: int, allowed_bits: np.ndarray | None, allowed: int) -> np.ndarray:
    """Snapshot positions of the `pool` allowed rows with the best int8 scores: from every row's
    score, or, where the snapshot's 4-bit copy is packed and the pool is small beside the allowed
    rows, from the scores of the 4-bit scan's best `prefilter_depth` rows (vector_file.py)."""
    depth = prefilter_depth(pool, allowed)
    coarse = None if depth is None else prefilter_scores(vf, q)
    if coarse is None:
        approx = approximate_scores(vf, q)
        if allowed_bits is not None:
            approx[~allowed_bits] = -np.inf
        return largest_positions(approx, pool)
    if allowed_bits is not None:
        coarse[~allowed_bits] = -np.inf
    candidates = largest_positions(coarse, depth)  # ascending, none disallowed (depth < allowed)
    return candidates[largest_positions(approximate_scores_at(vf, q, candidates), pool)]


@dataclass(frozen=True)
class ReaderView:
    """One committed generation of a memory. Rows: the snapshot's, then later ones (ids ascend)."""

    generation: int
    max_row_id: int
    base: VectorFile | None
    ids: np.ndarray
    alive: np.ndarray
    block: np.ndarray
    harness: np.ndarray
    epoch: np.ndarray
    delta_vecs: np.ndarray  # float32 rows after the snapshot
    delta_sessions: tuple[str, ...] = ()  # the session of each row after the snapshot
    block_types: dict[str, int] = field(default_factory=dict)
    harnesses: dict[str, int] = field(default_factory=dict)
    # Each row's conversation as a code (`conversation_codes`), made on first use: only a recall
    # with conversation evidence needs it, so opening a memory does not pay for it.
    _codes: list = field(default_factory=list, compare=False, repr=False)

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def n_base(self) -> int:
        return 0 if self.base is None else self.base.n

    def position(self, row_id: int) -> int | None:
        i = int(np.searchsorted(self.ids, row_id))
        return i if i < len(self.ids) and int(self.ids[i]) == row_id else None

    def ram_bytes(self) -> int:
        """Bytes this view owns (views on the mapped snapshot own none)."""
        arrays = (self.ids, self.alive, self.block, self.harness, self.epoch, self.delta_vecs, *self._codes)
        return sum(a.nbytes for a in arrays if a.flags.owndata)


@dataclass(frozen=True)
class Mask:
    """Which rows of `view` a search may return (alive and matching the filters)."""

    view: ReaderView
    bits: np.ndarray
    filtered: bool = False  # a block type or harness was asked for (else only dead rows fail)


def _empty_view(dim: int) -> ReaderView:
    return ReaderView(generation=-1, max_row_id=0, base=None, ids=np.zeros(0, np.int64), alive=np.zeros(0, bool),
                      block=np.zeros(0, np.int32), harness=np.zeros(0, np.int32), epoch=np.zeros(0, np.float64),
                      delta_vecs=np.zeros((0, dim), np.float32))


def _base_view(vf: VectorFile, dim: int) -> ReaderView:
    return ReaderView(generation=vf.generation, max_row_id=vf.max_row_id, base=vf, ids=vf.ids,
                      alive=np.ones(vf.n, bool), block=vf.block, harness=vf.harness, epoch=vf.epoch,
                      delta_vecs=np.zeros((0, dim), np.float32),
                      block_types={name: i for i, name in enumerate(vf.block_types)},
                      harnesses={name: i for i, name in enumerate(vf.harnesses)})


def _locate(sorted_ids: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of `wanted` would sit in the ascending `sorted_ids` (clamped to a valid index),
    and whether it is there."""
    if not len(sorted_ids):
        return np.zeros(len(wanted), np.intp), np.zeros(len(wanted), bool)
    pos = np.minimum(np.searchsorted(sorted_ids, wanted), len(sorted_ids) - 1)
    return pos, sorted_ids[pos] == wanted


def _snapshot_conversations(vf: VectorFile, store: MemoryStore) -> np.ndarray:
    """The conversation code of each snapshot row (0: deleted since), for a file written before
    it held them: read from SQLite's (session_id, seq) index (~75 ms of CPU for 60,000 rows)."""
    row_ids, session_ids = store.sessions_upto(vf.max_row_id)
    codes = np.fromiter(map(conversation_code, session_ids), np.int64, len(session_ids))
    out = np.zeros(vf.n, np.int64)
    pos, found = _locate(vf.ids, row_ids)
    out[pos[found]] = codes[found]
    return out


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


class MemoryReader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = MemoryStore.open(path)
        if journal_mode() == "wal":
            with self.store.lock:
                self.store.conn.execute(f"PRAGMA mmap_size={SQLITE_MMAP_BYTES}")
        meta = self.store.meta()
        self.model_id = meta["model_id"]
        self.dim = int(meta["dim"])
        self.fts_analyzer = meta.get("fts_analyzer", "")  # as of the last refresh
        self._refresh_lock = threading.Lock()
        self._seen = None  # (data_version, total_changes) when the view was last known current
        self._unusable: tuple[int, int] | None = None  # (inode, size) of a snapshot file found unreadable
        self._view = _empty_view(self.dim)
        self._fts_bytes = _dir_bytes(path / FTS_DIR)

    def close(self) -> None:
        self.store.close()

    @property
    def view(self) -> ReaderView:
        return self._view

    @property
    def n(self) -> int:
        return self._view.n

    def resident_bytes(self) -> int:
        """What this reader keeps in memory: owned arrays, the mapped snapshot (and its stems'
        vocabulary once read), the BM25 index."""
        view = self._view
        mapped = 0 if view.base is None else view.base.held_bytes + view.base.vocabulary_ram_bytes()
        return view.ram_bytes() + mapped + self._fts_bytes

    # ---- refresh -------------------------------------------------------------------------
    @contextlib.contextmanager
    def fresh(self) -> Iterator[ReaderView]:
        """Catch up, then search the resulting view (no lock is held while searching)."""
        self.refresh()
        yield self._view

    def refresh(self) -> bool:
        """Catch up with the last committed generation. True when anything changed."""
        with self._refresh_lock:
            view = self._view
            identity = current_identity(self.path)
            inode = identity[0] if identity else None
            if view.base is not None and view.base.inode == inode and view.base.mapped_bytes != identity[1]:
                # The mapped file changed in place (vector_file.current_identity): its mapping is let
                # go, and the view is built again from SQLite below, as for a memory without a snapshot.
                _log.warning("vector snapshot %s changed in place: searching SQLite alone until an index run "
                             "rewrites it", self.path)
                self._unusable = identity  # not mapped again until it is replaced (a new inode or size)
                view = _empty_view(self.dim)
            store = self.store
            with store.lock:
                # Read before the transaction below: a commit in between is seen next time.
                seen = (store.conn.execute("PRAGMA data_version").fetchone()[0], store.conn.total_changes)
            if seen == self._seen and (inode is None or (view.base is not None and view.base.inode == inode)):
                return False  # nobody committed since the last look, and the snapshot is the same
            # Opened before the read transaction, so the snapshot is never ahead of what it sees.
            new_base = None
            if inode is not None and (view.base is None or view.base.inode != inode) and identity != self._unusable:
                new_base = open_vector_file(self.path, self.dim)
                self._unusable = identity if new_base is None else None  # not opened again until it is replaced
            with store.lock:
                store.conn.execute("BEGIN")
                try:
                    meta = store.meta()
                    self.fts_analyzer = meta.get("fts_analyzer", "")
                    generation, floor = int(meta["generation"]), int(meta["tombstone_floor"])
                    if new_base is None and generation == view.generation:
                        self._seen = seen
                        return False
                    if new_base is not None and new_base.memory_id != meta.get("memory_id", ""):
                        new_base = None  # another memory's snapshot (the directory was swapped): SQLite alone
                    if new_base is not None and new_base.generation >= floor:
                        view = _base_view(new_base, self.dim)
                    elif view.generation < 0 or view.generation < floor:  # too far behind for tombstones
                        base = view.base if view.base is not None and view.base.generation >= floor else None
                        view = _empty_view(self.dim) if base is None else _base_view(base, self.dim)
                    dead = store.tombstones_since(view.generation) if view.generation >= 0 else []
                    ids, vecs, facets = store.vectors_since(view.max_row_id)
                finally:
                    store.conn.execute("COMMIT")
            self._view = _advance(view, generation, dead, ids, vecs, facets)
            self._seen = seen
            self._fts_bytes = _dir_bytes(self.path / FTS_DIR)
            store.reload_fts()
            return True

    # ---- queries (on the view the caller refreshed) -----------------------------------------
    def filter_mask(self, block_type: str | None, harness: str | None) -> Mask:
        view = self._view
        bits = view.alive.copy()
        if block_type:
            code = view.block_types.get(block_type)
            bits &= view.block == (-1 if code is None else code)
        if harness:
            code = view.harnesses.get(harness)
            bits &= view.harness == (-1 if code is None else code)
        return Mask(view, bits, bool(block_type or harness))

    def passes(self, row_id: int, mask: Mask) -> bool:
        pos = mask.view.position(row_id)
        return pos is not None and bool(mask.bits[pos])

    def passing(self, row_ids: list[int], mask: Mask) -> list[bool]:
        """`passes` for many rows at once (one search of the id array)."""
        ids, n = mask.view.ids, mask.view.n
        if not row_ids or not n:
            return [False] * len(row_ids)
        pos, found = _locate(ids, np.asarray(row_ids, np.int64))
        return (found & mask.bits[pos]).tolist()

    def bm25(self, query, depth: int, limit: int, mask: Mask) -> list[tuple[int, float]]:
        """The best `limit` of the store's top `depth` BM25 hits that `mask` lets through, in order.

        Without a filter nearly every hit passes (only rows deleted since tantivy's last merge
        fail), so the top `limit + BM25_SLACK` are read first and the full depth only when too
        few of them pass: tantivy's top lists are prefixes of each other (ties ordered by
        document), so the answer is the same, and a 300-deep leg reads 310 hits, not 610."""
        first = depth if mask.filtered else min(depth, limit + BM25_SLACK)
        ids, scores = self.store.bm25(query, first)
        hits = list(islice(compress(zip(ids, scores), self.passing(ids, mask)), limit))
        if len(hits) < limit and len(ids) == first < depth:
            ids, scores = self.store.bm25(query, depth)
            hits = list(islice(compress(zip(ids, scores), self.passing(ids, mask)), limit))
        return hits

    def nearest(self, qvec: np.ndarray, limit: int, mask: Mask) -> list[int]:
        return [row_id for row_id, _ in self.nearest_scored(qvec, limit, mask)]

    def nearest_scored(self, qvec: np.ndarray, limit: int, mask: Mask) -> list[tuple[int, float]]:
        """The `limit` rows most similar to `qvec` with their exact cosine (vectors are unit length)."""
        view, bits = mask.view, mask.bits
        limit = min(limit, np.count_nonzero(bits))  # counts bits; sum() casts each to an integer first
        if limit <= 0:
            return []
        q = np.asarray(qvec, dtype=np.float32)
        nb = view.n_base
        found: list[tuple[int, float]] = []
        if nb:
            base_bits = bits[:nb]
            allowed = np.count_nonzero(base_bits)
            pool = min(allowed, max(RESCORE_MIN, RESCORE_FACTOR * limit))
            if pool:
                top = _pool_positions(view.base, q, pool, base_bits if allowed < nb else None, allowed)
                exact_ids, exact_vecs = self.store.vectors_of(view.ids[top].tolist())
                found += zip(exact_ids.tolist(), (exact_vecs @ q).tolist())
        if view.n > nb:
            sims = view.delta_vecs @ q
            sims[~bits[nb:]] = -np.inf
            take = min(limit, np.count_nonzero(bits[nb:]))
            if take:
                top = largest_positions(sims, take)
                found += [(int(view.ids[nb + i]), float(sims[i])) for i in top]
        found.sort(key=lambda pair: (-pair[1], pair[0]))
        return found[:limit]

    def conversation_codes(self, view: ReaderView) -> np.ndarray:
        """Each row's `conversation_code` (0 = unknown): the snapshot's are mapped from its file,
        later rows' hashed from their session ids, once per view on the first call that needs
        them. Racing callers compute the same array, so no lock."""
        if view._codes:
            return view._codes[0]
        base = view.base
        if base is None:
            base_codes = np.zeros(0, np.int64)
        elif base.conversation is not None:
            base_codes = base.conversation
        else:  # a snapshot written before it held the codes: its next rewrite will
            base_codes = _snapshot_conversations(base, self.store)
        delta = np.fromiter(map(conversation_code, view.delta_sessions), np.int64, len(view.delta_sessions))
        codes = np.concatenate([base_codes, delta]) if len(delta) else base_codes
        view._codes[:] = [codes]
        return codes

    def sessions_of(self, row_ids: list[int], mask: Mask) -> np.ndarray:
        """The session code of each row (0 for a row the view does not hold)."""
        view = mask.view
        if not row_ids or not view.n:
            return np.zeros(len(row_ids), np.int64)
        pos, found = _locate(view.ids, np.asarray(row_ids, np.int64))
        return np.where(found, self.conversation_codes(view)[pos], 0)

    def snapshot_held(self, row_ids: list[int], stems: frozenset[str], mask: Mask) -> dict[int, frozenset[str]]:
        """Which of `stems` BM25 holds for each row the snapshot has stems for (text_analysis.held_stems,
        read from its stem ids: a few array operations for ~150 rows instead of stemming texts);
        rows after the snapshot, or of a snapshot without stems of this analyzer, are left out."""
        base = mask.view.base
        if base is None or base.stem_ids is None or base.stems_analyzer != ANALYZER or not row_ids:
            return {}
        vocabulary = base.vocabulary()
        asked = {vocabulary[s]: s for s in stems if s in vocabulary}
        wanted = np.fromiter(row_ids, np.int64, len(row_ids))
        pos, found = _locate(mask.view.ids, wanted)
        mapped = found & (pos < base.n)
        pos = pos[mapped]
        held: list[set[str]] = [set() for _ in range(len(pos))]
        if asked and len(pos):
            starts = base.stem_start[pos]
            counts = base.stem_start[pos + 1] - starts
            ends = np.cumsum(counts)
            # The stems of every row in turn: row j's run starts at starts[j].
            every = np.arange(int(ends[-1])) + np.repeat(starts - (ends - counts), counts)
            ids = base.stem_ids[every]
            # A query holds a few stems: one comparison each costs less than `np.isin`'s set-up.
            hit = np.zeros(len(ids), bool)
            for stem_id in asked:
                hit |= ids == stem_id
            at = np.flatnonzero(hit)  # each one's row: the first whose run ends after it
            for j, stem_id in zip(np.searchsorted(ends, at, side="right").tolist(), ids[at].tolist()):
                held[j].add(asked[stem_id])
        return dict(zip(wanted[mapped].tolist(), map(frozenset, held)))

    def held_stems(self, rows: dict[int, Row], stems: frozenset[str], mask: Mask) -> dict[int, frozenset[str]]:
        """Which of `stems` BM25 holds for each row: from the snapshot (`snapshot_held`), from the
        text for later rows or a snapshot without them."""
        out = self.snapshot_held(list(rows), stems, mask)
        for rid, row in rows.items():
            if rid not in out:
                out[rid] = held_stems(row.text, row.ts, stems)
        return out

    def epoch_of(self, row_id: int) -> float | None:
        view = self._view
        pos = view.position(row_id)
        if pos is None:
            return None
        v = float(view.epoch[pos])
        return None if math.isnan(v) else v


def _advance(view: ReaderView, generation: int, dead: list[int], ids: np.ndarray, vecs: np.ndarray,
             facets: list[tuple]) -> ReaderView:
    """A new view: `dead` rows masked out, rows `ids` appended (copy-on-write)."""
    alive = view.alive
    if dead:
        positions, found = _locate(view.ids, np.asarray(dead, np.int64))
        positions = positions[found]
        if len(positions):
            alive = alive.copy()
            alive[positions] = False
    if not len(ids):
        return ReaderView(generation, view.max_row_id, view.base, view.ids, alive, view.block, view.harness, view.epoch,
                          view.delta_vecs, view.delta_sessions, view.block_types, view.harnesses)
    block_types, harnesses = dict(view.block_types), dict(view.harnesses)
    block = np.array([block_types.setdefault(f[0], len(block_types)) for f in facets], np.int32)
    harness = np.array([harnesses.setdefault(f[1], len(harnesses)) for f in facets], np.int32)
    epoch = np.array([math.nan if f[2] is None else f[2] for f in facets], np.float64)
    return ReaderView(
        generation=generation, max_row_id=int(ids[-1]), base=view.base,
        ids=np.concatenate([view.ids, ids]), alive=np.concatenate([alive, np.ones(len(ids), bool)]),
        block=np.concatenate([view.block, block]), harness=np.concatenate([view.harness, harness]),
        epoch=np.concatenate([view.epoch, epoch]), delta_vecs=np.concatenate([view.delta_vecs, vecs]),
        delta_sessions=view.delta_sessions + tuple(f[3] for f in facets), block_types=block_types,
        harnesses=harnesses)
