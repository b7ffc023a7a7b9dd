"""The artifact MCP tools, with seed 004's names and argument names. The caller's principal
and realm roles come from the verified token (`sub`, `realms`: {realm_id: owner|member|reader});
refusals come back as tool errors whose text names the broken rule. Every parameter carries a
description and every closed set is a JSON-schema enum, so an agent can use the tools from
their schemas alone; times are RFC 3339 (UTC)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastmcp import FastMCP
from pydantic import Field

from services.recall.artifacts.models import (ARTIFACT_ID_MAX, ARTIFACT_PATH_MAX, ENTITY_ID_MAX, PRINCIPAL_MAX, REALM_ID_MAX,
                                             MAX_TARGETS, NOT_BLANK, ArtifactKind, DraftInput, Target, TargetKind,
                                             WriteMode)
from services.recall.artifacts.artifact_store import ENTRIES_PAGE
from services.recall.artifacts.service import AUDIT_PAGE, MAX_LIMIT, MAX_OFFSET, MAX_TRAIL_OFFSET, ArtifactService, Caller
from services.recall.artifacts.tool_access import any_realm, owner_somewhere, run, writer_somewhere

RealmId = Annotated[str, Field(min_length=1, max_length=REALM_ID_MAX, description="The realm (team or project space): one of the realms your token names.")]
ArtifactId = Annotated[str, Field(max_length=ARTIFACT_ID_MAX, description="The artifact's id, as returned by create, search or get.")]
ArtifactPath = Annotated[str, Field(max_length=ARTIFACT_PATH_MAX, description="Logical address of the memory inside the realm, not a file: lowercase "
                                                "segments of [a-z0-9._-] separated by '/', e.g. agents/integration-researcher/worklog.")]
Body = Annotated[str, Field(min_length=1, pattern=NOT_BLANK, description="The content: what was done, found, decided, with the evidence.")]
Summary = Annotated[str, Field(min_length=1, max_length=1000, pattern=NOT_BLANK, description="One or two sentences shown in search results.")]
SourceRef = Annotated[str, Field(min_length=1, max_length=500, pattern=NOT_BLANK, description="Where this comes from: a session, task or document id, "
                                                                            "e.g. codex-thread:<session id>.")]
SourceContext = Annotated[dict[str, Any], Field(description="Free provenance details (agent, task, stage) to check the record later.")]
Targets = Annotated[list[Target], Field(min_length=1, max_length=MAX_TARGETS,
                                        description=f"At least one (at most {MAX_TARGETS}) existing object this memory is anchored to.")]
TargetId = Annotated[str | None, Field(max_length=ENTITY_ID_MAX, description="Only artifacts anchored to this target id.")]
SearchStatus = Literal["accepted", "proposed", "superseded", "revoked"]
Offset = Annotated[int, Field(ge=0, le=MAX_OFFSET, description="Results to skip: the next_offset of the previous page.")]
TrailOffset = Annotated[int, Field(ge=0, le=MAX_TRAIL_OFFSET, description="Events to skip: the next_offset of the previous page.")]
EntriesOffset = Annotated[int, Field(ge=0, le=MAX_TRAIL_OFFSET, description="A journal's entries to skip (oldest first): the "
                                                                            "entries_next_offset of the previous read; "
                                                                            "max(0, entries_total - entries_limit) for the newest.")]
EntriesLimit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"Most entries returned (1..{MAX_LIMIT}); entries_total "
                                                                    "says how many there are.")]
AgentPrincipal = Annotated[str | None, Field(max_length=PRINCIPAL_MAX, description="Optional; when given it must equal your authenticated principal (no impersonation).")]


def next_offset(page: list, limit: int, offset: int, max_offset: int = MAX_OFFSET) -> int | None:
    """Where the next page starts; None when this one was the last, or the next would start past
    the list's offset bound (a page the next call would refuse)."""
    after = offset + len(page)
    return after if len(page) == limit and after <= max_offset else None


def _dump(artifact) -> dict:
    return artifact.model_dump(mode="json")


def register_artifact_tools(mcp: FastMCP, service: ArtifactService) -> None:
    @mcp.tool(auth=writer_somewhere)
    async def register_realm_entity(
            realm_id: RealmId,
            entity_id: Annotated[str, Field(min_length=1, max_length=ENTITY_ID_MAX, description="Stable id of the object (a contract, a machine, a task).")],
            title: Annotated[str, Field(min_length=1, max_length=300, description="Human-readable name of the object.")],
            entity_kind: Annotated[str, Field(max_length=100, description="Free label of what sort of object it is (e.g. contract); "
                                                                         "template or diagram makes it a target of that kind.")] = "object",
    ) -> dict:
        """Register an object of the realm (a contract, a machine, a task) so artifacts can target it (members, owners)."""
        return await run(service.register_entity, realm_id, entity_id, title, entity_kind)

    @mcp.tool(auth=writer_somewhere)
    async def create_memory_artifact_draft(
            realm_id: RealmId, artifact_path: ArtifactPath,
            artifact_kind: Annotated[ArtifactKind, Field(description="worklog is a journal (write_mode=append); the others are "
                                                                     "documents with one current version (write_mode=replace). "
                                                                     "constitution, agent_registry and charter take a JSON body.")],
            write_mode: Annotated[WriteMode, Field(description="append for worklog, replace for every other kind (part of the contract).")],
            body: Body, summary: Summary, source_ref: SourceRef, source_context: SourceContext, targets: Targets,
            supersedes_artifact_id: Annotated[str | None, Field(max_length=ARTIFACT_ID_MAX, description="Required when the path already has an accepted version: "
                                                                            "that version's id (get it with get_memory_artifact_by_path).")] = None,
            agent_principal: AgentPrincipal = None,
    ) -> dict:
        """Create a draft artifact (only you see it) anchored to at least one existing target. Then re-read it,
        submit_memory_artifact, and have it accepted."""
        def create(caller: Caller) -> Any:
            draft = DraftInput(artifact_path=artifact_path, artifact_kind=artifact_kind, write_mode=write_mode, body=body,
                               summary=summary, source_ref=source_ref, source_context=source_context, targets=targets,
                               supersedes_artifact_id=supersedes_artifact_id)
            return service.create_draft(caller, realm_id, draft, agent_principal)
        return _dump(await run(create))

    @mcp.tool(auth=writer_somewhere)
    async def update_memory_artifact_draft(
            realm_id: RealmId, artifact_id: ArtifactId,
            body: Annotated[str | None, Field(min_length=1, pattern=NOT_BLANK, description="New content; omit to keep.")] = None,
            summary: Annotated[str | None, Field(min_length=1, max_length=1000, pattern=NOT_BLANK,
                                                 description="New summary; omit to keep.")] = None,
            source_ref: Annotated[str | None, Field(min_length=1, max_length=500, pattern=NOT_BLANK,
                                                    description="New source reference; omit to keep.")] = None,
            source_context: Annotated[dict[str, Any] | None, Field(description="New provenance details; omit to keep.")] = None,
            targets: Annotated[list[Target] | None, Field(min_length=1, max_length=MAX_TARGETS,
                                                          description="New targets (replace all); omit to keep.")] = None,
    ) -> dict:
        """Change your own draft (only while it is a draft)."""
        changes = {k: v for k, v in {"body": body, "summary": summary, "source_ref": source_ref,
                                      "source_context": source_context, "targets": targets}.items() if v is not None}
        return _dump(await run(service.update_draft, realm_id, artifact_id, changes))

    @mcp.tool(auth=writer_somewhere)
    async def append_memory_artifact(realm_id: RealmId, artifact_id: ArtifactId,
                                     body: Annotated[str, Field(min_length=1, pattern=NOT_BLANK, description="The new journal entry.")],
                                     source_ref: SourceRef, source_context: SourceContext) -> dict:
        """Add an entry to a journal (append-mode) artifact: its author while it is a draft, realm members once
        accepted (a proposal under review takes none: what the reviewer read is what gets accepted)."""
        return _dump(await run(service.append, realm_id, artifact_id, body, source_ref, source_context))

    @mcp.tool(auth=writer_somewhere)
    async def submit_memory_artifact(realm_id: RealmId, artifact_id: ArtifactId) -> dict:
        """Send your draft for review (draft → proposed)."""
        return _dump(await run(service.submit, realm_id, artifact_id))

    @mcp.tool(auth=writer_somewhere)
    async def accept_memory_artifact(realm_id: RealmId, artifact_id: ArtifactId) -> dict:
        """Accept a proposed artifact (members, owners; population kinds: owners). The accepted version it names in
        supersedes_artifact_id becomes superseded. The realm constitution may forbid accepting your own."""
        return _dump(await run(service.accept, realm_id, artifact_id))

    @mcp.tool(auth=writer_somewhere)
    async def revoke_memory_artifact(realm_id: RealmId, artifact_id: ArtifactId,
                                     reason: Annotated[str | None, Field(max_length=1000, description="Why it is withdrawn or rejected (kept in the "
                                                                                                         "audit; required to reject another's proposal).")] = None) -> dict:
        """Withdraw your draft or proposal; reject another's proposal (give the reason: its author reads it in the
        audit; population proposals: owners); or (realm owners) revoke an accepted artifact."""
        return _dump(await run(service.revoke, realm_id, artifact_id, reason))

    @mcp.tool(auth=owner_somewhere)
    async def supersede_memory_artifact(realm_id: RealmId,
                                        artifact_id: Annotated[str, Field(max_length=ARTIFACT_ID_MAX,
                                                                          description="The accepted version to replace.")],
                                        body: Body, summary: Summary, source_ref: SourceRef, source_context: SourceContext,
                                        targets: Annotated[list[Target] | None, Field(min_length=1, max_length=MAX_TARGETS, description="Targets of the new version; omit to keep the current ones.")] = None) -> dict:
        """Realm owners: replace the accepted version with an accepted next version in one step (no review; audited)."""
        return _dump(await run(service.supersede, realm_id, artifact_id, body, summary, source_ref, source_context, targets))

    @mcp.tool(auth=any_realm)
    async def get_memory_artifact(realm_id: RealmId, artifact_id: ArtifactId, entries_offset: EntriesOffset = 0,
                                  entries_limit: EntriesLimit = ENTRIES_PAGE) -> dict:
        """The full artifact with a page of its entries (a draft only for its author)."""
        return _dump(await run(service.get, realm_id, artifact_id, entries_offset, entries_limit))

    @mcp.tool(auth=any_realm)
    async def get_memory_artifact_by_path(realm_id: RealmId, artifact_path: ArtifactPath, entries_offset: EntriesOffset = 0,
                                          entries_limit: EntriesLimit = ENTRIES_PAGE) -> dict:
        """The current accepted version at a logical path, with its body and a page of its entries."""
        return _dump(await run(service.get_by_path, realm_id, artifact_path, entries_offset, entries_limit))

    @mcp.tool(auth=writer_somewhere)
    async def get_own_memory_artifact_draft_by_path(realm_id: RealmId, artifact_path: ArtifactPath,
                                                    agent_principal: AgentPrincipal = None, entries_offset: EntriesOffset = 0,
                                                    entries_limit: EntriesLimit = ENTRIES_PAGE) -> dict:
        """Your own unfinished draft or proposal at a path (never shown to others)."""
        return _dump(await run(service.own_draft_by_path, realm_id, artifact_path, agent_principal, entries_offset,
                               entries_limit))

    @mcp.tool(auth=any_realm)
    async def search_memory_artifacts(
            realm_id: RealmId,
            target_kind: Annotated[TargetKind | None, Field(description="Only artifacts anchored to this kind of target.")] = None,
            target_id: TargetId = None,
            kind: Annotated[ArtifactKind | None, Field(description="Only artifacts of this kind.")] = None,
            query: Annotated[str | None, Field(max_length=500, description="Words to rank by (hybrid search over summary, body, entries); omit to list newest first.")] = None,
            limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"Most results returned (1..{MAX_LIMIT}).")] = 10,
            status: Annotated[SearchStatus, Field(description="accepted (default): the realm's shared memory. proposed: what "
                                                              "waits for review. superseded, revoked: history. Drafts are "
                                                              "private (get_own_memory_artifact_draft_by_path).")] = "accepted",
            offset: Offset = 0,
    ) -> dict:
        """Accepted artifacts of a realm, optionally about one target, of one kind, matching a query (or, with status,
        proposals to review or past versions). Returns a compact list without bodies; read one with get_memory_artifact."""
        found = await run(service.search, realm_id, target_kind.value if target_kind else None, target_id, kind, query, limit,
                          status, offset)
        return {"artifacts": found, "next_offset": next_offset(found, limit, offset)}

    @mcp.tool(auth=any_realm)
    async def list_memory_artifact_audit(
            realm_id: RealmId, artifact_id: ArtifactId,
            limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"Most events returned (1..{MAX_LIMIT}).")] = AUDIT_PAGE,
            offset: TrailOffset = 0) -> dict:
        """Every change of an artifact, oldest first, a page at a time: created, updated, appended, submitted, accepted,
        revoked, superseded (who, when)."""
        events = await run(service.audit, realm_id, artifact_id, limit, offset)
        return {"events": events, "next_offset": next_offset(events, limit, offset, MAX_TRAIL_OFFSET)}
