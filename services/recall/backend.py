"""The one interface the tool uses, whichever engine answers."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from services.recall.tool_output import AgentHit, DatedAnswer
from shared.engine.api import MemoryState
from shared.tenant_paths import TenantPaths


class BackendUnavailable(Exception):
    """The engine could not answer (crash, hung child, corrupt memory); the tool degrades softly."""


class MemoryNeedsRebuild(BackendUnavailable):
    """The tenant's memory files are damaged: unavailable until an index run rebuilds them."""


class BackendOverloaded(Exception):
    """A healthy engine ran out of time: the search stopped at its deadline because the replica is
    loaded. The memory is fine, so the agent is told "busy, try again", not "unavailable"."""


class RecallBackend(Protocol):
    async def recall(self, paths: TenantPaths, query: str, k: int, candidates: int,
                     fill: bool = False) -> list[AgentHit]:
        """The best passages of this tenant's memory, best first (typed, whichever engine); `fill`:
        up to k even when some hold no word of the query (RecallParams.fill; funes always fills)."""
        ...

    async def dated(self, paths: TenantPaths, start: datetime, end: datetime, k: int) -> DatedAnswer | None:
        """The conversations of a time, most recent first, from their first turn then, and how
        many there are (a question that names only a time; hybrid_search.dated); None when the
        engine cannot list turns by date (funes)."""
        ...

    async def memory_state(self, paths: TenantPaths) -> MemoryState:
        """Whether this tenant has a memory to search, as the engine in use reports it."""
        ...

    async def forget_tenant(self, paths: TenantPaths) -> None:
        """Drop every cached handle or child process of this tenant."""
        ...

    async def forget_all(self) -> None:
        """Drop every cached handle and child process (forget announcements may have been missed)."""
        ...

    def ready(self) -> bool: ...

    def start(self) -> None:
        """Start background work (called inside the running event loop)."""
        ...

    async def close(self) -> None: ...
