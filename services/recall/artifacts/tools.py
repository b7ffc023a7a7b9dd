"""The artifact MCP tools, with seed 004's names and argument names. The caller's principal
and realm roles come from the verified token (`sub`, `realms`: {realm_id: owner|member|reader});
refusals come back as tool errors whose text names the broken rule."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.server.dependencies import get_access_token
from pydantic import ValidationError

from services.recall.artifacts.models import DraftInput, Target
from services.recall.artifacts.rules import RuleBroken
from services.recall.artifacts.service import ArtifactService, Caller


def _caller() -> Caller:
    token = get_access_token()
    if token is None or not token.claims.get("sub"):
        raise ToolError("authentication: the access token names no principal (sub claim)")
    return Caller.from_claims(token.claims)


async def _run(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, _caller(), *args)
    except RuleBroken as exc:
        raise ToolError(str(exc)) from None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raise ToolError(f"invalid {'.'.join(str(p) for p in first['loc']) or 'input'}: {first['msg']}") from None


def _dump(artifact) -> dict:
    return artifact.model_dump(mode="json")


def register_artifact_tools(mcp: FastMCP, service: ArtifactService) -> None:
    @mcp.tool
    async def register_realm_entity(realm_id: str, entity_id: str, title: str, entity_kind: str = "object") -> dict:
        """Register an object of the realm (a contract, a machine, a task) so artifacts can target it."""
        return await _run(service.register_entity, realm_id, entity_id, title, entity_kind)

    @mcp.tool
    async def create_memory_artifact_draft(realm_id: str, artifact_path: str, artifact_kind: str, write_mode: str, body: str,
                                           summary: str, source_ref: str, source_context: dict[str, Any],
                                           targets: list[Target], supersedes_artifact_id: str | None = None,
                                           agent_principal: str | None = None) -> dict:
        """Create a draft artifact (worklog: write_mode=append; handoff, decision, strategy, review_protocol,
        dossier: write_mode=replace) anchored to at least one existing target."""
        def create(caller: Caller) -> Any:
            draft = DraftInput(artifact_path=artifact_path, artifact_kind=artifact_kind, write_mode=write_mode, body=body,
                               summary=summary, source_ref=source_ref, source_context=source_context, targets=targets,
                               supersedes_artifact_id=supersedes_artifact_id)
            return service.create_draft(caller, realm_id, draft, agent_principal)
        return _dump(await _run(create))

    @mcp.tool
    async def update_memory_artifact_draft(realm_id: str, artifact_id: str, body: str | None = None, summary: str | None = None,
                                           source_ref: str | None = None, source_context: dict[str, Any] | None = None,
                                           targets: list[Target] | None = None) -> dict:
        """Change your own draft (only while it is a draft)."""
        changes = {k: v for k, v in {"body": body, "summary": summary, "source_ref": source_ref,
                                      "source_context": source_context, "targets": targets}.items() if v is not None}
        return _dump(await _run(service.update_draft, realm_id, artifact_id, changes))

    @mcp.tool
    async def append_memory_artifact(realm_id: str, artifact_id: str, body: str, source_ref: str,
                                     source_context: dict[str, Any]) -> dict:
        """Add an entry to a journal (append-mode) artifact."""
        return _dump(await _run(service.append, realm_id, artifact_id, body, source_ref, source_context))

    @mcp.tool
    async def submit_memory_artifact(realm_id: str, artifact_id: str) -> dict:
        """Send your draft for review (draft → proposed)."""
        return _dump(await _run(service.submit, realm_id, artifact_id))

    @mcp.tool
    async def accept_memory_artifact(realm_id: str, artifact_id: str) -> dict:
        """Accept a proposed artifact; the previous accepted version of its path becomes superseded."""
        return _dump(await _run(service.accept, realm_id, artifact_id))

    @mcp.tool
    async def revoke_memory_artifact(realm_id: str, artifact_id: str, reason: str | None = None) -> dict:
        """Withdraw a draft, proposal or (realm owners) accepted artifact."""
        return _dump(await _run(service.revoke, realm_id, artifact_id, reason))

    @mcp.tool
    async def supersede_memory_artifact(realm_id: str, artifact_id: str, body: str, summary: str, source_ref: str,
                                        source_context: dict[str, Any], targets: list[Target] | None = None) -> dict:
        """Realm owners: replace the accepted version with an accepted next version in one step."""
        return _dump(await _run(service.supersede, realm_id, artifact_id, body, summary, source_ref, source_context, targets))

    @mcp.tool
    async def get_memory_artifact(realm_id: str, artifact_id: str) -> dict:
        """The full artifact with its entries."""
        return _dump(await _run(service.get, realm_id, artifact_id))

    @mcp.tool
    async def get_memory_artifact_by_path(realm_id: str, artifact_path: str) -> dict:
        """The current accepted version at a logical path."""
        return _dump(await _run(service.get_by_path, realm_id, artifact_path))

    @mcp.tool
    async def get_own_memory_artifact_draft_by_path(realm_id: str, artifact_path: str, agent_principal: str | None = None) -> dict:
        """Your own unfinished draft or proposal at a path (never shown to others)."""
        return _dump(await _run(service.own_draft_by_path, realm_id, artifact_path, agent_principal))

    @mcp.tool
    async def search_memory_artifacts(realm_id: str, target_kind: str | None = None, target_id: str | None = None,
                                      kind: str | None = None, query: str | None = None, limit: int = 10) -> dict:
        """Accepted artifacts of a realm, optionally about one target, of one kind, matching a query.
        Returns a compact list without bodies; read one with get_memory_artifact."""
        found = await _run(service.search, realm_id, target_kind, target_id, kind, query, limit)
        return {"artifacts": found}

    @mcp.tool
    async def list_memory_artifact_audit(realm_id: str, artifact_id: str) -> dict:
        """Every change of an artifact: created, updated, appended, submitted, accepted, revoked, superseded."""
        return {"events": await _run(service.audit, realm_id, artifact_id)}
