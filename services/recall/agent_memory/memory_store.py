"""AgentMemory's tables, in the artifacts' one data-access layer: the same database (SQLite or
PostgreSQL), the same transactions, the same `?`-placeholder SQL on both."""

from __future__ import annotations

import json
import time
import unicodedata
import uuid
from typing import Any

from services.recall.agent_memory.models import Citation, MemoryRecord
from services.recall.artifacts.artifact_store import ArtifactStore, Tx, reads_stored_rows
from services.recall.artifacts.models import Target

TABLES = [
    """CREATE TABLE IF NOT EXISTS agent_memory_records (
        record_id TEXT PRIMARY KEY, realm_id TEXT NOT NULL, memory_type TEXT NOT NULL, title TEXT NOT NULL,
        summary TEXT NOT NULL, content TEXT NOT NULL, reality TEXT NOT NULL, valid_from DOUBLE PRECISION,
        valid_until DOUBLE PRECISION, author TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        updated_at DOUBLE PRECISION NOT NULL, status TEXT NOT NULL, search_text TEXT)""",
    "CREATE INDEX IF NOT EXISTS agent_memory_by_realm ON agent_memory_records (realm_id, status, updated_at)",
    """CREATE TABLE IF NOT EXISTS agent_memory_tags (record_id TEXT NOT NULL, tag TEXT NOT NULL,
        PRIMARY KEY (record_id, tag))""",
    "CREATE INDEX IF NOT EXISTS agent_memory_tags_by_tag ON agent_memory_tags (tag)",
    """CREATE TABLE IF NOT EXISTS agent_memory_targets (record_id TEXT NOT NULL, target_kind TEXT NOT NULL,
        target_id TEXT NOT NULL, role TEXT NOT NULL, PRIMARY KEY (record_id, target_kind, target_id, role))""",
    "CREATE INDEX IF NOT EXISTS agent_memory_targets_by_target ON agent_memory_targets (target_kind, target_id)",
    """CREATE TABLE IF NOT EXISTS agent_memory_citations (record_id TEXT NOT NULL, ordinal INTEGER NOT NULL,
        session_id TEXT NOT NULL, turn_uuid TEXT NOT NULL, PRIMARY KEY (record_id, ordinal))""",
    """CREATE TABLE IF NOT EXISTS agent_memory_audit (event_id TEXT PRIMARY KEY, record_id TEXT NOT NULL,
        event TEXT NOT NULL, actor TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, ordinal INTEGER NOT NULL,
        detail TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS agent_memory_audit_by_record ON agent_memory_audit (record_id, ordinal)",
]
def search_text(*parts: str) -> str:
    """What a query word is matched against: normalised and case-folded here, not by the
    database, whose LOWER() leaves Cyrillic (any non-ASCII) as it is on SQLite and under a C
    locale on PostgreSQL — "контракт" never found "Контракт"."""
    return fold("\n".join(parts))


def fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def like_word(word: str) -> str:
    """A LIKE pattern (ESCAPE '\\') matching `word` anywhere, its wildcards taken literally."""
    return "%" + word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def add_search_text(tx: Tx) -> None:
    """Databases made before search_text existed: add it and fill it for the records they hold."""
    if "search_text" in tx.columns("agent_memory_records"):
        return
    tx.q("ALTER TABLE agent_memory_records ADD COLUMN " + ("IF NOT EXISTS " if tx.pg else "") + "search_text TEXT")
    for record_id, title, summary, content in tx.q("SELECT record_id, title, summary, content FROM agent_memory_records"):
        tx.q("UPDATE agent_memory_records SET search_text = ? WHERE record_id = ?", (search_text(title, summary, content), record_id))


def add_provenance(tx: Tx) -> None:
    """Databases made before records carried their source: the two columns, empty for old records."""
    have = tx.columns("agent_memory_records")
    for column in ("source_ref", "source_context"):
        if column not in have:
            tx.q("ALTER TABLE agent_memory_records ADD COLUMN " + ("IF NOT EXISTS " if tx.pg else "") + f"{column} TEXT")


SCHEMA = [*TABLES, add_search_text, add_provenance]
COLUMNS = ("record_id, realm_id, memory_type, title, summary, content, reality, valid_from, valid_until, author,"
           " created_at, updated_at, status, source_ref, source_context")
NAMES = [c.strip() for c in COLUMNS.split(",")]


class MemoryStore:
    def __init__(self, store: ArtifactStore) -> None:
        self.db = store
        store.add_schema(SCHEMA)

    def transaction(self):
        return self.db.transaction()

    # ---- reads ------------------------------------------------------------------------------------
    def get(self, tx: Tx, record_id: str, lock: bool = False) -> MemoryRecord | None:
        """`lock`: hold the row until the transaction ends (PostgreSQL; SQLite's transactions
        already write one at a time), so a change checks the state it will write over."""
        rows = tx.q(f"SELECT {COLUMNS} FROM agent_memory_records WHERE record_id = ?"
                    + (" FOR UPDATE" if lock and self.db.pg else ""), (record_id,))
        return self._hydrate(tx, rows)[0] if rows else None

    def search(self, tx: Tx, realm_id: str, *, memory_type: str | None, reality: str | None, tag: str | None,
               target_kind: str | None, target_id: str | None, query: str | None, valid_at: float | None,
               limit: int, offset: int = 0) -> list[MemoryRecord]:
        sql = f"SELECT {COLUMNS} FROM agent_memory_records r WHERE realm_id = ? AND status = 'active'"
        params: list[Any] = [realm_id]
        for column, value in (("memory_type", memory_type), ("reality", reality)):
            if value:
                sql += f" AND {column} = ?"
                params.append(value)
        if tag:
            sql += " AND EXISTS (SELECT 1 FROM agent_memory_tags g WHERE g.record_id = r.record_id AND g.tag = ?)"
            params.append(tag)
        if target_kind or target_id:
            sql += " AND EXISTS (SELECT 1 FROM agent_memory_targets t WHERE t.record_id = r.record_id"
            for column, value in (("target_kind", target_kind), ("target_id", target_id)):
                if value:
                    sql += f" AND t.{column} = ?"
                    params.append(value)
            sql += ")"
        if valid_at is not None:
            sql += " AND (valid_from IS NULL OR valid_from <= ?) AND (valid_until IS NULL OR valid_until > ?)"
            params += [valid_at, valid_at]
        for word in fold(query or "").split()[:8]:
            sql += " AND search_text LIKE ? ESCAPE '\\'"
            params.append(like_word(word))
        sql += " ORDER BY updated_at DESC, record_id LIMIT ? OFFSET ?"  # the id: pages that never overlap
        params += [limit, offset]
        return self._hydrate(tx, tx.q(sql, tuple(params)))

    def audit(self, tx: Tx, record_id: str, limit: int, offset: int = 0) -> list[dict[str, Any]]:
        """A page of the record's audit trail, oldest first."""
        rows = tx.q("SELECT event, actor, at, detail FROM agent_memory_audit WHERE record_id = ? ORDER BY ordinal"
                    " LIMIT ? OFFSET ?", (record_id, limit, offset))
        return [{"event": r[0], "actor": r[1], "at": r[2], "detail": json.loads(r[3])} for r in rows]

    @reads_stored_rows("agent_memory_records")
    def _hydrate(self, tx: Tx, rows: list[tuple]) -> list[MemoryRecord]:
        """Records with their tags, targets and citations: four queries, whatever the number of rows."""
        if not rows:
            return []
        ids = tuple(r[0] for r in rows)
        marks = ",".join("?" * len(ids))
        tags: dict[str, list[str]] = {i: [] for i in ids}
        for rid, tag in tx.q(f"SELECT record_id, tag FROM agent_memory_tags WHERE record_id IN ({marks}) ORDER BY tag", ids):
            tags[rid].append(tag)
        targets: dict[str, list[Target]] = {i: [] for i in ids}
        for rid, kind, tid, role in tx.q("SELECT record_id, target_kind, target_id, role FROM agent_memory_targets"
                                         f" WHERE record_id IN ({marks}) ORDER BY role, target_kind, target_id", ids):
            targets[rid].append(Target(target_kind=kind, target_id=tid, role=role))
        cites: dict[str, list[Citation]] = {i: [] for i in ids}
        for rid, sid, turn in tx.q("SELECT record_id, session_id, turn_uuid FROM agent_memory_citations"
                                   f" WHERE record_id IN ({marks}) ORDER BY ordinal", ids):
            cites[rid].append(Citation(session_id=sid, turn_uuid=turn))
        return [MemoryRecord.model_validate({**dict(zip(NAMES, r)), "source_context": json.loads(r[-1] or "{}"),
                                             "tags": tags[r[0]], "targets": targets[r[0]], "citations": cites[r[0]]})
                for r in rows]

    # ---- writes -----------------------------------------------------------------------------------
    def insert(self, tx: Tx, r: MemoryRecord) -> None:
        tx.q(f"INSERT INTO agent_memory_records ({COLUMNS}, search_text) VALUES ({','.join('?' * (len(NAMES) + 1))})",
             (r.record_id, r.realm_id, r.memory_type, r.title, r.summary, r.content, r.reality, r.valid_from,
              r.valid_until, r.author, r.created_at, r.updated_at, r.status, r.source_ref, json.dumps(r.source_context),
              search_text(r.title, r.summary, r.content)))
        self.replace_links(tx, r.record_id, tags=r.tags, targets=r.targets, citations=r.citations)

    def update_fields(self, tx: Tx, record_id: str, **fields: Any) -> None:
        if "source_context" in fields:
            fields["source_context"] = json.dumps(fields["source_context"])
        fields["updated_at"] = time.time()
        sets = ", ".join(f"{k} = ?" for k in fields)
        tx.q(f"UPDATE agent_memory_records SET {sets} WHERE record_id = ?", (*fields.values(), record_id))
        if {"title", "summary", "content"} & fields.keys():
            title, summary, content = tx.q("SELECT title, summary, content FROM agent_memory_records WHERE record_id = ?",
                                           (record_id,))[0]
            tx.q("UPDATE agent_memory_records SET search_text = ? WHERE record_id = ?",
                 (search_text(title, summary, content), record_id))

    def replace_links(self, tx: Tx, record_id: str, tags: list[str] | None = None, targets: list[Target] | None = None,
                      citations: list[Citation] | None = None) -> None:
        if tags is not None:
            tx.q("DELETE FROM agent_memory_tags WHERE record_id = ?", (record_id,))
            for tag in sorted(set(tags)):
                tx.q("INSERT INTO agent_memory_tags (record_id, tag) VALUES (?, ?)", (record_id, tag))
        if targets is not None:
            tx.q("DELETE FROM agent_memory_targets WHERE record_id = ?", (record_id,))
            for t in sorted({(t.target_kind.value, t.target_id, t.role.value) for t in targets}):
                tx.q("INSERT INTO agent_memory_targets (record_id, target_kind, target_id, role) VALUES (?, ?, ?, ?)",
                     (record_id, *t))
        if citations is not None:
            tx.q("DELETE FROM agent_memory_citations WHERE record_id = ?", (record_id,))
            for i, c in enumerate(citations):
                tx.q("INSERT INTO agent_memory_citations (record_id, ordinal, session_id, turn_uuid) VALUES (?, ?, ?, ?)",
                     (record_id, i, c.session_id, c.turn_uuid))

    def record(self, tx: Tx, record_id: str, event: str, actor: str, **detail: Any) -> None:
        ordinal = tx.q("SELECT COALESCE(MAX(ordinal), 0) + 1 FROM agent_memory_audit WHERE record_id = ?", (record_id,))[0][0]
        tx.q("INSERT INTO agent_memory_audit (event_id, record_id, event, actor, at, ordinal, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
             (uuid.uuid4().hex, record_id, event, actor, time.time(), ordinal, json.dumps(detail)))
