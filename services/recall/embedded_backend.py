"""RECALL_ENGINE=embedded: the project's engine inside this replica.

Models load once; each tenant's memory reader stays open in an LRU (its int8 snapshot mapped,
later rows in RAM, refreshed from the committed generation on every call, so a new index run is
visible on the next call) until the cache's bounds evict it or it has been idle for
`RECALL_POOL_IDLE_S` (like a funes child).
Searches run in worker threads, off the event loop, and hand back typed hits (no text that
the service would parse again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from services.recall.backend import BackendOverloaded, BackendUnavailable, MemoryNeedsRebuild
from services.recall.metrics import POOL_EVICTIONS, POOL_SIZE, READER_CACHE_BYTES
from services.recall.tool_output import AgentHit, DatedAnswer, hits_from_engine
from shared.engine.api import Engine, MemoryState, NoIndex, memory_state
from shared.engine.hybrid_search import DeadlineExceeded, Hit, RecallParams
from shared.engine.store import MemoryDamaged
from shared.tenant_paths import TenantPaths

_Found = TypeVar("_Found")


class EmbeddedBackend:
    def __init__(self, reader_cache: int, timeout_s: float, reader_cache_bytes: int | None = None,
                 idle_s: float = 600.0) -> None:
        self.engine = Engine(max_readers=reader_cache, max_bytes=reader_cache_bytes)
        self.timeout_s = timeout_s
        self.idle_s = idle_s
        self._sweeper: asyncio.Task | None = None

    async def recall(self, paths: TenantPaths, query: str, k: int, candidates: int,
                     fill: bool = False) -> list[AgentHit]:
        params = RecallParams(k=k, candidates=candidates, floor=True, fill=fill)
        deadline = time.monotonic() + self.timeout_s
        # A thread cannot be cancelled, so the search itself stops at its next stage once the
        # deadline passes; awaiting it to the end keeps its admission slot taken meanwhile.
        return hits_from_engine(await self._in_thread(lambda: self._search(paths, query, params, deadline)))

    async def dated(self, paths: TenantPaths, start: datetime, end: datetime, k: int) -> DatedAnswer:
        params = RecallParams(k=k)
        found = await self._in_thread(
            lambda: self.engine.dated(paths.memory, start.timestamp(), end.timestamp(), params))
        return DatedAnswer(hits=hits_from_engine(found.hits), conversations=found.conversations)

    async def _in_thread(self, work: Callable[[], _Found]) -> _Found:
        """`work`'s result, run in a thread, its failures as the backend's errors."""
        evictions = self.engine.evictions
        try:
            return await asyncio.to_thread(work)
        except DeadlineExceeded:
            raise BackendOverloaded("recall timed out") from None
        except NoIndex:
            raise
        except MemoryDamaged as exc:
            raise MemoryNeedsRebuild(f"{type(exc).__name__}: {exc}") from exc
        except Exception as exc:
            raise BackendUnavailable(f"{type(exc).__name__}: {exc}") from exc
        finally:
            self._publish_pool()
            if self.engine.evictions > evictions:
                POOL_EVICTIONS.labels("lru").inc(self.engine.evictions - evictions)

    def _search(self, paths: TenantPaths, query: str, params: RecallParams, deadline: float) -> list[Hit]:
        hits = self.engine.search(paths.memory, query, params, deadline=deadline)
        if not hits and not self.engine.holds_rows(paths.memory) and not self.engine.indexed_every_source(
                paths.memory, paths.src):
            # Nothing indexed yet (a user's first index run is under way): the service answers as
            # for no memory ("unavailable" while conversations are stored), not "nothing relevant".
            # Conversations indexed without a word to hold (empty turns, only recall echoes) are
            # nothing relevant: "unavailable" would last until the user's next real conversation.
            raise NoIndex(paths.memory)
        return hits

    async def memory_state(self, paths: TenantPaths) -> MemoryState:
        return memory_state(paths.memory)

    async def forget_tenant(self, paths: TenantPaths) -> None:
        self.engine.forget(paths.memory)
        POOL_SIZE.set(self.engine.open_readers)

    async def forget_all(self) -> None:
        self.engine.forget_all()
        self._publish_pool()

    def _publish_pool(self) -> None:
        POOL_SIZE.set(self.engine.open_readers)
        READER_CACHE_BYTES.set(self.engine.cached_bytes)

    def ready(self) -> bool:
        return True

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_idle())

    async def _sweep_idle(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.idle_s / 4))
            closed = await asyncio.to_thread(self.engine.close_idle, self.idle_s)
            if closed:
                POOL_EVICTIONS.labels("idle").inc(closed)
                self._publish_pool()

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
