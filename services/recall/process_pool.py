"""RECALL_ENGINE=funes: long-lived `<funes> mcp <tenant memory>` children, one per active tenant.

- A tenant's first call spawns its child (models load once, in the child); later calls reuse it.
- At most `max_processes` children: spawning past the cap closes the least recently used idle
  child. Children idle longer than `idle_s` are closed by a sweeper.
- One call at a time per child (funes serialises recalls anyway); calls of other tenants run
  in their own children.
- A child that crashes, answers with an error, or overruns the timeout is killed and dropped;
  that call degrades softly and the next call starts a fresh child.
- Whether a tenant has a memory is asked of the child (its `status` tool), never read from the
  engine's files: real funes keeps `memory/chunks.lance/`, the embedded engine `chunks.sqlite3`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime

from services.recall.backend import BackendOverloaded, BackendUnavailable
from services.recall.metrics import POOL_CRASH_RESTARTS, POOL_EVICTIONS, POOL_SIZE, POOL_SPAWNS
from services.recall.tool_output import AgentHit, DatedAnswer, hits_from_funes_text
from shared.engine.api import MemoryState, NoIndex
from shared.funes_env import funes_environment
from shared.logging_setup import get_logger
from shared.mcp_stdio_client import ChildExited, ChildGone, StdioMCPChild, ToolCallError
from shared.tenant_paths import TenantPaths

log = get_logger("recall.pool")
# funes' answers for a memory without an index: the default memory, and an explicit path.
_NO_INDEX = ("no index yet", "no index found at")
WARM_UP_QUERY = "warm up"  # a new child's first recall, so that a caller's is not the one that loads the models


def _says_no_index(text: str) -> bool:
    head = text.split(":", 1)[1] if text.startswith(("recall error:", "status error:")) else text
    return any(marker in head for marker in _NO_INDEX)


@dataclass
class _Slot:
    child: StdioMCPChild
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    # Calls holding this child, waiting for its lock included: a woken waiter has not taken the
    # lock yet, so `lock.locked()` alone let eviction close a child a call was about to use.
    users: int = 0


class ProcessPool:
    def __init__(self, binary: str, max_processes: int, idle_s: float, call_timeout_s: float, start_timeout_s: float) -> None:
        self.binary = binary
        self.max_processes = max_processes
        self.idle_s = idle_s
        self.call_timeout_s = call_timeout_s
        self.start_timeout_s = start_timeout_s
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._spawning: dict[str, asyncio.Task] = {}
        self._lock = asyncio.Lock()
        self._sweeper: asyncio.Task | None = None
        self._indexed: set[str] = set()  # tenants whose child reported an index (until it is dropped)
        self._closing: set[asyncio.Task] = set()  # evicted children being closed, apart from any call

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_idle())

    async def close(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
        for uhash in list(self._slots):
            await self._drop(uhash)
        await asyncio.gather(*self._closing)

    def ready(self) -> bool:
        return os.path.isfile(self.binary) or any(
            os.path.isfile(os.path.join(p, self.binary)) for p in os.environ.get("PATH", "").split(os.pathsep))

    # ---- calls -----------------------------------------------------------------------------------
    async def dated(self, paths: TenantPaths, start: datetime, end: datetime, k: int) -> DatedAnswer | None:
        return None  # funes lists no turns by date; its recall always returns k, which the window reorders

    async def recall(self, paths: TenantPaths, query: str, k: int, candidates: int,
                     fill: bool = False) -> list[AgentHit]:
        # funes' MCP recall fixes candidates at 30 and always returns k; only k is a tool argument.
        text = await self._call_once_more_if_gone(paths, "recall", {"query": query, "k": k})
        # Only an error names a missing index: hits are the user's own text, which may quote it.
        if text.startswith("recall error:") and _says_no_index(text):  # e.g. rebuilt after a deletion
            self._indexed.discard(paths.uhash)
            raise NoIndex(paths.memory)
        if text.startswith("recall error:"):
            raise BackendUnavailable(text[:200])
        return hits_from_funes_text(text)

    async def memory_state(self, paths: TenantPaths) -> MemoryState:
        if not paths.src.is_dir():
            # recall's own layout, not the engine's: nothing was ever stored for this tenant,
            # so no child is started to be told so.
            return MemoryState.ABSENT
        if paths.uhash in self._indexed:
            return MemoryState.READY
        text = await self._call_once_more_if_gone(paths, "status", {})
        if _says_no_index(text):
            return MemoryState.ABSENT
        if text.startswith("status error:"):
            raise BackendUnavailable(text[:200])
        self._indexed.add(paths.uhash)
        return MemoryState.READY

    async def _call_once_more_if_gone(self, paths: TenantPaths, tool: str, arguments: dict) -> str:
        try:
            return await self._call(paths, tool, arguments)
        except ChildGone:
            # The child had died between calls; the request never reached it: one fresh child.
            return await self._call(paths, tool, arguments)

    async def _call(self, paths: TenantPaths, tool: str, arguments: dict) -> str:
        slot = await self._slot_for(paths)  # leased: no eviction closes it until we are done
        try:
            async with slot.lock:
                slot.last_used = time.monotonic()
                try:
                    text = await slot.child.call_tool(tool, arguments, self.call_timeout_s)
                except asyncio.TimeoutError:
                    await self._replace(paths.uhash, slot, "timeout")
                    raise BackendUnavailable(f"{tool} timed out") from None
                except ChildGone:
                    await self._replace(paths.uhash, slot, "crash")
                    raise
                except (ChildExited, ToolCallError, ConnectionError, OSError) as exc:
                    await self._replace(paths.uhash, slot, "crash" if isinstance(exc, ChildExited) else "error")
                    raise BackendUnavailable(str(exc)[:200]) from exc
                finally:
                    slot.last_used = time.monotonic()
        finally:
            slot.users -= 1
        return text

    async def forget_tenant(self, paths: TenantPaths) -> None:
        async with self._lock:
            slot = self._detach(paths.uhash)
        if slot is not None:
            async with slot.lock:  # a recall in flight is answered first, not failed; new calls get a new child
                await slot.child.close()

    async def forget_all(self) -> None:
        async with self._lock:
            for uhash in list(self._slots):
                await self._drop(uhash)

    # ---- internals -------------------------------------------------------------------------------
    async def _slot_for(self, paths: TenantPaths) -> _Slot:
        uhash = paths.uhash
        async with self._lock:
            slot = self._slots.get(uhash)
            if slot is not None and slot.child.alive:
                self._slots.move_to_end(uhash)
                slot.users += 1
                return slot
            if slot is not None:  # died between calls
                POOL_CRASH_RESTARTS.labels("crash").inc()
                await self._drop(uhash)
            evicted: list[_Slot] = []
            spawning = self._spawning.get(uhash)
            if spawning is None:  # concurrent first calls of one tenant share one spawn
                evicted = self._make_room()
                spawning = self._spawning[uhash] = asyncio.create_task(self._spawn(paths))
        for victim in evicted:  # closed apart from the lock and the call: a hung child's grace holds up nobody
            closing = asyncio.create_task(victim.child.close())
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        try:
            slot = await asyncio.shield(spawning)
        except Exception as exc:
            raise BackendUnavailable(f"engine child did not start: {exc}") from exc
        finally:
            self._spawning.pop(uhash, None)
        async with self._lock:
            self._slots[uhash] = slot
            self._slots.move_to_end(uhash)
            slot.users += 1
            POOL_SIZE.set(len(self._slots))
        return slot

    async def _spawn(self, paths: TenantPaths) -> _Slot:
        child = StdioMCPChild([self.binary, "mcp", str(paths.memory.resolve())], env=funes_environment(paths.root))
        try:
            await child.start(self.start_timeout_s)
            # funes loads its embedder and reranker on the first recall (the contract: lazily,
            # even when no memory exists), seconds on a small host. Within the call timeout that
            # first call timed out, its child was replaced, and the next one started cold again.
            with contextlib.suppress(ToolCallError):
                await child.call_tool("recall", {"query": WARM_UP_QUERY, "k": 1}, self.start_timeout_s)
        except BaseException:
            child.kill()
            raise
        POOL_SPAWNS.inc()
        log.info("pool.spawned", user_hash=paths.uhash, pid=child.pid)
        return _Slot(child)

    def _make_room(self) -> list[_Slot]:
        """Called with self._lock held: take LRU idle children out until a new one fits; the
        caller closes them once it has let go of the lock."""
        idle = [u for u, s in self._slots.items() if not s.users]  # least recently used first
        excess = len(self._slots) + len(self._spawning) + 1 - self.max_processes
        if excess > len(idle):  # load, not a failure: the agent is told "busy, try again"
            raise BackendOverloaded("every engine child is busy")
        POOL_EVICTIONS.labels("lru").inc(max(0, excess))
        return [slot for slot in map(self._detach, idle[:max(0, excess)]) if slot is not None]

    async def _replace(self, uhash: str, slot: _Slot, reason: str) -> None:
        slot.child.kill()
        async with self._lock:
            first = self._slots.get(uhash) is slot  # calls queued on a dead child all come here: counted once
            if first:
                del self._slots[uhash]
                self._indexed.discard(uhash)
            POOL_SIZE.set(len(self._slots))
        if first:
            POOL_CRASH_RESTARTS.labels(reason).inc()
            log.warning("pool.child_dropped", user_hash=uhash, reason=reason, pid=slot.child.pid)
        await slot.child.close(grace=0.5)

    def _detach(self, uhash: str) -> _Slot | None:
        """Take a tenant's child out of the pool (self._lock held); the caller closes it."""
        slot = self._slots.pop(uhash, None)
        self._indexed.discard(uhash)
        POOL_SIZE.set(len(self._slots))
        return slot

    async def _drop(self, uhash: str) -> None:
        slot = self._detach(uhash)
        if slot is not None:
            await slot.child.close()

    async def _sweep_idle(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.idle_s / 4))
            now = time.monotonic()
            async with self._lock:
                for uhash, slot in list(self._slots.items()):
                    if not slot.users and now - slot.last_used > self.idle_s:
                        POOL_EVICTIONS.labels("idle").inc()
                        await self._drop(uhash)
