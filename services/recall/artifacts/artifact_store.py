"""The one data-access layer for artifacts: SQLite (a file, the default) or PostgreSQL (several
recall replicas), chosen by RECALL_ARTIFACTS_DB_URL. The same SQL runs on both; the rule
"never two accepted versions of one path" is the database's own partial unique index, so it
holds under any concurrency, whatever the application does.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import wraps
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from pydantic import ValidationError

from shared.engine.store import journal_mode
from services.recall.artifacts.models import Artifact, AuditEvent, Entry, Status, Target

F = TypeVar("F", bound=Callable[..., Any])


class DamagedRow(RuntimeError):
    """A stored row the models refuse (a hand edit, a botched migration or restore, a writer of
    another version): the server's fault, never the caller's. Without this its pydantic error
    was answered as the caller's invalid input (422, an "invalid …" tool error); now it is an
    unexpected error, counted and logged with an incident id. The message names the table and
    the fields, never a stored value."""


def reads_stored_rows(table: str) -> Callable[[F], F]:
    def wrap(fn: F) -> F:
        @wraps(fn)
        def reading(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ValidationError as exc:
                fields = sorted({".".join(str(p) for p in e["loc"]) for e in exc.errors(include_url=False)})
                raise DamagedRow(f"a stored row of {table} fails validation at {', '.join(fields)}") from None
        return reading  # type: ignore[return-value]
    return wrap


def add_target_order(tx: "Tx") -> None:
    """Databases made before targets kept the order they were written in: the column, 0 for the
    targets they hold (shown in their former order, by role, kind and id)."""
    if "written_order" not in tx.columns("artifact_targets"):
        tx.q("ALTER TABLE artifact_targets ADD COLUMN " + ("IF NOT EXISTS " if tx.pg else "")
             + "written_order INTEGER NOT NULL DEFAULT 0")


SCHEMA = [
    """CREATE TABLE IF NOT EXISTS realm_entities (
        realm_id TEXT NOT NULL, entity_id TEXT NOT NULL, title TEXT NOT NULL, entity_kind TEXT NOT NULL,
        created_by TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (realm_id, entity_id))""",
    """CREATE TABLE IF NOT EXISTS artifacts (
        artifact_id TEXT PRIMARY KEY, realm_id TEXT NOT NULL, artifact_path TEXT NOT NULL,
        artifact_kind TEXT NOT NULL, write_mode TEXT NOT NULL, status TEXT NOT NULL, body TEXT NOT NULL,
        summary TEXT NOT NULL, source_ref TEXT NOT NULL, source_context TEXT NOT NULL, author TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL,
        supersedes_artifact_id TEXT, superseded_by_artifact_id TEXT, revoked_reason TEXT)""",
    # The rule itself: at most one accepted version per (realm, path).
    """CREATE UNIQUE INDEX IF NOT EXISTS artifacts_one_accepted_per_path
        ON artifacts (realm_id, artifact_path) WHERE status = 'accepted'""",
    "CREATE INDEX IF NOT EXISTS artifacts_by_path ON artifacts (realm_id, artifact_path, author)",
    """CREATE TABLE IF NOT EXISTS artifact_targets (
        artifact_id TEXT NOT NULL, target_kind TEXT NOT NULL, target_id TEXT NOT NULL, role TEXT NOT NULL,
        PRIMARY KEY (artifact_id, target_kind, target_id, role))""",
    "CREATE INDEX IF NOT EXISTS artifact_targets_by_target ON artifact_targets (target_kind, target_id)",
    """CREATE TABLE IF NOT EXISTS artifact_entries (
        artifact_id TEXT NOT NULL, seq INTEGER NOT NULL, body TEXT NOT NULL, author TEXT NOT NULL,
        created_at DOUBLE PRECISION NOT NULL, source_ref TEXT NOT NULL, source_context TEXT NOT NULL,
        PRIMARY KEY (artifact_id, seq))""",
    """CREATE TABLE IF NOT EXISTS artifact_audit (
        event_id TEXT PRIMARY KEY, artifact_id TEXT NOT NULL, event TEXT NOT NULL, actor TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL, ordinal INTEGER NOT NULL, detail TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS artifact_audit_by_artifact ON artifact_audit (artifact_id, ordinal)",
    # Changes search has yet to see, written in the change's own transaction and removed once the
    # realm's index has them: a process killed between the two leaves its row, and the realm's
    # next refresh (any write, or a search: ArtifactService.catch_up) takes it along.
    """CREATE TABLE IF NOT EXISTS artifact_index_outbox (
        change_id TEXT PRIMARY KEY, realm_id TEXT NOT NULL, artifact_id TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS artifact_index_outbox_by_realm ON artifact_index_outbox (realm_id, at)",
    add_target_order,
]
SQLITE_BUSY_S = 30  # how long a SQLite transaction waits for another's write lock
CONNECT_TIMEOUT_S = 5  # an unreachable server is a quick "unavailable", not a request hanging for minutes
# A server that vanishes mid-connection (network partition, host lost) without closing it: the
# kernel gives the connection up after unacknowledged data for this long, or after 3 missed
# keepalives on an idle one, instead of TCP's ~15 minutes, each held by one of the realm's threads.
TCP_USER_TIMEOUT_MS = 20_000
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
COLUMNS = ("artifact_id, realm_id, artifact_path, artifact_kind, write_mode, status, body, summary, source_ref,"
           " source_context, author, created_at, updated_at, supersedes_artifact_id, superseded_by_artifact_id, revoked_reason")


# Which of an artifact's entries a read brings: (offset, limit) in their order (the search index
# reads a journal a file's worth at a time, never whole).
Window = tuple[int, int]
NO_ENTRIES: Window = (0, 0)  # a compact listing: the count only
ENTRIES_PAGE = 20  # entries a read shows unless asked for another page
FIRST_PAGE: Window = (0, ENTRIES_PAGE)


def stored_json(value: Any) -> str:
    """A `source_context` as stored: the UTF-8 JSON its size limit is checked on (text_limits.py),
    not ASCII escapes, which made a parrot 12 bytes instead of 4."""
    return json.dumps(value, ensure_ascii=False)


class Head(NamedTuple):
    """An accepted artifact as a listing names it (its body only when asked for, else "")."""
    artifact_id: str
    summary: str
    body: str


class Conflict(Exception):
    """The database refused a write that would break a uniqueness rule (the caller may retry)."""


class StoreUnavailable(Exception):
    """The database cannot be reached (stopped, restarting, network): nothing was written; retry later."""


class Tx:
    """One transaction: `q` runs a statement written with `?` placeholders on either database."""

    def __init__(self, cursor: Any, pg: bool) -> None:
        self.cursor = cursor
        self.pg = pg

    def q(self, sql: str, params: tuple = ()) -> list[tuple]:
        self.cursor.execute(sql.replace("?", "%s") if self.pg else sql, params)
        return self.cursor.fetchall() if self.cursor.description else []

    def columns(self, table: str) -> set[str]:
        """The table's column names (for migrations of older databases)."""
        self.cursor.execute(f"SELECT * FROM {table} WHERE 1 = 0")
        names = {d[0] for d in self.cursor.description}
        self.cursor.fetchall()
        return names


class ArtifactStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self.pg = url.startswith(("postgresql://", "postgres://"))
        if not self.pg and not url.startswith("sqlite:///"):
            raise ValueError("RECALL_ARTIFACTS_DB_URL must be sqlite:///<path> or postgresql://…")
        self._local = threading.local()
        self.sqlite_busy_s = SQLITE_BUSY_S
        # Tables are made by the first transaction, not here: a replica starting while
        # PostgreSQL is down still serves conversation recall, and its realm surface comes up
        # with the database.
        self._schema: list[str | Callable[[Tx], None]] = list(SCHEMA)
        self._schema_ready = False
        self._schema_lock = threading.Lock()
        self._opened: list[Any] = []  # every thread's connection, for close()
        self._opened_lock = threading.Lock()  # not the schema lock: check() opens a connection holding it

    def add_schema(self, statements: list[str | Callable[[Tx], None]]) -> None:
        """More tables of this database (AgentMemory's), made with the others; a callable is a
        migration of an older database, run in the same transaction."""
        self._schema += statements
        self._schema_ready = False

    def check(self) -> None:
        """Make the tables now (at start, so a mistake shows at once); StoreUnavailable if the
        database cannot be reached."""
        if self._schema_ready:
            return
        with self._schema_lock:
            if not self._schema_ready:
                with self._transaction() as tx:
                    for stmt in self._schema:
                        stmt(tx) if callable(stmt) else tx.q(stmt)
                self._schema_ready = True

    # ---- connections and transactions ----------------------------------------------------------
    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is not None and conn in self._opened and not (self.pg and conn.closed):
            return conn
        if self.pg:
            import psycopg

            try:
                conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                       tcp_user_timeout=TCP_USER_TIMEOUT_MS, **KEEPALIVES)
            except psycopg.OperationalError as exc:
                raise StoreUnavailable(str(exc)) from exc
        else:
            path = Path(self.url.removeprefix("sqlite:///"))
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(path, timeout=self.sqlite_busy_s, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA journal_mode={journal_mode()}")  # RECALL_SQLITE_JOURNAL_MODE, as the engine
            conn.execute("PRAGMA foreign_keys=ON")
        self._local.conn = conn
        with self._opened_lock:
            self._opened.append(conn)
        return conn

    def close(self) -> None:
        """Close every thread's connection (the service is stopping): SQLite then checkpoints
        its WAL and removes it, and PostgreSQL sees a clean disconnect. A later call reconnects."""
        with self._opened_lock:
            opened, self._opened = self._opened, []
        for conn in opened:
            with suppress(Exception):
                conn.close()

    @contextmanager
    def transaction(self) -> Iterator[Tx]:
        """Serialisable enough for our rules: SQLite takes the write lock up front (IMMEDIATE);
        PostgreSQL relies on the unique index and row locks (SELECT … FOR UPDATE).
        StoreUnavailable when PostgreSQL cannot be reached (the next transaction reconnects)."""
        self.check()
        with self._transaction() as tx:
            yield tx

    @contextmanager
    def _transaction(self) -> Iterator[Tx]:
        conn, cur = self._begin()
        try:
            yield Tx(cur, self.pg)
            cur.execute("COMMIT")
        except BaseException as exc:
            if self.pg and conn.closed:
                # The server went away mid-transaction (rolled back, unless a COMMIT landed before
                # the answer was lost); this thread's connection is dead, the next one reconnects.
                self._local.conn = None
                if isinstance(exc, self._db_error()):
                    raise StoreUnavailable(str(exc)) from exc
                raise
            cur.execute("ROLLBACK")
            if isinstance(exc, self._unique_violation()):
                raise Conflict(str(exc)) from exc
            raise
        finally:
            cur.close()

    def _begin(self) -> tuple[Any, Any]:
        """A connection and a cursor inside a new transaction. A PostgreSQL connection the server
        dropped while it sat idle (a restart) shows it only at this first statement, when nothing
        has run yet: it is replaced once, so a restart costs no request an error."""
        conn = self._connection()
        try:
            return conn, self._begun(conn)
        except StoreUnavailable:
            conn = self._connection()
            return conn, self._begun(conn)

    def _begun(self, conn: Any) -> Any:
        cur = conn.cursor()
        try:
            cur.execute("BEGIN" if self.pg else "BEGIN IMMEDIATE")
        except self._db_error() as exc:
            if self.pg and conn.closed:
                self._local.conn = None
                raise StoreUnavailable(str(exc)) from exc
            if not self.pg and "locked" in str(exc):
                # Another process (`recall memory`, a backup, a second replica on this host) held
                # the file's write lock for all of sqlite_busy_s: "retry later", not an unnamed error.
                raise StoreUnavailable(str(exc)) from exc
            raise
        return cur

    def _db_error(self) -> type[Exception]:
        if self.pg:
            import psycopg

            return psycopg.Error
        return sqlite3.Error

    def _unique_violation(self) -> type[Exception]:
        if self.pg:
            import psycopg

            return psycopg.errors.UniqueViolation
        return sqlite3.IntegrityError

    # ---- reads ------------------------------------------------------------------------------------
    def get(self, tx: Tx, artifact_id: str, lock: bool = False, entries: Window = FIRST_PAGE) -> Artifact | None:
        rows = tx.q(f"SELECT {COLUMNS} FROM artifacts WHERE artifact_id = ?" + (" FOR UPDATE" if lock and self.pg else ""),
                    (artifact_id,))
        return self._hydrate(tx, rows[0], entries) if rows else None

    def accepted_at_path(self, tx: Tx, realm_id: str, path: str, lock: bool = False,
                         entries: Window = FIRST_PAGE) -> Artifact | None:
        rows = tx.q(f"SELECT {COLUMNS} FROM artifacts WHERE realm_id = ? AND artifact_path = ? AND status = 'accepted'"
                    + (" FOR UPDATE" if lock and self.pg else ""), (realm_id, path))
        return self._hydrate(tx, rows[0], entries) if rows else None

    def accepted_heads(self, tx: Tx, realm_id: str, paths: list[str], with_body: bool = False) -> dict[str, Head]:
        """The accepted artifact at each of these paths that has one, from the artifacts table alone:
        no targets, no entry counts, no journal pages (a listing that names artifacts needs none)."""
        unique = list(dict.fromkeys(paths))
        if not unique:
            return {}
        body = "body" if with_body else "''"
        rows = tx.q(f"SELECT artifact_path, artifact_id, summary, {body} FROM artifacts"
                    f" WHERE realm_id = ? AND status = 'accepted' AND artifact_path IN ({','.join('?' * len(unique))})",
                    (realm_id, *unique))
        return {r[0]: Head(artifact_id=r[1], summary=r[2], body=r[3]) for r in rows}

    def own_open_draft(self, tx: Tx, realm_id: str, path: str, author: str, entries: Window = FIRST_PAGE) -> Artifact | None:
        rows = tx.q(f"SELECT {COLUMNS} FROM artifacts WHERE realm_id = ? AND artifact_path = ? AND author = ?"
                    " AND status IN ('draft', 'proposed') ORDER BY updated_at DESC LIMIT 1", (realm_id, path, author))
        return self._hydrate(tx, rows[0], entries) if rows else None

    def lock_author_at_path(self, tx: Tx, realm_id: str, path: str, author: str) -> None:
        """One draft creation at a time per realm, path and author, until the transaction ends, so
        two at once cannot both find no draft there. SQLite's BEGIN IMMEDIATE serialises writers
        already; PostgreSQL takes a transaction-scoped advisory lock on their hash."""
        if self.pg:
            tx.q("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", (f"{realm_id}\n{path}\n{author}",))

    def own_drafts(self, tx: Tx, realm_id: str, path: str, author: str) -> list[str]:
        """Ids of the author's drafts (not proposals) at a path, newest first."""
        return [r[0] for r in tx.q("SELECT artifact_id FROM artifacts WHERE realm_id = ? AND artifact_path = ? AND author = ?"
                                   " AND status = 'draft' ORDER BY updated_at DESC", (realm_id, path, author))]

    def proposals_at(self, tx: Tx, realm_id: str, path: str) -> list[tuple[str, str | None]]:
        """(artifact_id, supersedes_artifact_id) of every proposal waiting at a path."""
        return [(r[0], r[1]) for r in tx.q("SELECT artifact_id, supersedes_artifact_id FROM artifacts WHERE realm_id = ?"
                                           " AND artifact_path = ? AND status = 'proposed' ORDER BY artifact_id"
                                           + (" FOR UPDATE" if self.pg else ""), (realm_id, path))]

    def listed(self, tx: Tx, realm_id: str, artifact_ids: list[str] | None = None, target_kind: str | None = None,
               target_id: str | None = None, kind: str | None = None, limit: int = 50,
               status: str = "accepted", offset: int = 0, entries: Window = NO_ENTRIES) -> list[Artifact]:
        """Artifacts in one status (never pass "draft" for someone else: drafts are private), newest
        first; with their entry counts, and a window of their entries only when asked."""
        if artifact_ids is not None and not artifact_ids:
            return []
        sql, params = self._where(realm_id, target_kind, target_id, kind, status)
        if artifact_ids is not None:
            sql += f" AND artifact_id IN ({','.join('?' * len(artifact_ids))})"
            params += artifact_ids
        sql += " ORDER BY updated_at DESC, artifact_id LIMIT ? OFFSET ?"  # the id: pages that never overlap
        params += [limit, offset]
        return self._hydrate_many(tx, tx.q(f"SELECT {COLUMNS} FROM artifacts a WHERE " + sql, tuple(params)), entries)

    def by_ids(self, tx: Tx, artifact_ids: list[str], entries: Window = FIRST_PAGE) -> list[Artifact]:
        """These artifacts (those that exist), in any status and order."""
        if not artifact_ids:
            return []
        rows = tx.q(f"SELECT {COLUMNS} FROM artifacts WHERE artifact_id IN ({','.join('?' * len(artifact_ids))})",
                    tuple(artifact_ids))
        return self._hydrate_many(tx, rows, entries)

    def accepted_page(self, tx: Tx, realm_id: str, after_id: str, limit: int) -> list[Artifact]:
        """The realm's accepted artifacts with ids after `after_id`, in id order, with their entry
        counts: a page of what its search index holds (keyset pages: none skipped or repeated
        when artifacts change between two pages)."""
        rows = tx.q(f"SELECT {COLUMNS} FROM artifacts WHERE realm_id = ? AND status = 'accepted' AND artifact_id > ?"
                    " ORDER BY artifact_id LIMIT ?", (realm_id, after_id, limit))
        return self._hydrate_many(tx, rows, NO_ENTRIES)

    def accepted_among(self, tx: Tx, realm_id: str, artifact_ids: list[str], target_kind: str | None,
                       target_id: str | None, kind: str | None) -> set[str]:
        """Which of these ids are accepted artifacts the filters let through (nothing else is read)."""
        if not artifact_ids:
            return set()
        sql, params = self._where(realm_id, target_kind, target_id, kind, "accepted")
        sql += f" AND artifact_id IN ({','.join('?' * len(artifact_ids))})"
        return {r[0] for r in tx.q("SELECT artifact_id FROM artifacts a WHERE " + sql, tuple(params + artifact_ids))}

    @staticmethod
    def _where(realm_id: str, target_kind: str | None, target_id: str | None, kind: str | None,
               status: str) -> tuple[str, list[Any]]:
        sql = "realm_id = ? AND status = ?"
        params: list[Any] = [realm_id, status]
        if kind:
            sql += " AND artifact_kind = ?"
            params.append(kind)
        if target_kind or target_id:
            sql += " AND EXISTS (SELECT 1 FROM artifact_targets t WHERE t.artifact_id = a.artifact_id"
            if target_kind:
                sql += " AND t.target_kind = ?"
                params.append(target_kind)
            if target_id:
                sql += " AND t.target_id = ?"
                params.append(target_id)
            sql += ")"
        return sql, params

    def entity_kind(self, tx: Tx, realm_id: str, entity_id: str) -> str | None:
        rows = tx.q("SELECT entity_kind FROM realm_entities WHERE realm_id = ? AND entity_id = ?", (realm_id, entity_id))
        return rows[0][0] if rows else None

    def entity_exists(self, tx: Tx, realm_id: str, entity_id: str, entity_kind: str | None = None) -> bool:
        sql = "SELECT 1 FROM realm_entities WHERE realm_id = ? AND entity_id = ?"
        if entity_kind is None:
            return bool(tx.q(sql, (realm_id, entity_id)))
        return bool(tx.q(sql + " AND entity_kind = ?", (realm_id, entity_id, entity_kind)))

    @reads_stored_rows("artifact_audit")
    def audit(self, tx: Tx, artifact_id: str, limit: int, offset: int = 0) -> list[AuditEvent]:
        """A page of the artifact's audit trail, oldest first."""
        rows = tx.q("SELECT artifact_id, event, actor, at, detail FROM artifact_audit WHERE artifact_id = ?"
                    " ORDER BY ordinal LIMIT ? OFFSET ?", (artifact_id, limit, offset))
        return [AuditEvent(artifact_id=r[0], event=r[1], actor=r[2], at=r[3], detail=json.loads(r[4])) for r in rows]

    def _hydrate(self, tx: Tx, row: tuple, entries: Window) -> Artifact:
        return self._hydrate_many(tx, [row], entries)[0]

    @reads_stored_rows("artifacts")
    def _hydrate_many(self, tx: Tx, rows: list[tuple], window: Window) -> list[Artifact]:
        """Artifacts with their targets, entry counts and the `window` of their entries (none for
        NO_ENTRIES): a query each, whatever the number of rows, plus one per artifact for a page of
        its entries."""
        if not rows:
            return []
        names = [c.strip() for c in COLUMNS.split(",")]
        ids = [r[0] for r in rows]
        marks = ",".join("?" * len(ids))
        targets: dict[str, list[Target]] = {i: [] for i in ids}
        for aid, kind, tid, role in tx.q("SELECT artifact_id, target_kind, target_id, role FROM artifact_targets"
                                         f" WHERE artifact_id IN ({marks}) ORDER BY written_order, role, target_kind, target_id",
                                         tuple(ids)):
            targets[aid].append(Target(target_kind=kind, target_id=tid, role=role))
        totals = dict.fromkeys(ids, 0)
        for aid, count in tx.q(f"SELECT artifact_id, COUNT(*) FROM artifact_entries WHERE artifact_id IN ({marks})"
                               " GROUP BY artifact_id", tuple(ids)):
            totals[aid] = int(count)
        entries: dict[str, list[Entry]] = {i: [] for i in ids}
        select = "SELECT artifact_id, seq, body, author, created_at, source_ref, source_context FROM artifact_entries"
        offset, limit = window
        found = [row for aid in ids if limit and totals[aid] > offset
                 for row in tx.q(f"{select} WHERE artifact_id = ? ORDER BY seq LIMIT ? OFFSET ?", (aid, limit, offset))]
        for aid, seq, body, author, created, ref, ctx in found:
            entries[aid].append(Entry(seq=seq, body=body, author=author, created_at=created, source_ref=ref,
                                      source_context=json.loads(ctx)))
        out = []
        for row in rows:
            data = dict(zip(names, row))
            data["source_context"] = json.loads(data["source_context"])
            aid = row[0]
            shown_to = offset + len(entries[aid])
            out.append(Artifact.model_validate({
                **data, "targets": targets[aid], "entries": entries[aid], "entries_total": totals[aid],
                "entries_next_offset": shown_to if limit and shown_to < totals[aid] else None}))
        return out

    # ---- writes -----------------------------------------------------------------------------------
    def insert(self, tx: Tx, a: Artifact) -> None:
        tx.q(f"INSERT INTO artifacts ({COLUMNS}) VALUES ({','.join('?' * 16)})",
             (a.artifact_id, a.realm_id, a.artifact_path, a.artifact_kind, a.write_mode, a.status.value, a.body, a.summary,
              a.source_ref, stored_json(a.source_context), a.author, a.created_at, a.updated_at, a.supersedes_artifact_id,
              a.superseded_by_artifact_id, a.revoked_reason))
        self.replace_targets(tx, a.artifact_id, a.targets)

    def replace_targets(self, tx: Tx, artifact_id: str, targets: list[Target]) -> None:
        tx.q("DELETE FROM artifact_targets WHERE artifact_id = ?", (artifact_id,))
        # In the order written (an agent lists the primary target first, or the evidence): repeats once.
        for order, t in enumerate(dict.fromkeys((t.target_kind.value, t.target_id, t.role.value) for t in targets)):
            tx.q("INSERT INTO artifact_targets (artifact_id, target_kind, target_id, role, written_order) VALUES (?, ?, ?, ?, ?)",
                 (artifact_id, *t, order))

    def update_fields(self, tx: Tx, artifact_id: str, **fields: Any) -> None:
        fields["updated_at"] = time.time()
        if "source_context" in fields:
            fields["source_context"] = stored_json(fields["source_context"])
        if "status" in fields and isinstance(fields["status"], Status):
            fields["status"] = fields["status"].value
        sets = ", ".join(f"{k} = ?" for k in fields)
        tx.q(f"UPDATE artifacts SET {sets} WHERE artifact_id = ?", (*fields.values(), artifact_id))

    def add_entry(self, tx: Tx, artifact_id: str, body: str, author: str, source_ref: str, source_context: dict) -> int:
        seq = tx.q("SELECT COALESCE(MAX(seq), 0) + 1 FROM artifact_entries WHERE artifact_id = ?", (artifact_id,))[0][0]
        tx.q("INSERT INTO artifact_entries (artifact_id, seq, body, author, created_at, source_ref, source_context)"
             " VALUES (?, ?, ?, ?, ?, ?, ?)", (artifact_id, seq, body, author, time.time(), source_ref, stored_json(source_context)))
        self.update_fields(tx, artifact_id)
        return int(seq)

    def mark_for_index(self, tx: Tx, realm_id: str, artifact_ids: list[str]) -> None:
        """In the transaction of a change search must see: the outbox row that outlives a crash
        before the index refresh."""
        for artifact_id in artifact_ids:
            tx.q("INSERT INTO artifact_index_outbox (change_id, realm_id, artifact_id, at) VALUES (?, ?, ?, ?)",
                 (uuid.uuid4().hex, realm_id, artifact_id, time.time()))

    def index_outbox(self, tx: Tx, realm_id: str) -> list[tuple[str, str]]:
        """(change_id, artifact_id) of every change of the realm its index has yet to take."""
        return [(r[0], r[1]) for r in tx.q("SELECT change_id, artifact_id FROM artifact_index_outbox WHERE realm_id = ?"
                                           " ORDER BY at", (realm_id,))]

    def oldest_unindexed(self, tx: Tx, realm_id: str) -> float | None:
        """When the realm's oldest change not yet in its index was committed (None: none is)."""
        return tx.q("SELECT MIN(at) FROM artifact_index_outbox WHERE realm_id = ?", (realm_id,))[0][0]

    def realms_behind(self, tx: Tx, limit: int) -> list[str]:
        """Realms with changes their index has yet to take, oldest change first (at most `limit`)."""
        return [r[0] for r in tx.q("SELECT realm_id FROM artifact_index_outbox GROUP BY realm_id ORDER BY MIN(at) LIMIT ?",
                                   (limit,))]

    def indexed(self, tx: Tx, change_ids: list[str]) -> None:
        for change_id in change_ids:
            tx.q("DELETE FROM artifact_index_outbox WHERE change_id = ?", (change_id,))

    def record(self, tx: Tx, artifact_id: str, event: str, actor: str, **detail: Any) -> None:
        ordinal = tx.q("SELECT COALESCE(MAX(ordinal), 0) + 1 FROM artifact_audit WHERE artifact_id = ?", (artifact_id,))[0][0]
        tx.q("INSERT INTO artifact_audit (event_id, artifact_id, event, actor, at, ordinal, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
             (uuid.uuid4().hex, artifact_id, event, actor, time.time(), ordinal, json.dumps(detail)))

    def register_entity(self, tx: Tx, realm_id: str, entity_id: str, title: str, entity_kind: str, actor: str) -> bool:
        """True when this call registered it; two agents registering one object at once both succeed
        (a check, then an insert, let the slower one hit the primary key: an unnamed error)."""
        return bool(tx.q("INSERT INTO realm_entities (realm_id, entity_id, title, entity_kind, created_by, created_at)"
                         " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (realm_id, entity_id) DO NOTHING RETURNING 1",
                         (realm_id, entity_id, title, entity_kind, actor, time.time())))
