"""Bring a memory up to date with a tree of transcripts.

Beyond funes (append-only), the result always equals a from-scratch index of the tree as it
is now: rows of deleted or shrunk conversations are removed and a turn whose text changed is
embedded again. Only chunks whose text is not already stored are embedded.
"""

from __future__ import annotations

import errno
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shared.engine.chunking import Chunk, chunk_turn
from shared.engine.embedder import Embedder
from shared.engine.fault_injection import fault_point
from shared.engine.memory_lock import memory_lock
from shared.engine.store import MemoryDamaged, MemoryStore, NewRow
from shared.engine.transcript import read_transcript, transcript_signatures

_log = logging.getLogger("recall.engine.index")


@dataclass(frozen=True)
class IndexReport:
    sessions: int  # sources (re)parsed this run
    skipped: int  # sources unchanged since the last run
    chunks: int  # chunks embedded and added
    removed: int  # chunks removed (deleted, shrunk or edited conversations)
    malformed_lines: int
    generation: int

    def summary_line(self) -> str:
        return f"indexed sessions={self.sessions} skipped={self.skipped} chunks={self.chunks}"


def memory_dir(home: Path) -> Path:
    return home / "memory"


def open_or_create(home: Path, embedder: Embedder) -> tuple[MemoryStore, bool]:
    """The memory under `home` (the caller holds its lock), and whether it was made anew: none
    yet, or a damaged one, deleted whole (its text too: a forget must reach every copy) to be
    rebuilt from the sources."""
    path = memory_dir(home)
    if MemoryStore.exists(path):
        try:
            store = MemoryStore.open(path)
        except MemoryDamaged as exc:
            _log.warning("memory damaged, rebuilt from its sources: %s", exc)
            _delete_tree(path)
        else:
            store.check_model(embedder.spec.model_id, embedder.dim)
            return store, False
    return MemoryStore.create(path, embedder.spec.model_id, embedder.dim), True


def _delete_tree(path: Path, attempts: int = 3) -> None:
    """`shutil.rmtree`, again when a file appeared in a directory while it was emptied: a tantivy
    index still open in this process polls its damaged meta.json and takes its lock file in
    `fts/` meanwhile (a full test run under load saw "Directory not empty: 'fts'")."""
    for attempt in range(attempts):
        try:
            shutil.rmtree(path)
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY or attempt == attempts - 1:
                raise


Checkpoint = Callable[[str], None]
# Chunks embedded between checkpoints: bounds how late an abort (a stop, a yield to a forget) takes
# effect. 256 took up to 23 s on two cores shared by four runs (an SRE trial's stops took 30 s);
# 64 costs ~2 % more CPU per conversation (shorter length groups).
EMBED_BATCH = 64
# Chunks embedded per commit. A long run (a first import of a large history, a re-embed) that is
# stopped (a timeout, a lost or yielded lock, kill -9) keeps what it committed, and the next run
# goes on from there instead of starting over; readers see a large import as it progresses.
# Each commit holds whole sources, so a conversation is never half indexed.
COMMIT_SLICE = 2048


def _no_checkpoint(point: str) -> None:
    pass


class WindDown(Exception):
    """Raised by a checkpoint between embedding batches ("mid_embedding") to end the run once it
    has committed the whole sources it already embedded: a stop or a timeout, while the run still
    owns the memory. `reason` is raised then (the checkpoint is asked "before_commit" first, and
    may still refuse). Without it a stopped run lost up to COMMIT_SLICE chunks of embedding, and
    while a rolling update kept stopping runs few of them ever committed."""

    def __init__(self, reason: Exception) -> None:
        super().__init__(str(reason))
        self.reason = reason


def index_tree(home: Path, src: Path, embedder: Embedder, lock_wait_s: float = 0.0, purge: bool = False,
               checkpoint: Checkpoint = _no_checkpoint, only_removals: bool = False) -> IndexReport:
    """Index `src` into `$home/memory` under the memory lock (MemoryBusy if it is held).

    With `purge`, removed rows are also scrubbed from the files on disk (a forget request;
    always, since an earlier attempt that was stopped may have committed the removal).
    The run commits every COMMIT_SLICE new chunks, whole sources at a time. `checkpoint(point)`
    is called between phases and embedding batches, and just before each commit; an exception
    it raises aborts the run, keeping only the slices committed before it (a lost lock): the next
    run goes on from there. WindDown (a stop, a timeout) first commits what was embedded. Sources
    may be deleted or replaced while the run reads them (snapshot undo, retention, forget): a
    vanished file counts as deleted, and a replaced one is re-read next run."""
    if not src.exists():
        raise FileNotFoundError(f"no such path: {src}")
    with memory_lock(home, lock_wait_s, waiting=lambda: checkpoint("lock_wait")):
        store, made = open_or_create(home, embedder)
        only_removals = only_removals and not made  # a rebuilt memory takes every source back
        try:
            # A snapshot between slices keeps readers of a growing memory off SQLite's tail.
            known, signatures = store.sources(), transcript_signatures(src.resolve())
            _checkpoint(checkpoint, "after_listing")
            report = (_removals(store, known, signatures, embedder, checkpoint) if only_removals else
                      _sync(store, known, signatures, embedder, checkpoint, between_commits=store.publish_vectors))
            if purge:
                store.purge_deleted_text()
            store.publish_vectors()
            return report
        finally:
            store.close()


def _checkpoint(checkpoint: Checkpoint, point: str) -> None:
    fault_point(point)
    checkpoint(point)


@dataclass(frozen=True)
class _Mark:
    """How long each of a slice's lists was once a source was wholly read into it."""
    added: int
    dead: int
    sources: int
    gone: int


class _Slice:
    """Sources parsed since the last commit: what they add and remove, committed together."""

    def __init__(self) -> None:
        self.to_add: list[tuple[Chunk, str]] = []
        self.dead: list[int] = []
        self.sources: dict[str, str] = {}
        self.gone: list[str] = []
        self._marks: list[_Mark] = []

    def __bool__(self) -> bool:
        return bool(self.to_add or self.dead or self.sources or self.gone)

    def drop_source(self, store: MemoryStore, key: str) -> None:
        """A source that is gone: all its rows go."""
        self.gone.append(key)
        self.dead += [row_id for row_id, _ in store.rows_of_source(key).values()]
        self._mark()

    def read_source(self, key: str, signature: str, new_chunks: list[Chunk], dead: list[int]) -> None:
        self.to_add += [(chunk, key) for chunk in new_chunks]
        self.dead += dead
        self.sources[key] = signature
        self._mark()

    def _mark(self) -> None:
        self._marks.append(_Mark(len(self.to_add), len(self.dead), len(self.sources), len(self.gone)))

    def embedded_part(self, embedded: int) -> _Slice:
        """The sources whose every new chunk is among the first `embedded`, with the removals
        read before them: a prefix, since sources are read in order (never half a conversation)."""
        part = _Slice()
        whole = [mark for mark in self._marks if mark.added <= embedded]
        if whole:
            last = whole[-1]
            part.to_add, part.dead = self.to_add[:last.added], self.dead[:last.dead]
            part.sources, part.gone = dict(list(self.sources.items())[:last.sources]), self.gone[:last.gone]
        return part


def _outdated(stored: dict[str, tuple[int, str]], wanted: dict[str, str]) -> list[int]:
    """Rows of a source (chunk key → row id, text hash) whose text its file no longer holds
    (`wanted`: chunk key → text hash)."""
    return [row_id for ck, (row_id, h) in stored.items() if wanted.get(ck) != h]


def _sync(store: MemoryStore, known: dict[str, str], signatures: dict[str, str], embedder: Embedder,
          checkpoint: Checkpoint, between_commits: Callable[[], None]) -> IndexReport:
    changed = [key for key in signatures if known.get(key) != signatures[key]]
    if not changed and all(key in signatures for key in known):
        return IndexReport(0, len(signatures), 0, 0, 0, store.generation())

    # Deleted sources go in the first commit, so a forget's rows are gone at its first commit.
    current = _Slice()
    for key in [key for key in known if key not in signatures]:
        current.drop_source(store, key)
    sessions = added = removed = malformed = 0
    generation = store.generation()
    for key in changed:
        try:
            parsed = read_transcript(Path(key))
        except FileNotFoundError:  # removed between the listing and now
            del signatures[key]
            if key in known:
                current.drop_source(store, key)
            continue
        sessions += 1
        malformed += parsed.malformed_lines
        wanted = {c.chunk_key: c for turn in parsed.turns for c in chunk_turn(turn)}
        stored = store.rows_of_source(key)
        new_chunks = [chunk for ck, chunk in wanted.items() if stored.get(ck, (0, None))[1] != chunk.text_hash]
        dead = _outdated(stored, {ck: c.text_hash for ck, c in wanted.items()})
        current.read_source(key, signatures[key], new_chunks, dead)
        if len(current.to_add) >= COMMIT_SLICE:
            generation = _commit(store, current, embedder, checkpoint)
            between_commits()
            added, removed, current = added + len(current.to_add), removed + len(set(current.dead)), _Slice()
    if current:
        generation = _commit(store, current, embedder, checkpoint)
        added, removed = added + len(current.to_add), removed + len(set(current.dead))
    return IndexReport(sessions, len(signatures) - sessions, added, removed, malformed, generation)


def _removals(store: MemoryStore, known: dict[str, str], signatures: dict[str, str], embedder: Embedder,
              checkpoint: Checkpoint) -> IndexReport:
    """Remove every row whose text the tree no longer holds, embedding nothing: all rows of a
    deleted source, and those rows of a rewritten one (a conversation started anew after its
    forget, a snapshot newer than the last run) that its file no longer holds. A rewritten
    source keeps its old signature, so the next full run reads it and adds what is new; a
    source the memory never held is left to that run too (a forget does not wait for a backlog)."""
    work = _Slice()
    for key in known:
        if key in signatures and signatures[key] == known[key]:
            continue
        try:
            parsed = read_transcript(Path(key)) if key in signatures else None
        except FileNotFoundError:  # removed between the listing and now
            parsed = None
        if parsed is None:
            work.drop_source(store, key)
            continue
        wanted = {c.chunk_key: c.text_hash for turn in parsed.turns for c in chunk_turn(turn)}
        work.dead += _outdated(store.rows_of_source(key), wanted)
    if not work.dead and not work.gone:
        return IndexReport(0, len(signatures), 0, 0, 0, store.generation())
    generation = _commit(store, work, embedder, checkpoint)
    return IndexReport(0, len(signatures), 0, len(set(work.dead)), 0, generation)


def _commit(store: MemoryStore, work: _Slice, embedder: Embedder, checkpoint: Checkpoint) -> int:
    """Embed one slice's new chunks and commit it with its sources' signatures (atomically)."""
    vectors = []
    try:
        for start in range(0, len(work.to_add), EMBED_BATCH):
            vectors += list(embedder.embed([c.text for c, _ in work.to_add[start:start + EMBED_BATCH]]))
            _checkpoint(checkpoint, "mid_embedding")
    except WindDown as ending:
        part = work.embedded_part(len(vectors))
        if part:
            _write(store, part, vectors, checkpoint)
            _log.info("index run ending: committed %d of the %d chunks it embedded", len(part.to_add), len(vectors))
        raise ending.reason from None
    return _write(store, work, vectors, checkpoint)


def _write(store: MemoryStore, work: _Slice, vectors: list, checkpoint: Checkpoint) -> int:
    """Commit a slice whose new chunks are embedded (`vectors` may hold more: they are not its)."""
    added = [NewRow(chunk=c, source_path=key, vector=v) for (c, key), v in zip(work.to_add, vectors)]
    _checkpoint(checkpoint, "before_commit")
    generation = store.commit_changes(added, work.dead, work.sources, work.gone)
    fault_point("after_sqlite_commit")
    return generation


def forget_session(home: Path, session_id: str, lock_wait_s: float = 5.0) -> int:
    """Remove every chunk of one session now. Returns how many were removed.

    Its source file is left alone: delete it too, or the next index run brings it back.
    """
    path = memory_dir(home)
    if not MemoryStore.exists(path):
        return 0
    with memory_lock(home, lock_wait_s):
        store = MemoryStore.open(path)
        try:
            rows = store.conn.execute("SELECT row_id, source_path FROM chunks WHERE session_id=?", (session_id,)).fetchall()
            if not rows:
                return 0
            # Forget the source's signature so a recreated file is indexed again from scratch.
            store.commit_changes([], [r[0] for r in rows], {}, sorted({r[1] for r in rows}))
            store.purge_deleted_text()
            return len(rows)
        finally:
            store.close()
