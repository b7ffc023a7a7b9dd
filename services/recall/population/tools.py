"""The population's MCP tools: initialise (owners), read agents, the preliminary rule check, and
admission of a new agent as a proposal an owner accepts (with accept_memory_artifact)."""

from __future__ import annotations

from typing import Annotated

from fastmcp import FastMCP
from pydantic import Field

from services.recall.artifacts.kind_schemas import CheckAction
from services.recall.artifacts.models import PRINCIPAL_MAX, ArtifactKind
from services.recall.artifacts.tool_access import any_realm, owner_somewhere, run, writer_somewhere
from services.recall.artifacts.service import MAX_LIMIT
from services.recall.artifacts.tools import Offset, RealmId
from services.recall.population.service import AGENTS_PAGE, ROLE_NAME_MAX, PopulationService

Principal = Annotated[str, Field(min_length=1, max_length=PRINCIPAL_MAX, description="An agent's principal: the sub of its token.")]


def register_population_tools(mcp: FastMCP, service: PopulationService) -> None:
    @mcp.tool(auth=owner_somewhere)
    async def init_population(
            realm_id: RealmId,
            separate_author_and_reviewer: Annotated[bool, Field(description="true (default): nobody accepts an artifact "
                                                                            "they wrote.")] = True) -> dict:
        """Realm owners, once: create the accepted constitution (base roles researcher and reviewer), an empty agent
        registry and a charter per base role, at population/constitution, population/registry, population/charters/<role>."""
        return await run(service.init_population, realm_id, separate_author_and_reviewer)

    @mcp.tool(auth=any_realm)
    async def list_population_agents(
            realm_id: RealmId,
            principal: Annotated[str | None, Field(max_length=PRINCIPAL_MAX, description="Only this agent (e.g. yourself); "
                                                                                        "omit for all.")] = None,
            limit: Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"Most agents returned (1..{MAX_LIMIT}).")] = AGENTS_PAGE,
            offset: Offset = 0) -> dict:
        """The realm's agents from the accepted registry, a page at a time (agents_total, next_offset): role, status,
        charter path, handoff path, and the sources (accepted artifacts) each restores its working state from; plus
        the constitution's roles."""
        return await run(service.list_agents, realm_id, principal, limit, offset)

    @mcp.tool(auth=any_realm)
    async def check_population_rules(
            realm_id: RealmId,
            action: Annotated[CheckAction, Field(description="admit: would this agent be admitted (give agent_role); "
                                                             "start: may it start; or an artifact action it wants to take.")],
            principal: Annotated[str | None, Field(max_length=PRINCIPAL_MAX, description="The agent to check; omit for "
                                                                                        "yourself.")] = None,
            artifact_kind: Annotated[ArtifactKind | None, Field(description="For create_draft: the kind it wants to write.")] = None,
            agent_role: Annotated[str | None, Field(max_length=ROLE_NAME_MAX, description="For admit: the constitution role "
                                                                                         "it would have.")] = None,
    ) -> dict:
        """Preliminary rule check, a dry run: would this agent be admitted, may it start, may it take this action under
        the constitution? Returns allowed and the reasons. Changes nothing."""
        return await run(service.check, realm_id, action, principal, artifact_kind, agent_role)

    @mcp.tool(auth=writer_somewhere)
    async def propose_agent_admission(
            realm_id: RealmId, principal: Principal,
            agent_role: Annotated[str, Field(max_length=ROLE_NAME_MAX, description="One of the constitution's roles (list_population_agents shows them).")],
            note: Annotated[str, Field(max_length=1000, description="Why this agent is admitted, for the reviewing owner.")] = "",
            takes_over_from: Annotated[str | None, Field(max_length=PRINCIPAL_MAX, description="A registered agent whose work it continues: it also "
                                                                    "restores from that agent's sources.")] = None,
    ) -> dict:
        """Propose admitting a new agent: a proposed next version of the agent registry. A realm owner accepts it with
        accept_memory_artifact; until then the agent is not registered."""
        made = await run(service.propose_admission, realm_id, principal, agent_role, note, takes_over_from)
        return made.model_dump(mode="json")
