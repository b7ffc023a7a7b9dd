"""Artifact operations. Each is one database transaction; who may do what is in rules.py.

The caller (principal and realm roles) always comes from the verified token, never from tool
arguments. Accepting marks the previous accepted version of the path superseded in the same
transaction; the database's unique index makes a second concurrent acceptance fail, and it is
retried, so it supersedes the first: never two accepted versions of one path.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.recall.artifacts import kind_schemas, rules
from services.recall.artifacts.artifact_search import ArtifactSearch
from services.recall.artifacts.artifact_store import ENTRIES_PAGE, NO_ENTRIES, ArtifactStore, Conflict, Tx, Window
from services.recall.artifacts.index_queue import IndexQueue
from services.recall.artifacts.kind_schemas import AgentRegistry, Charter, Constitution
from services.recall.artifacts.models import (ARTIFACT_ID_MAX, ENTITY_ID_MAX, MAX_TARGETS, REALM_ID, Artifact, DraftInput,
                                             Entry, Role, Status, Target, TargetKind, target_set)
from services.recall.artifacts.rules import RuleBroken
from services.recall.artifacts.text_limits import DEFAULT_MAX_TEXT_BYTES, check_json, check_text
from shared.engine.fault_injection import fault_point
from shared.error_site import loggable_failure
from shared.logging_setup import get_logger
from shared.tenant_paths import CONVERSATION_ID, TenantPaths, user_hash

log = get_logger("recall.artifacts")

CONFLICT_RETRIES = 20
MAX_LIMIT = 100
MAX_POOL = 4096  # passages ranked at most for one filtered artifact search
MAX_OFFSET = 10_000
# An audit trail and a journal's entries are read in their own order, by an index on it: pages
# far into them cost little, so they reach further than a search's.
MAX_TRAIL_OFFSET = 1_000_000
AUDIT_PAGE = 50  # audit events listed unless asked for another page size
SEARCHABLE = ("accepted", "proposed", "superseded", "revoked")
CATCH_UP_AFTER_S = 30.0  # a change older than this, not yet in search, was left behind by a dead process
CATCH_UP_RETRY_S = 30.0
# A search waits this long at most for the refreshes its own process queued in the realm (an
# agent that accepted and then searches finds its artifact), then answers from the index as it is.
SEARCH_WAITS_FOR_INDEX_S = 20.0
SWEPT_AT_START = 1000  # realms whose index a starting process brings up to date (the rest: at their first search)
LISTED_AT_MOST = 500  # newest artifacts a query over proposals or history looks through
INDEX_PAGE = 20  # artifacts an index refresh reads from the database at once (their entries: a file's worth at a time)


def check_page(limit: int, offset: int, max_offset: int = MAX_OFFSET, names: tuple[str, str] = ("limit", "offset")) -> None:
    """A page request every list answers the same way: a refusal naming the field past its bound."""
    if not 1 <= limit <= MAX_LIMIT:
        raise RuleBroken(names[0], f"{names[0]} must be between 1 and {MAX_LIMIT}, not {limit}")
    if not 0 <= offset <= max_offset:
        raise RuleBroken(names[1], f"{names[1]} must be between 0 and {max_offset}, not {offset}")


def check_entries_page(entries_offset: int, entries_limit: int) -> tuple[int, int]:
    check_page(entries_limit, entries_offset, MAX_TRAIL_OFFSET, ("entries_limit", "entries_offset"))
    return entries_offset, entries_limit


@dataclass(frozen=True)
class Caller:
    principal: str
    realms: dict[str, Role]

    @classmethod
    def from_claims(cls, claims: dict[str, Any]) -> "Caller":
        raw = claims.get("realms") or {}
        realms, ignored = {}, 0
        if isinstance(raw, dict):
            for realm, role in raw.items():
                if isinstance(realm, str) and REALM_ID.fullmatch(realm) and role in {r.value for r in Role}:
                    realms[realm] = Role(role)
                else:
                    ignored += 1
        if ignored or not isinstance(raw, dict):
            # The caller sees only that realm tools are missing: the gateway's operator needs the why.
            log.warning("token.realms_ignored", user_hash=user_hash(str(claims["sub"])), entries_ignored=ignored,
                        claim_type=type(raw).__name__,
                        rule='"realms" maps realm ids to "owner", "member" or "reader"')
        return cls(principal=str(claims["sub"]), realms=realms)


class ArtifactService:
    def __init__(self, store: ArtifactStore, search: ArtifactSearch, data_dir: Path,
                 max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES) -> None:
        self.store = store
        self.index = search
        self.data_dir = data_dir
        self.max_text_bytes = max_text_bytes  # RECALL_REALM_MAX_TEXT_BYTES (text_limits.py)
        self.catch_up_after_s = CATCH_UP_AFTER_S
        self._used_realms: set[str] = set()
        self._catch_up_not_before: dict[str, float] = {}
        self.index_queue = IndexQueue(self.reindex)

    def check_sizes(self, body: str | None = None, source_context: dict | None = None) -> None:
        """Before any transaction: a field over the limit stores nothing."""
        check_text("body", body, self.max_text_bytes)
        check_json("source_context", source_context, self.max_text_bytes)

    # ---- helpers ----------------------------------------------------------------------------------
    def _load(self, tx: Tx, caller: Caller, realm_id: str, artifact_id: str, lock: bool = False,
              entries: Window = NO_ENTRIES) -> tuple[Artifact, Role]:
        role = rules.role_in(caller.realms, realm_id)
        rules.check_length("artifact_id", artifact_id, ARTIFACT_ID_MAX)
        artifact = self.store.get(tx, artifact_id, lock=lock, entries=entries)
        if artifact is None or artifact.realm_id != realm_id:
            raise RuleBroken("not_found", f"no artifact {artifact_id!r} in realm {realm_id!r}")
        rules.check_can_see(artifact.status, artifact.author, caller.principal)
        return artifact, role

    def check_targets(self, tx: Tx, caller: Caller, realm_id: str, targets: list[Target],
                      inherited: list[Target] | None = None) -> None:
        """`inherited`: the targets of the version a new one supersedes. A conversation target
        carried over from it was checked against that version's author when it was written: it
        stays, though the conversation is not the new author's (only new ones must be theirs)."""
        carried = {(t.target_kind, t.target_id) for t in inherited or []}
        if not targets:
            raise RuleBroken("targets", "an artifact needs at least one target")
        if len(targets) > MAX_TARGETS:
            raise RuleBroken("targets", f"at most {MAX_TARGETS} targets, not {len(targets)}")
        for t in targets:
            if t.target_kind is TargetKind.REALM and t.target_id != realm_id:
                raise RuleBroken("targets", f"a realm target must name this realm ({realm_id!r})")
            if t.target_kind is TargetKind.ENTITY and not self.store.entity_exists(tx, realm_id, t.target_id):
                raise RuleBroken("targets", f"entity {t.target_id!r} does not exist in realm {realm_id!r} (register it first)")
            if t.target_kind in (TargetKind.TEMPLATE, TargetKind.DIAGRAM) and \
                    not self.store.entity_exists(tx, realm_id, t.target_id, t.target_kind.value):
                raise RuleBroken("targets", f"{t.target_kind.value} {t.target_id!r} does not exist in realm {realm_id!r} "
                                 f"(register it with entity_kind={t.target_kind.value!r})")
            if t.target_kind is TargetKind.CONVERSATION and (t.target_kind, t.target_id) not in carried:
                ok = CONVERSATION_ID.fullmatch(t.target_id) and \
                    TenantPaths.for_user(self.data_dir, caller.principal).transcript(t.target_id).exists()
                if not ok:
                    raise RuleBroken("targets", f"conversation {t.target_id!r} is not one of your recorded conversations")

    def constitution(self, tx: Tx, realm_id: str) -> Constitution | None:
        """The realm's accepted constitution, if its population was initialised."""
        current = self.store.accepted_at_path(tx, realm_id, kind_schemas.CONSTITUTION_PATH)
        return kind_schemas.parse_stored_body("constitution", current.body) if current else None  # type: ignore[return-value]

    def check_new_body(self, tx: Tx, realm_id: str, body: kind_schemas.Strict | None) -> None:
        """A new constitution, registry or charter version against the realm's accepted ones
        (kind_schemas.check_new_body)."""
        if not isinstance(body, (Constitution, AgentRegistry, Charter)):
            return
        registry = self.store.accepted_at_path(tx, realm_id, kind_schemas.REGISTRY_PATH) \
            if isinstance(body, (AgentRegistry, Constitution)) else None
        accepted: AgentRegistry | None = kind_schemas.parse_stored_body("agent_registry", registry.body) if registry else None  # type: ignore[assignment]
        kind_schemas.check_new_body(body, self.constitution(tx, realm_id), accepted)
        if isinstance(body, AgentRegistry):
            self._check_charters_exist(tx, realm_id, body, accepted)

    def _check_charters_exist(self, tx: Tx, realm_id: str, body: AgentRegistry, accepted: AgentRegistry | None) -> None:
        """An agent admitted (or moved) to a role without an accepted charter could never start
        (check_population_rules: "no accepted charter"): the admission is refused instead."""
        before = {a.principal: a.role for a in accepted.agents} if accepted else {}
        roles = sorted({a.role for a in body.agents if before.get(a.principal) != a.role})
        if not roles:
            return
        have = self.store.accepted_heads(tx, realm_id, [kind_schemas.CHARTER_PREFIX + r for r in roles])
        missing = [r for r in roles if kind_schemas.CHARTER_PREFIX + r not in have]
        if missing:
            raise RuleBroken("body", f"agent_registry body: role {missing[0]!r} has no accepted charter at "
                             f"{kind_schemas.CHARTER_PREFIX + missing[0]!r}, so its agents could not start; "
                             "an owner accepts that charter first")

    def governed(self, tx: Tx, caller: Caller, realm_id: str, action: str, kind: str | None = None) -> Constitution | None:
        """The constitution's word on a registered agent's action (people are governed by their realm
        role alone); returns the constitution, if any, for the realm-wide rules."""
        constitution = self.constitution(tx, realm_id)
        registry = self.store.accepted_at_path(tx, realm_id, kind_schemas.REGISTRY_PATH) if constitution else None
        if constitution is None or registry is None:
            return constitution
        agents: AgentRegistry = kind_schemas.parse_stored_body("agent_registry", registry.body)  # type: ignore[assignment]
        if agents.find(caller.principal) is not None:
            refusals = kind_schemas.agent_refusals(constitution, agents, caller.principal, action, kind)
            if refusals:
                raise RuleBroken("constitution", "; ".join(refusals))
        return constitution

    def registered_agent(self, tx: Tx, realm_id: str, principal: str) -> kind_schemas.RegistryEntry | None:
        """The principal's entry in the realm's accepted registry, whatever its status (None: a person)."""
        registry = self.store.accepted_at_path(tx, realm_id, kind_schemas.REGISTRY_PATH, entries=NO_ENTRIES)
        if registry is None:
            return None
        agents: AgentRegistry = kind_schemas.parse_stored_body("agent_registry", registry.body)  # type: ignore[assignment]
        return agents.find(principal)

    def _retrying(self, fn):
        for attempt in range(CONFLICT_RETRIES):
            try:
                return fn()
            except Conflict:
                time.sleep(0.005 * (attempt + 1))
        raise RuleBroken("concurrency", "the path kept changing under concurrent acceptances; retry")

    # ---- entities -----------------------------------------------------------------------------------
    def register_entity(self, caller: Caller, realm_id: str, entity_id: str, title: str, entity_kind: str) -> dict:
        rules.check_length("entity_id", entity_id, ENTITY_ID_MAX)
        rules.check_can_write(rules.role_in(caller.realms, realm_id), realm_id)
        with self.store.transaction() as tx:
            self.governed(tx, caller, realm_id, "create_draft")  # a suspended agent writes nothing
            created = self.store.register_entity(tx, realm_id, entity_id, title, entity_kind, caller.principal)
            registered_as = None if created else self.store.entity_kind(tx, realm_id, entity_id)
        if registered_as is not None and registered_as != entity_kind:
            raise RuleBroken("entity_kind", f"entity {entity_id!r} is registered in realm {realm_id!r} as a {registered_as}; "
                             f"an id names one object: register the {entity_kind} under another id")
        return {"realm_id": realm_id, "entity_id": entity_id, "created": created}

    # ---- lifecycle ----------------------------------------------------------------------------------
    def create_draft(self, caller: Caller, realm_id: str, draft: DraftInput, agent_principal: str | None = None,
                     as_action: str = "create_draft") -> Artifact:
        rules.check_principal(caller.principal, agent_principal)
        rules.check_can_write(rules.role_in(caller.realms, realm_id), realm_id)
        rules.check_kind_and_mode(draft.artifact_kind, draft.write_mode)
        self.check_sizes(draft.body, draft.source_context)
        now = time.time()
        artifact = Artifact(artifact_id=uuid.uuid4().hex, realm_id=realm_id, status=Status.DRAFT, author=caller.principal,
                            created_at=now, updated_at=now, **draft.model_dump())
        kind_schemas.check_path(draft.artifact_kind, draft.artifact_path)
        body = kind_schemas.parse_body(draft.artifact_kind, draft.body)
        kind_schemas.check_place(draft.artifact_path, body)
        with self.store.transaction() as tx:
            self.governed(tx, caller, realm_id, as_action, draft.artifact_kind if as_action == "create_draft" else None)
            self.check_new_body(tx, realm_id, body)
            current = self.store.accepted_at_path(tx, realm_id, draft.artifact_path)
            rules.check_not_replacing_journal(current.write_mode if current else None, current.artifact_id if current else None)
            rules.check_succession(current.artifact_id if current else None, draft.supersedes_artifact_id)
            rules.check_same_kind(current.artifact_kind if current else None, draft.artifact_kind)
            self.check_targets(tx, caller, realm_id, draft.targets, current.targets if current else None)
            self.store.lock_author_at_path(tx, realm_id, draft.artifact_path, caller.principal)
            rules.check_one_draft(self.store.own_drafts(tx, realm_id, draft.artifact_path, caller.principal), draft.artifact_path)
            self.store.insert(tx, artifact)
            self.store.record(tx, artifact.artifact_id, "created", caller.principal, artifact_path=draft.artifact_path)
            return self.store.get(tx, artifact.artifact_id)

    def update_draft(self, caller: Caller, realm_id: str, artifact_id: str, changes: dict[str, Any]) -> Artifact:
        if not changes:
            raise RuleBroken("fields", "nothing to change: give body, summary, source_ref, source_context or targets")
        rules.check_texts(body=changes.get("body"), summary=changes.get("summary"), source_ref=changes.get("source_ref"))
        self.check_sizes(changes.get("body"), changes.get("source_context"))
        with self.store.transaction() as tx:
            artifact, role = self._load(tx, caller, realm_id, artifact_id, lock=True)
            rules.check_edit_draft(artifact.status, artifact.author, caller.principal)
            rules.check_can_write(role, realm_id)  # a member demoted to reader writes no more
            self.governed(tx, caller, realm_id, "create_draft", artifact.artifact_kind)
            changes = {field: value for field, value in changes.items() if not _holds(artifact, field, value)}
            if not changes:  # no audit event, no new updated_at, for a change that changes nothing
                raise RuleBroken("fields", "nothing to change: every field given is the draft's already")
            if "body" in changes:
                body = kind_schemas.parse_body(artifact.artifact_kind, changes["body"])
                kind_schemas.check_place(artifact.artifact_path, body)
                self.check_new_body(tx, realm_id, body)
            targets = changes.pop("targets", None)
            if targets is not None:
                superseded = self.store.get(tx, artifact.supersedes_artifact_id) if artifact.supersedes_artifact_id else None
                self.check_targets(tx, caller, realm_id, targets, superseded.targets if superseded else None)
                self.store.replace_targets(tx, artifact_id, targets)
            if changes:
                self.store.update_fields(tx, artifact_id, **changes)
            self.store.record(tx, artifact_id, "updated", caller.principal, fields=sorted([*changes, *(["targets"] if targets else [])]))
            return self.store.get(tx, artifact_id)

    def append(self, caller: Caller, realm_id: str, artifact_id: str, body: str, source_ref: str, source_context: dict) -> Artifact:
        rules.check_texts(body=body, source_ref=source_ref)
        self.check_sizes(body, source_context)
        with self.store.transaction() as tx:
            artifact, role = self._load(tx, caller, realm_id, artifact_id, lock=True)
            rules.check_append(artifact.write_mode, artifact.status, artifact.author, caller.principal, role)
            self.governed(tx, caller, realm_id, "append")
            seq = self.store.add_entry(tx, artifact_id, body, caller.principal, source_ref, source_context)
            self.store.record(tx, artifact_id, "appended", caller.principal, seq=seq, source_ref=source_ref)
            if artifact.status is Status.ACCEPTED:
                self.store.mark_for_index(tx, realm_id, [artifact_id])
            result = self.store.get(tx, artifact_id)
        if result.status is Status.ACCEPTED:
            self.index_queue.soon(realm_id)
        return result

    def submit(self, caller: Caller, realm_id: str, artifact_id: str) -> Artifact:
        with self.store.transaction() as tx:
            artifact, role = self._load(tx, caller, realm_id, artifact_id, lock=True)
            rules.check_submit(artifact.status, artifact.author, caller.principal)
            rules.check_can_write(role, realm_id)
            self.governed(tx, caller, realm_id, "submit")
            self.store.update_fields(tx, artifact_id, status=Status.PROPOSED)
            self.store.record(tx, artifact_id, "submitted", caller.principal)
            return self.store.get(tx, artifact_id)

    def accept(self, caller: Caller, realm_id: str, artifact_id: str) -> Artifact:
        def attempt() -> Artifact:
            with self.store.transaction() as tx:
                artifact, role = self._load(tx, caller, realm_id, artifact_id, lock=True)
                constitution = self.governed(tx, caller, realm_id, "accept")
                rules.check_accept(artifact.status, role, artifact.artifact_kind, artifact.author, caller.principal,
                                   bool(constitution and constitution.separate_author_and_reviewer), artifact.revoked_reason)
                previous = self.store.accepted_at_path(tx, realm_id, artifact.artifact_path, lock=True)
                if previous is None:  # PostgreSQL skips a row a concurrent acceptance just superseded: look again
                    previous = self.store.accepted_at_path(tx, realm_id, artifact.artifact_path, lock=True)
                rules.check_not_replacing_journal(previous.write_mode if previous else None,
                                                  previous.artifact_id if previous else None)
                rules.check_succession(previous.artifact_id if previous else None, artifact.supersedes_artifact_id)
                rules.check_same_kind(previous.artifact_kind if previous else None, artifact.artifact_kind)
                if artifact.artifact_kind in rules.POPULATION_KINDS:
                    # Against the population as it is now: the registry may have changed since a new
                    # constitution was drafted, or a charter been replaced since an admission was.
                    self.check_new_body(tx, realm_id, kind_schemas.parse_body(artifact.artifact_kind, artifact.body))
                if previous is not None:
                    self._supersede_row(tx, previous, artifact_id, caller.principal)
                self.store.update_fields(tx, artifact_id, status=Status.ACCEPTED)
                self.store.record(tx, artifact_id, "accepted", caller.principal,
                                  superseded=previous.artifact_id if previous else None)
                self.store.mark_for_index(tx, realm_id, [artifact_id, *([previous.artifact_id] if previous else [])])
                return self.store.get(tx, artifact_id)

        accepted = self._retrying(attempt)
        self._revoke_overtaken(realm_id, accepted.artifact_path, caller.principal)
        self.index_queue.soon(realm_id)  # the answer does not wait for the embedding (index_queue.py)
        return accepted

    def revoke(self, caller: Caller, realm_id: str, artifact_id: str, reason: str | None) -> Artifact:
        with self.store.transaction() as tx:
            artifact, role = self._load(tx, caller, realm_id, artifact_id, lock=True)
            rules.check_revoke(artifact.status, artifact.author, caller.principal, role, artifact.artifact_kind, reason)
            # Withdrawing one's own draft or proposal takes nothing from memory, so the constitution
            # does not bind it: a suspended agent's draft, private to it, stayed forever. Another's
            # work, or accepted memory, takes the revoke right.
            withdraws = artifact.author == caller.principal and artifact.status is not Status.ACCEPTED
            if not withdraws:
                self.governed(tx, caller, realm_id, "revoke")
            self.store.update_fields(tx, artifact_id, status=Status.REVOKED, revoked_reason=reason)
            self.store.record(tx, artifact_id, "revoked", caller.principal, reason=reason, was=artifact.status.value)
            if artifact.status is Status.ACCEPTED:
                self.store.mark_for_index(tx, realm_id, [artifact_id])
            result = self.store.get(tx, artifact_id)
        if artifact.status is Status.ACCEPTED:
            self._revoke_overtaken(realm_id, artifact.artifact_path, caller.principal)
            self.index_queue.soon(realm_id)
        return result

    def supersede(self, caller: Caller, realm_id: str, artifact_id: str, body: str, summary: str, source_ref: str,
                  source_context: dict, targets: list[Target] | None) -> Artifact:
        rules.check_texts(body=body, summary=summary, source_ref=source_ref)
        self.check_sizes(body, source_context)
        def attempt() -> Artifact:
            with self.store.transaction() as tx:
                current, role = self._load(tx, caller, realm_id, artifact_id, lock=True)
                rules.check_supersede(current.status, role)
                rules.check_not_replacing_journal(current.write_mode, current.artifact_id)
                # A new accepted version: what a registered agent needs to draft that kind and to accept.
                self.governed(tx, caller, realm_id, "create_draft", current.artifact_kind)
                self.governed(tx, caller, realm_id, "accept")
                parsed = kind_schemas.parse_body(current.artifact_kind, body)
                kind_schemas.check_place(current.artifact_path, parsed)
                self.check_new_body(tx, realm_id, parsed)
                new_targets = targets or current.targets
                self.check_targets(tx, caller, realm_id, new_targets, current.targets)
                now = time.time()
                new = Artifact(artifact_id=uuid.uuid4().hex, realm_id=realm_id, artifact_path=current.artifact_path,
                               artifact_kind=current.artifact_kind, write_mode=current.write_mode, status=Status.DRAFT,
                               body=body, summary=summary, source_ref=source_ref, source_context=source_context,
                               author=caller.principal, created_at=now, updated_at=now,
                               supersedes_artifact_id=artifact_id, targets=new_targets)
                self.store.insert(tx, new)
                self.store.record(tx, new.artifact_id, "created", caller.principal, via="supersede_memory_artifact")
                self._supersede_row(tx, current, new.artifact_id, caller.principal)
                self.store.update_fields(tx, new.artifact_id, status=Status.ACCEPTED)
                self.store.record(tx, new.artifact_id, "accepted", caller.principal, superseded=artifact_id)
                self.store.mark_for_index(tx, realm_id, [artifact_id, new.artifact_id])
                return self.store.get(tx, new.artifact_id)

        new = self._retrying(attempt)
        self._revoke_overtaken(realm_id, new.artifact_path, caller.principal)
        self.index_queue.soon(realm_id)
        return new

    def reindex(self, realm_id: str, wait: bool = True) -> bool:
        """After a commit (in the index queue's thread): the realm's search index takes every
        change in the realm's index outbox — the artifacts as the database now has them; a change
        of a process killed between its commit and its refresh is there too. A failure (the index
        locked for over a minute, a full disk) is logged, not raised: the change itself is
        committed, its outbox row stays, and the realm's next refresh rebuilds its files whole.
        True when the index took them."""
        fault_point("artifact_before_index_refresh")
        taken: list[str] = []

        def current(whole: bool) -> Iterator[Artifact]:
            """The outbox first, then the artifacts a page per transaction: a rebuild of a large
            realm never holds it all in memory. A change committed meanwhile keeps its outbox row
            (not taken), so the next refresh takes it even if its page was read before it."""
            with self.store.transaction() as tx:
                pending = self.store.index_outbox(tx, realm_id)
            taken[:] = [change_id for change_id, _ in pending]
            if whole:
                after = ""
                while True:
                    with self.store.transaction() as tx:
                        page = self.store.accepted_page(tx, realm_id, after, INDEX_PAGE)
                    yield from page
                    if len(page) < INDEX_PAGE:
                        return
                    after = page[-1].artifact_id
            ids = list(dict.fromkeys(aid for _, aid in pending))
            for start in range(0, len(ids), INDEX_PAGE):
                with self.store.transaction() as tx:  # closed before the page is used: no lock held while files are written
                    page = self.store.by_ids(tx, ids[start:start + INDEX_PAGE], entries=NO_ENTRIES)
                yield from page

        def entries(artifact_id: str, offset: int, limit: int) -> list[Entry]:
            with self.store.transaction() as tx:
                artifact = self.store.get(tx, artifact_id, entries=(offset, limit))
            return artifact.entries if artifact else []

        try:
            if not self.index.refresh(realm_id, current, entries, wait):
                return False
            with self.store.transaction() as tx:
                self.store.indexed(tx, taken)
            return True
        except Exception as exc:  # noqa: BLE001 - whatever it was, the committed change stands
            log.warning("recall.artifact_index_behind", realm=self.index.home(realm_id).name,
                        **loggable_failure(exc),
                        hint="search may miss these changes until the realm's next refresh rebuilds its index")
            return False

    def sweep_at_start(self) -> int:
        """At start: the refresh of every realm left behind (a process killed between a commit and
        its refresh, a refresh that failed) — the SWEPT_AT_START with the oldest changes — is
        queued, so none waits for its first search. Returns how many were queued."""
        with self.store.transaction() as tx:
            behind = self.store.realms_behind(tx, SWEPT_AT_START)
        for realm_id in behind:
            self.index_queue.soon(realm_id, awaited=False)  # a search catches up itself (catch_up)
        if behind:
            log.info("recall.artifact_index_sweep", realms=len(behind))
        return len(behind)

    def catch_up(self, realm_id: str) -> None:
        """Before a search: a realm whose index is behind its database — changes committed by a
        process that died before its refresh — is brought up to date, on the realm's first
        search in this process (a restart) or once the change is CATCH_UP_AFTER_S old (another
        replica died), never while another refresh runs (it takes the change along), and after a
        failed attempt not again for CATCH_UP_RETRY_S (a full disk must not slow every search)."""
        now = time.monotonic()
        if now < self._catch_up_not_before.get(realm_id, 0.0):
            return
        with self.store.transaction() as tx:
            oldest = self.store.oldest_unindexed(tx, realm_id)
        first_use = realm_id not in self._used_realms
        self._used_realms.add(realm_id)
        if oldest is None or (not first_use and time.time() - oldest < self.catch_up_after_s):
            return
        log.info("recall.artifact_index_catch_up", realm=self.index.home(realm_id).name, behind_s=round(time.time() - oldest, 1))
        if not self.reindex(realm_id, wait=False):
            self._catch_up_not_before[realm_id] = now + CATCH_UP_RETRY_S

    def _revoke_overtaken(self, realm_id: str, path: str, actor: str) -> None:
        """After a version of the path was accepted or revoked: its proposals that name another
        version than the current one (none, after a revocation) can never be accepted
        (rules.check_succession), so they are revoked, the reason in their audit, and the review
        queue (status=proposed) holds live ones only. In a transaction of its own, after the change
        committed: inside it, locking a rival proposal that another acceptance holds while it waits
        for the path's accepted row (which this one holds) would deadlock. A failure here leaves
        the committed change standing (the proposals go at the path's next change)."""
        try:
            with self.store.transaction() as tx:
                current = self.store.accepted_at_path(tx, realm_id, path, entries=NO_ENTRIES)
                current_id = current.artifact_id if current else None
                for proposal_id, supersedes in self.store.proposals_at(tx, realm_id, path):
                    if supersedes != current_id:
                        self._revoke_as_overtaken(tx, proposal_id, supersedes, current_id, path, actor)
        except Exception as exc:  # noqa: BLE001 - the acceptance or revocation itself is committed
            log.warning("recall.artifact_overtaken_left", **loggable_failure(exc),
                        hint="proposals overtaken by this change stay proposed until the path's next change")

    def _revoke_as_overtaken(self, tx: Tx, proposal_id: str, supersedes: str | None, current_id: str | None, path: str,
                             actor: str) -> None:
        reason = (f"overtaken: {current_id} was accepted at {path!r} and this proposal replaces {supersedes}; "
                  f"draft again with supersedes_artifact_id={current_id!r}" if current_id else
                  f"overtaken: the version it replaces ({supersedes}) was revoked and {path!r} has no accepted "
                  "version; draft again without supersedes_artifact_id")
        self.store.update_fields(tx, proposal_id, status=Status.REVOKED, revoked_reason=reason)
        self.store.record(tx, proposal_id, "revoked", actor, reason=reason, was=Status.PROPOSED.value, overtaken=True)

    def _supersede_row(self, tx: Tx, previous: Artifact, by: str, actor: str) -> None:
        self.store.update_fields(tx, previous.artifact_id, status=Status.SUPERSEDED, superseded_by_artifact_id=by)
        self.store.record(tx, previous.artifact_id, "superseded", actor, superseded_by=by)

    # ---- reads ------------------------------------------------------------------------------------------
    def get(self, caller: Caller, realm_id: str, artifact_id: str, entries_offset: int = 0,
            entries_limit: int = ENTRIES_PAGE) -> Artifact:
        window = check_entries_page(entries_offset, entries_limit)
        with self.store.transaction() as tx:
            return self._load(tx, caller, realm_id, artifact_id, entries=window)[0]

    def get_by_path(self, caller: Caller, realm_id: str, artifact_path: str, entries_offset: int = 0,
                    entries_limit: int = ENTRIES_PAGE) -> Artifact:
        window = check_entries_page(entries_offset, entries_limit)
        rules.role_in(caller.realms, realm_id)
        rules.check_artifact_path(artifact_path)
        with self.store.transaction() as tx:
            artifact = self.store.accepted_at_path(tx, realm_id, artifact_path, entries=window)
        if artifact is None:
            raise RuleBroken("not_found", f"no accepted artifact at {artifact_path!r} in realm {realm_id!r}")
        return artifact

    def own_draft_by_path(self, caller: Caller, realm_id: str, artifact_path: str, agent_principal: str | None,
                          entries_offset: int = 0, entries_limit: int = ENTRIES_PAGE) -> Artifact:
        window = check_entries_page(entries_offset, entries_limit)
        rules.check_principal(caller.principal, agent_principal)
        rules.role_in(caller.realms, realm_id)
        rules.check_artifact_path(artifact_path)
        with self.store.transaction() as tx:
            artifact = self.store.own_open_draft(tx, realm_id, artifact_path, caller.principal, entries=window)
        if artifact is None:
            raise RuleBroken("not_found", f"you have no draft or proposal at {artifact_path!r} in realm {realm_id!r}")
        return artifact

    def search(self, caller: Caller, realm_id: str, target_kind: str | None, target_id: str | None, kind: str | None,
               query: str | None, limit: int = 10, status: str = "accepted", offset: int = 0) -> list[dict]:
        """Accepted artifacts (the shared memory), ranked by the query; or, when asked, the
        proposals waiting for review, or superseded or revoked versions (history), newest first."""
        rules.role_in(caller.realms, realm_id)
        check_page(limit, offset)
        if status not in SEARCHABLE:
            raise RuleBroken("status", f"status must be one of {list(SEARCHABLE)} (drafts are private: "
                             "get_own_memory_artifact_draft_by_path)")
        words = query.split() if query else []
        if status != "accepted":
            return self._listed(realm_id, status, target_kind, target_id, kind, words, limit, offset)
        if words:
            self.index_queue.wait(realm_id, SEARCH_WAITS_FOR_INDEX_S)
            self.catch_up(realm_id)
        ranked = self._ranked(realm_id, query, target_kind, target_id, kind, offset + limit)[offset:] if words else None
        with self.store.transaction() as tx:
            # The database has the last word on status: the index may still hold one revoked a moment ago.
            found = self.store.listed(tx, realm_id, ranked, target_kind, target_id, kind, limit=limit,
                                      offset=0 if ranked is not None else offset)
        if ranked is not None:
            order = {aid: i for i, aid in enumerate(ranked)}
            found.sort(key=lambda a: order[a.artifact_id])
        return [a.compact() for a in found]

    def _listed(self, realm_id: str, status: str, target_kind: str | None, target_id: str | None, kind: str | None,
                words: list[str], limit: int, offset: int) -> list[dict]:
        """Only accepted artifacts are in the search index: the others are listed newest first,
        query words (all of them, any case) matched in their path, summary and body, among the
        LISTED_AT_MOST newest."""
        with self.store.transaction() as tx:
            found = self.store.listed(tx, realm_id, None, target_kind, target_id, kind, limit=LISTED_AT_MOST if words else limit,
                                      status=status, offset=0 if words else offset)
        folded = [w.casefold() for w in words]
        matching = [a for a in found
                    if all(w in f"{a.artifact_path}\n{a.summary}\n{a.body}".casefold() for w in folded)]
        return [a.compact() for a in (matching[offset:offset + limit] if words else matching)]

    def _ranked(self, realm_id: str, query: str, target_kind: str | None, target_id: str | None, kind: str | None,
                limit: int) -> list[str]:
        """The best `limit` artifact ids for the query among those the database has as accepted and
        the filters let through. The index knows kinds, not targets, and may still hold an artifact
        revoked or superseded a moment ago: the ranked pool grows until it holds `limit` ids that
        pass, or the whole realm (up to MAX_POOL passages), so a page is short only at the end."""
        pool = max(30, limit * 6)
        while True:
            ranked, everything = self.index.search(realm_id, query, pool, kind)
            with self.store.transaction() as tx:
                passing = self.store.accepted_among(tx, realm_id, ranked, target_kind, target_id, kind)
            ranked = [aid for aid in ranked if aid in passing]
            if len(ranked) >= limit or everything or pool >= MAX_POOL:
                return ranked[:limit]
            pool = min(pool * 4, MAX_POOL)

    def audit(self, caller: Caller, realm_id: str, artifact_id: str, limit: int = AUDIT_PAGE, offset: int = 0) -> list[dict]:
        """A page of the artifact's audit trail, oldest first."""
        check_page(limit, offset, MAX_TRAIL_OFFSET)
        with self.store.transaction() as tx:
            self._load(tx, caller, realm_id, artifact_id)
            return [e.model_dump(mode="json") for e in self.store.audit(tx, artifact_id, limit, offset)]


def _holds(artifact: Artifact, field: str, value: Any) -> bool:
    """Whether the draft's `field` is `value` already."""
    if field == "targets":
        return target_set(value) == target_set(artifact.targets)
    return getattr(artifact, field) == value
