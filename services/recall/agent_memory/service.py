"""AgentMemory operations. People (owners, members) create records; a record's author updates
it, its author or a realm owner retires it; every realm role searches and reads them. Each
operation is one transaction; each change is audited."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from services.recall.agent_memory.citations import check_citations, show_citations
from services.recall.agent_memory.memory_store import MemoryStore
from services.recall.agent_memory.models import MemoryRecord, RecordFields, RecordInput, epoch
from services.recall.artifacts import rules
from services.recall.artifacts.models import RECORD_ID_MAX, Role, rfc3339, target_set
from services.recall.artifacts.rules import RuleBroken, shown
from services.recall.artifacts.text_limits import check_json, check_text
from services.recall.artifacts.service import AUDIT_PAGE, MAX_TRAIL_OFFSET, ArtifactService, Caller, check_page

MAX_REASON_CHARS = 1000  # as an artifact's revocation reason
CHANGEABLE = ("memory_type", "title", "summary", "content", "reality", "valid_from", "valid_until", "source_ref",
              "source_context")


class AgentMemoryService:
    def __init__(self, store: MemoryStore, artifacts: ArtifactService, data_dir: Path) -> None:
        self.store = store
        self.artifacts = artifacts  # for target validation: the same rules as for artifacts
        self.data_dir = data_dir

    # ---- writes (people) ----------------------------------------------------------------------------
    def create(self, caller: Caller, realm_id: str, data: RecordInput) -> dict[str, Any]:
        rules.check_can_write(rules.role_in(caller.realms, realm_id), realm_id)
        check_text("content", data.content, self.artifacts.max_text_bytes)
        check_json("source_context", data.source_context, self.artifacts.max_text_bytes)
        check_citations(self.data_dir, caller.principal, data.citations or [])
        now = time.time()
        record = MemoryRecord(record_id=uuid.uuid4().hex, realm_id=realm_id, memory_type=data.memory_type,
                              title=data.title, summary=data.summary, content=data.content, reality=data.reality,
                              tags=sorted(set(data.tags or [])), valid_from=epoch(data.valid_from),
                              valid_until=epoch(data.valid_until), author=caller.principal, created_at=now,
                              updated_at=now, status="active", targets=data.targets, citations=data.citations or [],
                              source_ref=data.source_ref, source_context=data.source_context or {})
        with self.store.transaction() as tx:
            self._check_person(tx, caller, realm_id)
            self.artifacts.check_targets(tx, caller, realm_id, record.targets)
            self.store.insert(tx, record)
            self.store.record(tx, record.record_id, "created", caller.principal, memory_type=record.memory_type)
            stored = self.store.get(tx, record.record_id)
        return self._show(caller, stored)

    def update(self, caller: Caller, realm_id: str, record_id: str, patch: RecordFields) -> dict[str, Any]:
        rules.check_can_write(rules.role_in(caller.realms, realm_id), realm_id)
        changes = patch.model_dump(exclude_unset=True)
        if not changes:
            raise RuleBroken("fields", "nothing to change")
        check_text("content", patch.content, self.artifacts.max_text_bytes)
        check_json("source_context", patch.source_context, self.artifacts.max_text_bytes)
        if patch.citations is not None:  # reading conversations, before the transaction holds the record
            check_citations(self.data_dir, caller.principal, patch.citations)
        with self.store.transaction() as tx:
            self._check_person(tx, caller, realm_id)
            record = self._load(tx, realm_id, record_id, lock=True)
            if record.status != "active":
                raise RuleBroken("lifecycle", "a retired record is not changed")
            if record.author != caller.principal:
                # A record shows its author and the author's cited passages beside its text: another
                # person's words there would pass as the author's, vouched for by their evidence.
                raise RuleBroken("record_author", f"only the record's author ({record.author}) changes it; "
                                 "write your own record, or ask a realm owner to retire this one")
            if patch.targets is not None:
                self.artifacts.check_targets(tx, caller, realm_id, patch.targets)
            fields = {k: v for k, v in changes.items() if k in CHANGEABLE}
            for k in ("valid_from", "valid_until"):
                if k in fields:
                    fields[k] = epoch(getattr(patch, k))
            if _holds_already(record, fields, patch):  # no audit event, no new updated_at
                raise RuleBroken("fields", "nothing to change: every field given is the record's already")
            start = fields.get("valid_from", record.valid_from)
            end = fields.get("valid_until", record.valid_until)
            if start is not None and end is not None and end <= start:
                # The field the patch changed is the one named (both: valid_until).
                named = "valid_from" if "valid_until" not in fields else "valid_until"
                raise RuleBroken(named, "valid_until must be after valid_from")
            self.store.update_fields(tx, record_id, **fields)
            self.store.replace_links(tx, record_id, tags=patch.tags, targets=patch.targets, citations=patch.citations)
            self.store.record(tx, record_id, "updated", caller.principal, fields=sorted(changes))
            stored = self.store.get(tx, record_id)
        return self._show(caller, stored)

    def retire(self, caller: Caller, realm_id: str, record_id: str, reason: str | None) -> dict[str, Any]:
        role = rules.role_in(caller.realms, realm_id)
        rules.check_can_write(role, realm_id)
        if reason is not None and len(reason) > MAX_REASON_CHARS:
            raise RuleBroken("reason", f"at most {MAX_REASON_CHARS} characters, not {len(reason)}")
        with self.store.transaction() as tx:
            self._check_person(tx, caller, realm_id)
            record = self._load(tx, realm_id, record_id, lock=True)
            if record.status != "active":
                raise RuleBroken("lifecycle", "the record is already retired")
            if record.author != caller.principal and role is not Role.OWNER:
                raise RuleBroken("record_author", f"only the record's author ({record.author}) or a realm owner retires it")
            self.store.update_fields(tx, record_id, status="retired")
            self.store.record(tx, record_id, "retired", caller.principal, reason=reason)
            stored = self.store.get(tx, record_id)
        return self._show(caller, stored)

    # ---- reads (agents and people) --------------------------------------------------------------------
    def get(self, caller: Caller, realm_id: str, record_id: str) -> dict[str, Any]:
        rules.role_in(caller.realms, realm_id)
        with self.store.transaction() as tx:
            record = self._load(tx, realm_id, record_id)
        return self._show(caller, record)

    def search(self, caller: Caller, realm_id: str, *, memory_type: str | None = None, reality: str | None = None,
               tag: str | None = None, target_kind: str | None = None, target_id: str | None = None,
               query: str | None = None, valid_now: bool = True, limit: int = 10, offset: int = 0) -> list[dict[str, Any]]:
        rules.role_in(caller.realms, realm_id)
        check_page(limit, offset)
        now = time.time()
        with self.store.transaction() as tx:
            # Tags are stored lowercase: "Vendor" asks for the tag "vendor", not for nothing.
            found = self.store.search(tx, realm_id, memory_type=memory_type, reality=reality, tag=tag.lower() if tag else None,
                                      target_kind=target_kind, target_id=target_id, query=query,
                                      valid_at=now if valid_now else None, limit=limit, offset=offset)
        return [r.compact(now) for r in found]

    def audit(self, caller: Caller, realm_id: str, record_id: str, limit: int = AUDIT_PAGE, offset: int = 0) -> list[dict[str, Any]]:
        """A page of the record's audit trail, oldest first."""
        rules.role_in(caller.realms, realm_id)
        check_page(limit, offset, MAX_TRAIL_OFFSET)
        with self.store.transaction() as tx:
            self._load(tx, realm_id, record_id)
            return [{**e, "at": rfc3339(e["at"])} for e in self.store.audit(tx, record_id, limit, offset)]

    # ---- helpers ------------------------------------------------------------------------------------------
    def _check_person(self, tx, caller: Caller, realm_id: str) -> None:
        """Seed 004: agents search and read AgentMemory, the realm's people write it. A principal in
        the realm's registry, whatever its status (a suspended one too), is an agent: its member
        token once let it write canonical facts and decisions with no review."""
        entry = self.artifacts.registered_agent(tx, realm_id, caller.principal)
        if entry is not None:
            raise RuleBroken("people_write", f"{shown(caller.principal)} is a registered agent of realm {realm_id!r} "
                             f"({entry.role}, {entry.status} in population/registry): agents search and read AgentMemory, "
                             "the realm's people write it; an agent's findings go into a memory artifact for review")

    def _load(self, tx, realm_id: str, record_id: str, lock: bool = False) -> MemoryRecord:
        rules.check_length("record_id", record_id, RECORD_ID_MAX)
        record = self.store.get(tx, record_id, lock=lock)
        if record is None or record.realm_id != realm_id:
            raise RuleBroken("not_found", f"no memory record {record_id!r} in realm {realm_id!r}")
        return record

    def _show(self, caller: Caller, record: MemoryRecord) -> dict[str, Any]:
        """The record as its reader sees it; reads the cited conversations, so never inside a
        transaction (SQLite's write lock, a PostgreSQL row lock would wait on the disk)."""
        shown = record.model_dump(mode="json")
        shown["valid_now"] = record.valid_at(time.time())
        shown["citations"] = show_citations(self.data_dir, record.author, caller.principal, record.citations)
        return shown


def _holds_already(record: MemoryRecord, fields: dict[str, Any], patch: RecordFields) -> bool:
    """Whether the record already says everything the patch gives (`fields`: its columns, dates as epochs)."""
    return (all(getattr(record, k) == v for k, v in fields.items())
            and (patch.tags is None or set(patch.tags) == set(record.tags))
            and (patch.targets is None or target_set(patch.targets) == target_set(record.targets))
            and (patch.citations is None or patch.citations == record.citations))
