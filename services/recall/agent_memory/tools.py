"""AgentMemory over MCP: agents search and read (seed 004: "поиск и чтение"); writing is for
people, through the HTTP API or `recall memory`."""

from __future__ import annotations

from typing import Annotated

from fastmcp import FastMCP
from pydantic import Field

from services.recall.agent_memory.models import MemoryType, Reality
from services.recall.agent_memory.service import AgentMemoryService
from services.recall.artifacts.models import RECORD_ID_MAX, TargetKind
from services.recall.artifacts.service import MAX_LIMIT
from services.recall.artifacts.tool_access import any_realm, run
from services.recall.artifacts.tools import Offset, RealmId, next_offset


def register_agent_memory_tools(mcp: FastMCP, service: AgentMemoryService) -> None:
    @mcp.tool(auth=any_realm)
    async def search_agent_memory(
            realm_id: RealmId,
            memory_type: Annotated[MemoryType | None, Field(description="Only records of this type.")] = None,
            reality: Annotated[Reality | None, Field(description="Only records with this reality: what is (current_state), "
                                                               "what should be (target_state), a hypothesis, a decision, "
                                                               "or a historical_fact.")] = None,
            tag: Annotated[str | None, Field(max_length=40, description="Only records carrying this tag.")] = None,
            target_kind: Annotated[TargetKind | None, Field(description="Only records anchored to this kind of target.")] = None,
            target_id: Annotated[str | None, Field(max_length=200, description="Only records anchored to this target id.")] = None,
            query: Annotated[str | None, Field(max_length=500, description="Words that must all appear in the title, summary or content.")] = None,
            valid_now: Annotated[bool, Field(description="true (default): only records valid now; false: also expired and "
                                                         "not-yet-valid ones.")] = True,
            limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"Most results returned (1..{MAX_LIMIT}).")] = 10,
            offset: Offset = 0,
    ) -> dict:
        """AgentMemory records of a realm (compact typed records written by the realm's people): newest first, without
        content. Read one with get_agent_memory."""
        found = await run(lambda caller: service.search(
            caller, realm_id, memory_type=memory_type, reality=reality, tag=tag,
            target_kind=target_kind.value if target_kind else None, target_id=target_id, query=query,
            valid_now=valid_now, limit=limit, offset=offset))
        return {"records": found, "next_offset": next_offset(found, limit, offset)}

    @mcp.tool(auth=any_realm)
    async def get_agent_memory(realm_id: RealmId,
                               record_id: Annotated[str, Field(max_length=RECORD_ID_MAX,
                                                               description="The record's id, from search_agent_memory.")]) -> dict:
        """One AgentMemory record with its content, validity and provenance citations (a cited conversation passage is
        shown only to its author; others see it as withheld)."""
        return await run(service.get, realm_id, record_id)
