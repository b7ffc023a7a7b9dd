"""Removing a forgotten conversation's rows from the index, and counting what went, asked the
way the engine in use answers: the embedded engine's own store, or a funes binary's documented
command line (`forget`, `status`), never its files (real funes keeps `memory/chunks.lance/`)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Protocol

from services.indexer.index_job import IndexJob, IndexJobFailed
from shared.funes_env import start_funes
from shared.logging_setup import get_logger
from shared.redis_lock import RedisLock
from shared.tenant_paths import TenantPaths

log = get_logger("recall.indexer.forget")

USAGE_ERROR = 2  # funes (clap) exits 2 for an unknown subcommand: funes <= 1.2 has no `forget`
_FORGOT = re.compile(r"^forgot session .+: (\d+) chunks removed$", re.M)
_CHUNKS = re.compile(r"^chunks: (\d+)$", re.M)

# The count a removal starts from, as the forget's first attempt took it (forgetting.py keeps it
# in the receipt): an attempt after a crash finds the rows gone, or a memory half rebuilt, and
# counted from there its receipt said 0 chunks.
FirstCount = Callable[[int], Awaitable[int]]


async def as_counted(chunks: int) -> int:
    return chunks


class RebuildContinues(Exception):
    """A forget's rebuild emptied the memory and was cut short: the conversation is gone, the
    rest is indexed again by the user's next index runs (the caller schedules one). `chunks`: the
    memory's rows before, less those it holds now (more than the conversation held)."""

    def __init__(self, chunks: int) -> None:
        super().__init__(f"rebuild continues; {chunks} chunks fewer for now")
        self.chunks = chunks


class ForgetRows(Protocol):
    async def count(self, paths: TenantPaths) -> int:
        """Chunks the tenant's memory holds (what forgetting the whole user removes)."""
        ...

    async def remove_conversation(self, paths: TenantPaths, conversation_id: str, lock: RedisLock | None = None,
                                  first_count: FirstCount = as_counted) -> int:
        """After the source file is gone: remove the conversation's rows; the number removed,
        counted from `first_count` of the count taken before removing."""
        ...

    def removal_rebuilds(self) -> bool | None:
        """Whether removing a conversation's rows rebuilds the whole memory from the remaining
        files (so it removes the rows of every source deleted before it too); None until known."""
        ...


class EmbeddedRows:
    def __init__(self, job: IndexJob) -> None:
        self.job = job

    async def count(self, paths: TenantPaths) -> int:
        from shared.engine.api import chunk_count  # the embedded engine only: funes mode never loads it
        from shared.engine.store import MemoryUnusable

        try:
            return await asyncio.to_thread(chunk_count, paths.memory)
        except MemoryUnusable as exc:
            # The count only fills the receipt: an unreadable memory is deleted all the same.
            log.warning("forget.memory_unreadable", user_hash=paths.uhash, error=type(exc).__name__)
            return 0

    async def remove_conversation(self, paths: TenantPaths, conversation_id: str, lock: RedisLock | None = None,
                                  first_count: FirstCount = as_counted) -> int:
        from shared.engine.api import chunk_count
        from shared.engine.store import MemoryDamaged

        try:
            before = await asyncio.to_thread(chunk_count, paths.memory, conversation_id)
        except MemoryDamaged:
            # Unreadable, so uncounted; the run below deletes it and rebuilds it without the conversation.
            log.warning("forget.memory_damaged", user_hash=paths.uhash)
            before = 0
        before = await first_count(before)
        await self.job.remove_deleted(paths, lock=lock)
        # Not 0 after only when a snapshot newer than the forget stays (forgetting.py): its rows
        # were re-read, not removed.
        return max(0, before - await asyncio.to_thread(chunk_count, paths.memory, conversation_id))

    def removal_rebuilds(self) -> bool:
        return False  # it counts and removes one conversation's rows


class FunesRows:
    def __init__(self, binary: str, job: IndexJob, timeout_s: float) -> None:
        self.binary = binary
        self.job = job
        self.timeout_s = timeout_s
        self._has_forget: bool | None = None  # learnt from the first forget's exit code

    def removal_rebuilds(self) -> bool | None:
        return None if self._has_forget is None else not self._has_forget

    async def count(self, paths: TenantPaths) -> int:
        code, out, err = await self._run(paths, "status", str(paths.memory.resolve()))
        if code != 0:
            # The count only fills the receipt; it must not stop the deletion itself.
            log.warning("forget.funes_status_failed", user_hash=paths.uhash, code=code, error=err[-200:])
            return 0
        found = _CHUNKS.search(out)
        return int(found[1]) if found else 0  # "no index yet": nothing to count

    async def remove_conversation(self, paths: TenantPaths, conversation_id: str, lock: RedisLock | None = None,
                                  first_count: FirstCount = as_counted) -> int:
        code, out, err = await self._run(paths, "forget", conversation_id, "--memory", str(paths.memory.resolve()))
        if code == 0 and (found := _FORGOT.search(out)):
            self._has_forget = True
            return int(found[1])
        if code == 1 and "no index" in err:
            return 0
        if code == USAGE_ERROR:
            self._has_forget = False
        else:
            log.warning("forget.funes_forget_failed", user_hash=paths.uhash, code=code, error=(err or out)[-200:])
        # funes' own deletion path (the only one of an append-only funes): rebuild the memory from
        # the remaining files, and count the difference.
        before = await first_count(await self.count(paths))
        try:
            await self.job.remove_deleted(paths, lock=lock)
        except IndexJobFailed as exc:
            # The run emptied the memory before it started, so the conversation is gone from it;
            # what remains comes back in the next index runs, which go on from what this one
            # committed. Failing the forget instead had it redelivered, and each delivery emptied
            # the memory again: a tenant too large for one run never finished (dead-lettered).
            log.warning("forget.rebuild_continues", user_hash=paths.uhash, error=str(exc)[:200])
            raise RebuildContinues(max(0, before - await self.count(paths))) from exc
        return max(0, before - await self.count(paths))

    async def _run(self, paths: TenantPaths, *args: str) -> tuple[int, str, str]:
        proc = await start_funes(self.binary, args, paths.root)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            proc.kill()
            await proc.wait()
            raise
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


def make_forget_rows(engine: str, funes_bin: str, job: IndexJob, timeout_s: float) -> ForgetRows:
    return FunesRows(funes_bin, job, timeout_s) if engine == "funes" else EmbeddedRows(job)
