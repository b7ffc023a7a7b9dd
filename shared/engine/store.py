"""The on-disk memory: one directory holding a SQLite file and a tantivy BM25 index.

Layout of `<memory>/`:
- `chunks.sqlite3`: every live chunk (text, coordinates, float32 vector), the sources that
  produced them, tombstones and the stamp of the embedding model. SQLite in WAL mode is the
  single source of truth and its transaction is the commit point of an index run.
- `vectors.i8`: an int8 snapshot of the vectors for the dense leg's scan, derived from SQLite,
  published by rename after the SQLite commit (see vector_file.py).
- `fts/`: tantivy over the chunk text, keyed by `row_id`. It is a derived index that may run
  ahead of SQLite (docs added before the SQLite commit) or behind it (docs deleted after), so
  readers keep only BM25 hits whose row_id SQLite says is alive.

Commit protocol of a write (the caller holds the memory lock):
1. delete from tantivy any doc whose row_id is above the committed maximum (orphans of a crash);
2. add the new rows' docs to tantivy and commit it (invisible: SQLite does not know them yet);
3. one SQLite transaction inserts the rows, deletes the dead ones, records their tombstones and
   bumps `generation`: from here readers see the new state, all at once;
4. delete the dead rows' docs from tantivy (queued in `fts_pending_delete`, so a crash here is
   finished by the next write).
A kill -9 at any step leaves the last committed generation fully searchable.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import tantivy

from shared.engine.chunking import Chunk
from shared.engine.fault_injection import fault_point
from shared.engine.text_analysis import ANALYZER, fts_text, turn_stems
from shared.engine.vector_file import open_vector_file, write_vector_file

SCHEMA_VERSION = "1"
DB_NAME = "chunks.sqlite3"
FTS_DIR = "fts"
TOMBSTONE_KEEP = 500  # generations of tombstones kept for incremental reader refresh
# A new int8 snapshot (vector_file.py) is published when readers would otherwise read more than
# this many rows from SQLite on open (or 1/32 of the snapshot), or when it is this many
# generations behind (tombstones older than TOMBSTONE_KEEP are gone).
SNAPSHOT_LAG_ROWS = 2048
SNAPSHOT_LAG_GENERATIONS = 400

# Each row's distinct BM25 stems (text_analysis.turn_stems) as written with it, so the int8
# snapshot can carry them for conversation evidence without stemming every turn again. A memory
# written before this table gets it at its next write; the snapshot stems its rows meanwhile.
STEMS_TABLE = "CREATE TABLE IF NOT EXISTS chunk_stems (row_id INTEGER PRIMARY KEY, stems TEXT NOT NULL)"

ROW_COLUMNS = (
    "row_id, chunk_key, session_id, turn_uuid, seq, ts, ts_epoch, role, harness, workdir,"
    " block_type, block_idx, split_idx, source_path, text"
)


class MemoryUnusable(Exception):
    """A memory that cannot be used as it is (wrong model, corrupt files)."""


class ModelMismatch(MemoryUnusable):
    pass


class MemoryDamaged(MemoryUnusable):
    """Files that no longer read as a memory (a truncated or garbled database or BM25 index).
    A memory is derived from its sources, so an index run rebuilds it from them (index_run)."""


# tantivy-py reports every failure as ValueError; these say the files are wrong. Anything else
# (an I/O error, too many open files, a permission) is the moment's, and deletes nothing.
_TANTIVY_DAMAGE = ("Data corrupted", "Directory does not exist", "FileDoesNotExist",
                   "kind: InvalidData")  # a segment file cut short: "Footer magic byte mismatch. File corrupted"


def _damage(exc: Exception) -> bool:
    """Whether opening failed on the files' content rather than on the moment (a lock, a full
    table of open files, a permission): only damage is worth throwing a memory away for."""
    if isinstance(exc, sqlite3.OperationalError):
        return str(exc).startswith("no such table")  # a file cut to nothing reads as an empty database
    if isinstance(exc, sqlite3.DatabaseError):
        return True  # "database disk image is malformed", "file is not a database"
    return isinstance(exc, ValueError) and any(mark in str(exc) for mark in _TANTIVY_DAMAGE)


class Row(NamedTuple):
    """One stored chunk. A tuple, not a frozen dataclass: a recall builds ~70 of them, and a
    frozen dataclass pays a guarded setattr per field (0.14 vs 0.01 ms per 60 rows)."""

    row_id: int
    chunk_key: str
    session_id: str
    turn_uuid: str
    seq: int
    ts: str
    ts_epoch: float | None
    role: str
    harness: str
    workdir: str
    block_type: str
    block_idx: int
    split_idx: int
    source_path: str
    text: str


@dataclass(frozen=True)
class NewRow:
    chunk: Chunk
    source_path: str
    vector: np.ndarray


def _fts_schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_integer_field("row_id", stored=True, indexed=True, fast=True)
    sb.add_text_field("text", stored=False, tokenizer_name="default")
    return sb.build()


def journal_mode() -> str:
    """WAL (default) lets readers run during a commit but needs one host's shared memory;
    on a volume shared by several nodes (NFS, RWX) set RECALL_SQLITE_JOURNAL_MODE=delete."""
    mode = os.environ.get("RECALL_SQLITE_JOURNAL_MODE", "wal").lower()
    if mode not in ("wal", "delete"):
        raise ValueError("RECALL_SQLITE_JOURNAL_MODE must be wal or delete")
    return mode


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection):
    """One write transaction, taken at once (readers keep reading under WAL), rolled back on any error."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _connect(path: Path, create: bool = False) -> sqlite3.Connection:
    # Opening never creates: a memory deleted between the existence check and here (a forget)
    # must not come back as an empty database, which would read as a corrupt memory for good.
    target, uri = (path, False) if create else (f"{path.absolute().as_uri()}?mode=rw", True)
    conn = sqlite3.connect(target, timeout=30, isolation_level=None, check_same_thread=False, uri=uri)
    conn.execute(f"PRAGMA journal_mode={journal_mode().upper()}")
    # Freed pages are zeroed, so deleted chunks do not linger in the file's free space.
    conn.execute("PRAGMA secure_delete=ON")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


class MemoryStore:
    """Open handle on one memory directory. Writes need the memory lock held by the caller."""

    def __init__(self, path: Path, conn: sqlite3.Connection, fts: tantivy.Index) -> None:
        self.path = path
        self.conn = conn
        self.fts = fts
        self.schema = fts.schema
        # One connection serves every thread of a reader: statements and the refresh
        # transaction take turns (each is sub-millisecond); scans and BM25 need no lock.
        self.lock = threading.RLock()
        self.dim = int(conn.execute("SELECT value FROM meta WHERE key='dim'").fetchone()[0])

    # ---- opening -------------------------------------------------------------------------
    @staticmethod
    def exists(path: Path) -> bool:
        return (path / DB_NAME).is_file()

    @classmethod
    def open(cls, path: Path) -> "MemoryStore":
        if not cls.exists(path):
            raise FileNotFoundError(f"no index found at {path}")
        journal_mode()  # a setting's mistake is raised as itself, never taken for a damaged file
        if not (path / FTS_DIR / "meta.json").is_file():
            # tantivy would start an empty index there (every turn gone from BM25 for good) and a
            # reader would write it; a memory is made with its index (_initialise), so it is lost.
            raise MemoryDamaged(f"memory at {path} has lost its BM25 index; the next `recall-engine index` rebuilds it "
                                "from its sources")
        try:
            conn = _connect(path / DB_NAME)
            conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
            fts = tantivy.Index(_fts_schema(), path=str(path / FTS_DIR), reuse=True)
        except (sqlite3.DatabaseError, ValueError, OSError) as exc:
            if _damage(exc):
                raise MemoryDamaged(f"memory at {path} is damaged ({exc}); the next `recall-engine index` rebuilds it "
                                    "from its sources") from exc
            raise MemoryUnusable(f"memory at {path} cannot be opened now ({exc})") from exc
        return cls(path, conn, fts)

    @classmethod
    def create(cls, path: Path, model_id: str, dim: int) -> "MemoryStore":
        """Build an empty memory beside `path` and rename it into place, so a reader never
        finds a database without its tables (the caller holds the memory lock)."""
        staging = path.with_name(f".{path.name}.creating")
        shutil.rmtree(staging, ignore_errors=True)  # left by a crash during an earlier create
        (staging / FTS_DIR).mkdir(parents=True)
        cls._initialise(staging, model_id, dim)
        os.rename(staging, path)
        return cls.open(path)

    @staticmethod
    def _initialise(path: Path, model_id: str, dim: int) -> None:
        conn = _connect(path / DB_NAME, create=True)
        conn.executescript(
            """
            BEGIN;
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS chunks (
                row_id INTEGER PRIMARY KEY, chunk_key TEXT NOT NULL, session_id TEXT NOT NULL,
                turn_uuid TEXT NOT NULL, seq INTEGER NOT NULL, ts TEXT NOT NULL, ts_epoch REAL,
                role TEXT NOT NULL, harness TEXT NOT NULL, workdir TEXT NOT NULL,
                block_type TEXT NOT NULL, block_idx INTEGER NOT NULL, split_idx INTEGER NOT NULL,
                source_path TEXT NOT NULL, text TEXT NOT NULL, text_hash TEXT NOT NULL,
                vector BLOB NOT NULL);
            CREATE INDEX IF NOT EXISTS chunks_session_seq ON chunks(session_id, seq);
            CREATE INDEX IF NOT EXISTS chunks_source ON chunks(source_path);
            CREATE TABLE IF NOT EXISTS sources (path TEXT PRIMARY KEY, signature TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS tombstones (row_id INTEGER NOT NULL, generation INTEGER NOT NULL);
            CREATE INDEX IF NOT EXISTS tombstones_gen ON tombstones(generation);
            CREATE TABLE IF NOT EXISTS fts_pending_delete (row_id INTEGER PRIMARY KEY);
            COMMIT;
            """
        )
        conn.execute(STEMS_TABLE)
        stamp = {"schema_version": SCHEMA_VERSION, "model_id": model_id, "dim": str(dim), "memory_id": uuid.uuid4().hex,
                 "generation": "0", "max_row_id": "0", "tombstone_floor": "0", "last_indexed": "",
                 "fts_analyzer": ANALYZER}
        conn.executemany("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)", stamp.items())
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        tantivy.Index(_fts_schema(), path=str(path / FTS_DIR), reuse=True)

    def close(self) -> None:
        self.conn.close()

    # ---- metadata ------------------------------------------------------------------------
    def meta(self) -> dict[str, str]:
        with self.lock:
            return dict(self.conn.execute("SELECT key, value FROM meta").fetchall())

    def check_model(self, model_id: str, dim: int) -> None:
        meta = self.meta()
        if meta.get("model_id") != model_id or int(meta.get("dim", "0")) != dim:
            raise ModelMismatch(
                f'memory at {self.path} was built with embedding model "{meta.get("model_id")}" '
                f'(dim {meta.get("dim")}), refusing to mix with "{model_id}" (dim {dim}); '
                f"rebuild it: delete {self.path} and run `recall-engine index --yes <src>` again"
            )

    def generation(self) -> int:
        with self.lock:
            return int(self.conn.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0])

    # ---- reads ---------------------------------------------------------------------------
    def counts(self) -> tuple[int, int]:
        with self.lock:
            chunks, sessions = self.conn.execute(
                "SELECT COUNT(*), COUNT(DISTINCT session_id) FROM chunks").fetchone()
        return int(chunks), int(sessions)

    def session_chunks(self, session_id: str) -> int:
        with self.lock:
            return int(self.conn.execute("SELECT COUNT(*) FROM chunks WHERE session_id=?", (session_id,)).fetchone()[0])

    def sources(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT path, signature FROM sources").fetchall())

    def rows_of_source(self, source_path: str) -> dict[str, tuple[int, str]]:
        cur = self.conn.execute("SELECT chunk_key, row_id, text_hash FROM chunks WHERE source_path=?", (source_path,))
        return {key: (row_id, h) for key, row_id, h in cur}

    def rows(self, row_ids: Sequence[int]) -> dict[int, Row]:
        if not row_ids:
            return {}
        marks = ",".join("?" * len(row_ids))
        with self.lock:
            found = self.conn.execute(f"SELECT {ROW_COLUMNS} FROM chunks WHERE row_id IN ({marks})", list(row_ids)).fetchall()
        return {r[0]: Row(*r) for r in found}

    def vectors_of(self, row_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The float32 vectors of the rows still alive among `row_ids`: (ids, matrix)."""
        dim = self.dim
        if not row_ids:
            return np.zeros(0, np.int64), np.zeros((0, dim), np.float32)
        marks = ",".join("?" * len(row_ids))
        with self.lock:
            found = self.conn.execute(f"SELECT row_id, vector FROM chunks WHERE row_id IN ({marks})", list(row_ids)).fetchall()
        matrix = np.frombuffer(b"".join(r[1] for r in found), dtype=np.float32).reshape(len(found), dim)
        return np.fromiter((r[0] for r in found), np.int64, len(found)), matrix

    def session_rows(self, session_id: str, seq_lo: int, seq_hi: int) -> list[Row]:
        with self.lock:
            found = self.conn.execute(
                f"SELECT {ROW_COLUMNS} FROM chunks WHERE session_id=? AND seq BETWEEN ? AND ?"
                " ORDER BY seq, turn_uuid, block_idx, split_idx", (session_id, seq_lo, seq_hi)).fetchall()
        return [Row(*r) for r in found]

    def sessions_rows(self, windows: Sequence[tuple[str, int, int]]) -> list[list[Row]]:
        """`session_rows` of several (session_id, seq_lo, seq_hi) windows in one statement."""
        if not windows:
            return []
        select = f"SELECT ? AS window, {ROW_COLUMNS} FROM chunks WHERE session_id=? AND seq BETWEEN ? AND ?"
        sql = " UNION ALL ".join([select] * len(windows)) + " ORDER BY window, seq, turn_uuid, block_idx, split_idx"
        with self.lock:
            found = self.conn.execute(sql, [v for i, w in enumerate(windows) for v in (i, *w)]).fetchall()
        out: list[list[Row]] = [[] for _ in windows]
        for r in found:
            out[r[0]].append(Row(*r[1:]))
        return out

    def turn_openings(self, row_ids: Sequence[int]) -> list[int]:
        """Of `row_ids`, each turn's first chunk (in block and split order) among them."""
        if not row_ids:
            return []
        marks = ",".join("?" * len(row_ids))
        with self.lock:
            found = self.conn.execute(f"SELECT row_id, session_id, turn_uuid FROM chunks WHERE row_id IN ({marks})"
                                      " ORDER BY block_idx, split_idx", list(row_ids)).fetchall()
        first: dict[tuple[str, str], int] = {}
        for row_id, session_id, turn_uuid in found:
            first.setdefault((session_id, turn_uuid), row_id)
        return list(first.values())

    def turn_rows(self, session_id: str, turn_uuid: str) -> list[Row]:
        with self.lock:
            found = self.conn.execute(
                f"SELECT {ROW_COLUMNS} FROM chunks WHERE session_id=? AND turn_uuid=?"
                " ORDER BY block_idx, split_idx", (session_id, turn_uuid)).fetchall()
        return [Row(*r) for r in found]

    def vectors_since(self, after_row_id: int) -> tuple[np.ndarray, np.ndarray, list[tuple]]:
        """Rows added after `after_row_id`: ids, vectors, and (block_type, harness, ts_epoch, session_id)."""
        with self.lock:
            found = self.conn.execute(
                "SELECT row_id, vector, block_type, harness, ts_epoch, session_id FROM chunks WHERE row_id > ?"
                " ORDER BY row_id", (after_row_id,)).fetchall()
        ids, vecs, facets = [], [], []
        for row_id, blob, block_type, harness, ts_epoch, session_id in found:
            ids.append(row_id)
            vecs.append(blob)
            facets.append((block_type, harness, ts_epoch, session_id))
        dim = self.dim
        matrix = np.frombuffer(b"".join(vecs), dtype=np.float32).reshape(len(ids), dim) if ids else np.zeros((0, dim), np.float32)
        return np.asarray(ids, dtype=np.int64), matrix, facets

    def sessions_upto(self, max_row_id: int) -> tuple[np.ndarray, list[str]]:
        """(row_id, session_id) of the rows up to `max_row_id`, in session order: read from the
        (session_id, seq) index alone, which holds the row id too (10k conversations: ~15 ms)."""
        with self.lock:
            found = self.conn.execute("SELECT row_id, session_id FROM chunks INDEXED BY chunks_session_seq"
                                      " WHERE row_id <= ?", (max_row_id,)).fetchall()
        return np.fromiter((r[0] for r in found), np.int64, len(found)), [r[1] for r in found]

    def tombstones_since(self, generation: int) -> list[int]:
        with self.lock:
            return [r[0] for r in self.conn.execute("SELECT row_id FROM tombstones WHERE generation > ?", (generation,))]

    def bm25(self, query: tantivy.Query, depth: int) -> tuple[list[int], list[float]]:
        """tantivy's top `depth` hits as row ids and scores, best first. Row ids come from the
        `row_id` fast field, a column read (10k conversations, 300 hits: 0.16 ms, against 0.45 ms
        through the document store); a segment without the column falls back to the document."""
        searcher = self.fts.searcher()
        hits = searcher.search(query, depth).hits
        if not hits:
            return [], []
        row_ids = searcher.fast_field_values("row_id", [addr for _, addr in hits])
        return ([int(searcher.doc(addr)["row_id"][0]) if rid is None else rid for (_, addr), rid in zip(hits, row_ids)],
                [float(score) for score, _ in hits])

    def doc_freqs(self, terms: Sequence[str]) -> tuple[int, list[int]]:
        """How many BM25 documents there are, and how many hold each (stemmed) term."""
        searcher = self.fts.searcher()
        return searcher.num_docs, [searcher.doc_freq("text", t) for t in terms]

    def reload_fts(self) -> None:
        self.fts.reload()

    # ---- writes (memory lock held) ---------------------------------------------------------
    def commit_changes(
        self,
        added: Sequence[NewRow],
        dead_row_ids: Iterable[int],
        sources_set: dict[str, str],
        sources_removed: Iterable[str],
    ) -> int:
        """Apply one index run atomically (see the module docstring). Returns the new generation."""
        dead = sorted(set(dead_row_ids))
        if self.meta().get("fts_analyzer") != ANALYZER:
            self.rebuild_fts()  # built by an older analyzer: re-analyse the live rows once
        meta = self.meta()
        max_row_id = int(meta["max_row_id"])
        self.conn.execute(STEMS_TABLE)  # a memory written before the table
        writer = self.fts.writer(heap_size=50_000_000, num_threads=1)
        try:
            writer.delete_documents_by_query(self._row_range(max_row_id + 1, None))
            new_ids = range(max_row_id + 1, max_row_id + 1 + len(added))
            analysed = [fts_text(row.chunk.text, row.chunk.ts) for row in added]
            for row_id, fts in zip(new_ids, analysed):
                writer.add_document(tantivy.Document(row_id=row_id, text=fts))
            writer.commit()
            fault_point("after_tantivy_commit")  # crash tests: tantivy committed, SQLite not yet

            generation = int(meta["generation"]) + 1
            c = self.conn
            with _immediate(c):
                c.executemany(
                    "INSERT INTO chunks (row_id, chunk_key, session_id, turn_uuid, seq, ts, ts_epoch, role, harness,"
                    " workdir, block_type, block_idx, split_idx, source_path, text, text_hash, vector)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    [
                        (rid, r.chunk.chunk_key, r.chunk.session_id, r.chunk.turn_uuid, r.chunk.seq, r.chunk.ts,
                         r.chunk.ts_epoch, r.chunk.role, r.chunk.harness, r.chunk.workdir, r.chunk.block_type,
                         r.chunk.block_idx, r.chunk.split_idx, r.source_path, r.chunk.text, r.chunk.text_hash,
                         np.asarray(r.vector, dtype=np.float32).tobytes())
                        for rid, r in zip(new_ids, added)
                    ],
                )
                c.executemany("INSERT OR REPLACE INTO chunk_stems (row_id, stems) VALUES (?, ?)",
                              [(rid, turn_stems(fts)) for rid, fts in zip(new_ids, analysed)])
                c.executemany("DELETE FROM chunks WHERE row_id=?", [(i,) for i in dead])
                c.executemany("DELETE FROM chunk_stems WHERE row_id=?", [(i,) for i in dead])
                c.executemany("INSERT INTO tombstones (row_id, generation) VALUES (?, ?)", [(i, generation) for i in dead])
                c.executemany("INSERT OR IGNORE INTO fts_pending_delete (row_id) VALUES (?)", [(i,) for i in dead])
                c.executemany("INSERT OR REPLACE INTO sources (path, signature) VALUES (?, ?)", sources_set.items())
                c.executemany("DELETE FROM sources WHERE path=?", [(p,) for p in sources_removed])
                floor = max(0, generation - TOMBSTONE_KEEP)
                c.execute("DELETE FROM tombstones WHERE generation <= ?", (floor,))
                c.executemany("UPDATE meta SET value=? WHERE key=?", [
                    (str(generation), "generation"),
                    (str(max_row_id + len(added)), "max_row_id"),
                    (str(floor), "tombstone_floor"),
                    (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "last_indexed"),
                ])
            self._flush_fts_deletes(writer)
            _finish_merges(writer)
        finally:
            del writer  # releases tantivy's writer lock
        self.fts.reload()
        return generation

    def purge_deleted_text(self) -> None:
        """Make a deletion provable on disk, not just invisible: tantivy keeps deleted documents'
        terms in its segments until a merge, so the BM25 index is rebuilt from the live rows,
        obsolete segment files are removed, and SQLite's WAL is checkpointed and truncated
        (secure_delete already zeroes freed pages). Costs about 10 µs per live chunk."""
        self.rebuild_fts()
        if journal_mode() == "wal":
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def rebuild_fts(self) -> None:
        """The BM25 index from the live rows, with the current analyzer (memory lock held)."""
        reanalysed = self.fts_analyzer() != ANALYZER  # the stored stems are the old analyzer's too
        stems: list[tuple[int, str]] = []
        writer = self.fts.writer(heap_size=50_000_000, num_threads=1)
        try:
            writer.delete_all_documents()
            for row_id, text, ts in self.conn.execute("SELECT row_id, text, ts FROM chunks"):
                fts = fts_text(text, ts)
                writer.add_document(tantivy.Document(row_id=row_id, text=fts))
                if reanalysed:
                    stems.append((row_id, turn_stems(fts)))
            writer.commit()
            writer.garbage_collect_files()
            _finish_merges(writer)
            c = self.conn
            with _immediate(c):
                c.execute("DELETE FROM fts_pending_delete")
                if reanalysed:
                    c.execute(STEMS_TABLE)
                    c.execute("DELETE FROM chunk_stems")
                    c.executemany("INSERT INTO chunk_stems (row_id, stems) VALUES (?, ?)", stems)
                c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('fts_analyzer', ?)", (ANALYZER,))
        finally:
            del writer
        self.fts.reload()
        self.publish_vectors(force=True)  # the old snapshot still holds the forgotten rows' vectors
        if journal_mode() == "wal":
            self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def fts_analyzer(self) -> str:
        """How this memory's BM25 index was analysed ("" = plain words, before stemming)."""
        row = self.conn.execute("SELECT value FROM meta WHERE key='fts_analyzer'").fetchone()
        return row[0] if row else ""

    def publish_vectors(self, force: bool = False) -> None:
        """Publish a new int8 snapshot of the committed rows when readers would otherwise catch
        up on too much from SQLite, or always with `force` (memory lock held; after the commit)."""
        if "memory_id" not in self.meta():  # a memory created before snapshots had identities
            with self.lock:
                self.conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('memory_id', ?)", (uuid.uuid4().hex,))
        meta = self.meta()
        snapshot = None if force else open_vector_file(self.path, self.dim)
        # A snapshot written before files held conversation codes, row-major rows or stems is rewritten
        # at the next run; one of a memory analysed by an older analyzer has no stems to hold until a
        # write re-analyses it.
        if (snapshot is not None and snapshot.memory_id == meta["memory_id"] and snapshot.conversation is not None
                and not snapshot.owned_bytes and (snapshot.stem_ids is not None or meta.get("fts_analyzer") != ANALYZER)):
            lag_rows = int(meta["max_row_id"]) - snapshot.max_row_id
            lag_generations = int(meta["generation"]) - snapshot.generation
            with self.lock:
                dead = self.conn.execute("SELECT COUNT(*) FROM tombstones WHERE generation > ?",
                                         (snapshot.generation,)).fetchone()[0]
            if (max(lag_rows, dead) <= max(SNAPSHOT_LAG_ROWS, snapshot.n // 32)
                    and lag_generations < SNAPSHOT_LAG_GENERATIONS):
                return
        with self.lock:
            self.conn.execute(STEMS_TABLE)  # a memory written before the table: the snapshot fills it
            # Stems of rows a release without this table deleted (a rollback, an old pod in a rolling
            # upgrade): never read, but a forgotten text's words on disk. A rewrite reads every row
            # anyway, and a forget always rewrites (rebuild_fts).
            self.conn.execute("DELETE FROM chunk_stems WHERE row_id NOT IN (SELECT row_id FROM chunks)")
            write_vector_file(self.path, self.conn, self.dim)

    def _flush_fts_deletes(self, writer: tantivy.IndexWriter) -> None:
        pending = [r[0] for r in self.conn.execute("SELECT row_id FROM fts_pending_delete")]
        if not pending:
            return
        for row_id in pending:
            writer.delete_documents_by_term("row_id", row_id)
        writer.commit()
        self.conn.executemany("DELETE FROM fts_pending_delete WHERE row_id=?", [(i,) for i in pending])

    def _row_range(self, lo: int, hi: int | None) -> tantivy.Query:
        return tantivy.Query.range_query(self.schema, "row_id", tantivy.FieldType.Integer, lo, hi)


def _finish_merges(writer: tantivy.IndexWriter) -> None:
    """Let the merges tantivy started on commit finish (this consumes the writer). A writer
    dropped at once kills the merges still running: a small run's merges usually ended in
    time, a larger one's never did, so a memory built in batches kept a segment per batch (40k
    conversations: 114, its search 14.6-16.3 ms of CPU against 12.8-13.5 merged), and they
    stayed. BM25 looks each query term up in every segment, and a reader holds ~6 files open
    per segment. In an index run SQLite has committed by then, so readers see the run while
    this waits."""
    writer.wait_merging_threads()
