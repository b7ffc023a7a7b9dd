"""The artifact contract as pure functions. Every refusal names the rule it enforces."""

from __future__ import annotations

import re

from services.recall.artifacts.models import ARTIFACT_PATH, ARTIFACT_PATH_RULE, NOT_BLANK, REALM_ID_MAX, Role, Status

JOURNAL_KINDS = {"worklog"}
# The agent population (constitution, registry, charters) is memory too, with JSON bodies.
POPULATION_KINDS = {"constitution", "agent_registry", "charter"}
RULE_KINDS = {"constitution", "agent_registry"}  # what binds the realm's agents
DOCUMENT_KINDS = {"handoff", "decision", "strategy", "review_protocol", "dossier", *POPULATION_KINDS}
WRITE_MODE = {**{k: "append" for k in JOURNAL_KINDS}, **{k: "replace" for k in DOCUMENT_KINDS}}
CAN_WRITE = {Role.OWNER, Role.MEMBER}
TEXT_LIMITS = {"summary": 1000, "source_ref": 500}  # characters, as DraftInput's


SHOWN_CHARS = 64  # of a caller's value named in a refusal: a 100 KB id must not come back into an agent's context


def shown(value: str, keep: int = SHOWN_CHARS) -> str:
    """A value named in a refusal, never more than its first `keep` characters."""
    return repr(value) if len(value) <= keep else repr(value[:keep]) + f"… ({len(value)} characters)"


class RuleBroken(Exception):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{rule}: {message}")
        self.rule = rule


def check_kind_and_mode(kind: str, write_mode: str) -> None:
    if kind not in WRITE_MODE:
        raise RuleBroken("artifact_kind", f"unknown kind {kind!r}; one of {sorted(WRITE_MODE)}")
    if WRITE_MODE[kind] != write_mode:
        raise RuleBroken("write_mode", f"{kind} requires write_mode={WRITE_MODE[kind]!r} "
                         f"(journals append, documents replace), not {write_mode!r}")


def check_length(field: str, value: str | None, limit: int) -> None:
    """An id or a name over its bound is refused before any query, and not echoed back: one
    100,000-character id came back whole in the error, into an agent's context."""
    if value is not None and len(value) > limit:
        raise RuleBroken(field, f"at most {limit} characters, not {len(value)} (starts {shown(value, 16)})")


def role_in(realms: dict[str, Role], realm_id: str) -> Role:
    check_length("realm_id", realm_id, REALM_ID_MAX)
    role = realms.get(realm_id)
    if role is None:
        raise RuleBroken("realm_membership", f"you are not a member of realm {realm_id!r}")
    return role


def check_can_write(role: Role, realm_id: str) -> None:
    if role not in CAN_WRITE:
        raise RuleBroken("realm_role", f"role {role.value} in realm {realm_id!r} may read, not write")


def check_principal(authenticated: str, claimed: str | None) -> None:
    if claimed is not None and claimed != authenticated:
        raise RuleBroken("agent_principal", "agent_principal must be the authenticated principal; impersonation is refused")


def check_can_see(status: Status, author: str, caller: str) -> None:
    if status is Status.DRAFT and author != caller:
        raise RuleBroken("draft_privacy", "a draft is visible to its author only")


def check_edit_draft(status: Status, author: str, caller: str) -> None:
    if author != caller:
        raise RuleBroken("draft_owner", "only the author edits a draft")
    if status is not Status.DRAFT:
        raise RuleBroken("lifecycle", f"only a draft can be edited; this artifact is {status.value}")


def check_append(write_mode: str, status: Status, author: str, caller: str, role: Role) -> None:
    if write_mode != "append":
        raise RuleBroken("write_mode", "only append-mode artifacts (journals) take appended entries; replace documents get a new version")
    if status in (Status.SUPERSEDED, Status.REVOKED):
        raise RuleBroken("lifecycle", f"nobody appends to a {status.value} artifact")
    if status is Status.PROPOSED:
        # What the reviewer read is what gets accepted: an entry added during review would be
        # accepted unread.
        raise RuleBroken("lifecycle", "a proposal is under review and takes no entries; append once it is accepted, "
                         "or revoke it and draft again")
    if status is Status.DRAFT and author != caller:
        raise RuleBroken("draft_owner", "only the author appends while the artifact is a draft")
    if role not in CAN_WRITE:
        raise RuleBroken("realm_role", f"appending needs the member or owner role, not {role.value}")


def check_submit(status: Status, author: str, caller: str) -> None:
    if author != caller:
        raise RuleBroken("draft_owner", "only the author submits a draft")
    if status is not Status.DRAFT:
        raise RuleBroken("lifecycle", f"only a draft can be submitted; this artifact is {status.value}")


def check_accept(status: Status, role: Role, kind: str, author: str, caller: str, separate_duties: bool,
                 revoked_reason: str | None = None) -> None:
    if role not in CAN_WRITE:
        raise RuleBroken("realm_role", "accepting needs the member or owner role")
    if kind in POPULATION_KINDS and role is not Role.OWNER:
        raise RuleBroken("realm_role", f"the {kind} (part of the realm's population rules) is accepted by a realm owner")
    if status is not Status.PROPOSED:
        why = f" ({revoked_reason})" if status is Status.REVOKED and revoked_reason else ""
        raise RuleBroken("lifecycle", f"only a proposed artifact can be accepted; this one is {status.value}{why}")
    if separate_duties and author == caller:
        raise RuleBroken("separation_of_duties", "the realm constitution requires separate author and reviewer; "
                         "someone other than the author accepts this")


def check_same_kind(current: str | None, kind: str) -> None:
    """A path keeps its kind, and with it its write mode, from version to version: a reviewed
    decision does not become a journal anyone may append to."""
    if current is not None and current != kind:
        raise RuleBroken("artifact_kind", f"the path holds a {current}; a new version keeps that kind, not {kind} "
                         "(another kind goes to another path)")


def check_artifact_path(artifact_path: str) -> None:
    """A path asked for is one an artifact can have: "../etc" is a mistake to name, not an absence."""
    if not ARTIFACT_PATH.fullmatch(artifact_path):
        raise RuleBroken("artifact_path", f"not an artifact path: it must be {ARTIFACT_PATH_RULE}")


def check_succession(accepted_now: str | None, supersedes: str | None) -> None:
    """A new version names the one it replaces, so history links agree both ways."""
    if accepted_now is not None and supersedes != accepted_now:
        raise RuleBroken("supersedes", f"path has accepted version {accepted_now}; draft must supersede it "
                         f"(supersedes_artifact_id={accepted_now!r})")
    if accepted_now is None and supersedes is not None:
        # The id may be no longer accepted, at another path, in another realm or unknown: which one
        # is not said, since telling them apart would tell of other realms' ids.
        raise RuleBroken("supersedes", f"the path has no accepted version, so a draft there supersedes nothing; "
                         f"{supersedes} is not an accepted version of this path: write the draft without "
                         "supersedes_artifact_id")


def check_revoke(status: Status, author: str, caller: str, role: Role, kind: str, reason: str | None = None) -> None:
    """The author withdraws their draft or proposal; a writer of the realm rejects another's
    proposal, saying why (the constitution's `revoke` action for a registered agent, checked by the
    service); owners revoke accepted memory. Another's draft is private and stays theirs."""
    if status not in (Status.DRAFT, Status.PROPOSED, Status.ACCEPTED):
        raise RuleBroken("lifecycle", f"a {status.value} artifact cannot be revoked")
    if status is Status.ACCEPTED and kind in RULE_KINDS:
        # Without an accepted registry or constitution nobody is governed: revoking the registry
        # would have given a suspended agent back every right.
        raise RuleBroken("population", f"the accepted {kind} is replaced with a new version, never revoked "
                         "(without it the realm's agents would be bound by nothing)")
    if status is Status.ACCEPTED and role is not Role.OWNER:
        raise RuleBroken("realm_role", "revoking accepted memory needs the owner role")
    if status is Status.DRAFT and author != caller:
        raise RuleBroken("draft_owner", "only the author withdraws a draft")
    if status is Status.PROPOSED and author != caller:
        check_reject(role, kind, reason)


def check_reject(role: Role, kind: str, reason: str | None) -> None:
    """Rejecting another's proposal: whoever may accept it may reject it, and says why, since the
    author reads the reason in the audit to draft again."""
    if role not in CAN_WRITE:
        raise RuleBroken("realm_role", f"rejecting a proposal needs the member or owner role, not {role.value}")
    if kind in POPULATION_KINDS and role is not Role.OWNER:
        raise RuleBroken("realm_role", f"a {kind} proposal (part of the realm's population rules) is accepted or "
                         "rejected by a realm owner")
    if reason is None or not re.search(NOT_BLANK, reason):
        raise RuleBroken("reason", "rejecting another's proposal needs a reason (what is missing or wrong): its author "
                         "reads it in the audit")


def check_not_replacing_journal(current_mode: str | None, current_id: str | None) -> None:
    """Seed 004: a journal is continued, a decision is replaced. A new version of a journal left its
    path with none of the entries its readers restore from."""
    if current_mode == "append":
        raise RuleBroken("journal", f"the path holds an accepted journal ({current_id}); a journal is continued, never "
                         f"replaced by a new version: append_memory_artifact(artifact_id={current_id!r}) adds an entry "
                         "(or a realm owner revokes it, and a new journal starts at the path)")


def check_one_draft(existing: list[str], path: str) -> None:
    """One draft per author and path: get_own_memory_artifact_draft_by_path restores one, and the
    others were lost to their author (drafts never appear in search). A draft sent for review
    (proposed) no longer counts: the author may start the next one."""
    if existing:
        raise RuleBroken("open_draft", f"you already have a draft at {path!r}: {existing[0]}; update it "
                         "(update_memory_artifact_draft), submit it, or withdraw it (revoke_memory_artifact)")


def check_texts(**fields: str | None) -> None:
    """body, summary and source_ref on every write as at creation: present, within bounds, not
    whitespace alone (a tool's schema says so too; a direct call of the service is checked here)."""
    for name, value in fields.items():
        if value is None:
            continue
        limit = TEXT_LIMITS.get(name)
        if limit is not None and len(value) > limit:
            raise RuleBroken(name, f"at most {limit} characters, not {len(value)}")
        if not re.search(NOT_BLANK, value):
            raise RuleBroken(name, "must hold more than whitespace")


def check_supersede(status: Status, role: Role) -> None:
    if role is not Role.OWNER:
        raise RuleBroken("realm_role", "supersede_memory_artifact is for realm owners (others: a new draft with supersedes_artifact_id)")
    if status is not Status.ACCEPTED:
        raise RuleBroken("lifecycle", f"only the accepted version can be superseded; this one is {status.value}")
