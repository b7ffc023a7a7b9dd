"""Everything a realm offers on the recall service, registered in one call: memory artifacts,
the agent population and AgentMemory (MCP tools), and AgentMemory's HTTP API for people."""

from __future__ import annotations

from fastmcp import FastMCP

from services.recall.agent_memory.http_api import register_agent_memory_routes
from services.recall.agent_memory.memory_store import MemoryStore
from services.recall.agent_memory.service import AgentMemoryService
from services.recall.agent_memory.tools import register_agent_memory_tools
from services.recall.artifacts.nul_text import RefuseNulInRealmTools
from services.recall.artifacts.service import ArtifactService
from services.recall.artifacts.tools import register_artifact_tools
from services.recall.population.service import PopulationService
from services.recall.population.tools import register_population_tools
from shared.body_budget import BodyBudget


def register_realm_surface(mcp: FastMCP, artifacts: ArtifactService, bodies: BodyBudget) -> None:
    mcp.add_middleware(RefuseNulInRealmTools())
    register_artifact_tools(mcp, artifacts)
    register_population_tools(mcp, PopulationService(artifacts))
    memory = AgentMemoryService(MemoryStore(artifacts.store), artifacts, artifacts.data_dir)
    register_agent_memory_tools(mcp, memory)
    register_agent_memory_routes(mcp, memory, bodies)
