"""One index run over one tenant's memory, embedded (in-process) or through a funes binary."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from services.indexer.snapshot_writer import mark_rebuild
from shared.engine.memory_lock import CONTENTION_MESSAGE, MemoryBusy
from shared.funes_env import funes_tmp, start_funes
from shared.redis_lock import LockLost, RedisLock
from shared.tenant_paths import TenantPaths


class IndexJobFailed(Exception):
    pass


class IndexJob(Protocol):
    async def run(self, paths: TenantPaths, lock: RedisLock | None = None) -> None:
        """Bring the tenant's memory up to date with its src/. MemoryBusy if another run holds it.

        With `lock` (the user's index lock, kept alive by the caller): if it is lost, the job is
        aborted and commits nothing more (LockLost)."""
        ...

    async def remove_deleted(self, paths: TenantPaths, lock: RedisLock | None = None) -> None:
        """After sources were deleted: make sure no row of them stays searchable."""
        ...

    def forget_cached_texts(self) -> None:
        """After a forget: drop whatever this process cached of what users wrote."""
        ...


class EmbeddedIndexJob:
    """The project's engine in this process: the model is loaded once per worker.

    The run happens in a thread, which cannot be cancelled from outside; it stops itself at its
    next checkpoint (between phases and embedding batches) once the timeout passed or the lock
    was lost, and right before committing it re-confirms the lock in Redis (a fence)."""

    def __init__(self, timeout_s: float) -> None:
        from shared.engine.embedder import shared_embedder

        self.embedder = shared_embedder()
        self.timeout_s = timeout_s

    async def run(self, paths: TenantPaths, lock: RedisLock | None = None) -> None:
        from shared.engine.index_run import index_tree
        from services.indexer.reembed_job import reembed_if_stale

        if not paths.src.is_dir():
            return  # the tenant was forgotten after this run was scheduled
        # A re-embed after a model change takes as long as the tenant's memory needs (the old
        # memory answers meanwhile); only a lost (or yielded) lock stops it.
        await asyncio.to_thread(reembed_if_stale, paths, self.embedder, self._checkpoint(lock, None))
        await asyncio.to_thread(index_tree, paths.root, paths.src, self.embedder, 5.0, False,
                                self._checkpoint(lock, time.monotonic() + self.timeout_s))

    async def remove_deleted(self, paths: TenantPaths, lock: RedisLock | None = None) -> None:
        # Beyond funes: the rows of deleted sources go at once, and the purge scrubs their text
        # from the index files too, in a memory awaiting a re-embed and in the re-embed's own.
        from shared.engine.reembed import remove_deleted_sources

        if paths.src.is_dir():
            await asyncio.to_thread(remove_deleted_sources, paths.root, paths.src, self.embedder,
                                    self._checkpoint(lock, time.monotonic() + self.timeout_s))

    def _checkpoint(self, lock: RedisLock | None, deadline: float | None) -> Callable[[str], None]:
        """Stops a run at its next checkpoint once `deadline` passed, the lock was given up (a
        stop) or lost, and re-confirms the lock in Redis right before each commit (a fence). A
        run past its deadline or stopped still owns the memory: between embedding batches it
        winds down, committing the whole conversations it embedded (the fence still decides)."""
        from shared.engine.index_run import WindDown

        fence = lock.fence() if lock is not None else None

        def checkpoint(point: str) -> None:
            ending: Exception | None = None
            if deadline is not None and time.monotonic() > deadline:
                ending = IndexJobFailed(f"index timed out after {self.timeout_s:.0f}s")
            elif lock is not None and lock.given_up:
                ending = LockLost(lock.key)
            if ending is not None and point == "mid_embedding":
                raise WindDown(ending)
            if ending is not None and point != "before_commit":
                raise ending
            if fence is not None and (point == "before_commit" or lock.lost):
                fence()

        return checkpoint

    def forget_cached_texts(self) -> None:
        # Indexing stems every word it stores (a process-wide cache of user words, all tenants).
        from shared.engine.text_analysis import forget_cached_texts

        forget_cached_texts()


# A rebuild indexes every stored conversation again, so it may take this long per MiB of the
# tenant's transcripts when that is longer than the index timeout (sized for new conversations).
# Our funes-compatible engine indexes ~1.2 KiB of transcript in 30 ms of CPU; 600 s per MiB
# leaves real funes a wide margin and still stops a child that hangs.
REBUILD_S_PER_MIB = 600.0


class FunesIndexJob:
    """`<bin> index --yes <src>` with FUNES_HOME set, a cleaned environment and a timeout."""

    def __init__(self, binary: str, timeout_s: float) -> None:
        self.binary = binary
        self.timeout_s = timeout_s

    async def remove_deleted(self, paths: TenantPaths, lock: RedisLock | None = None) -> None:
        # funes is append-only: a deletion is a rebuild of the memory from the remaining files.
        await asyncio.to_thread(mark_rebuild, paths)
        await self.run(paths, lock=lock)

    def rebuild_timeout(self, paths: TenantPaths) -> float:
        stored = sum(f.stat().st_size for f in paths.src.glob("*.funes.jsonl"))
        return max(self.timeout_s, stored / 2**20 * REBUILD_S_PER_MIB)

    def forget_cached_texts(self) -> None:
        pass  # every funes run is a child process that exits: it leaves nothing cached here

    async def run(self, paths: TenantPaths, lock: RedisLock | None = None) -> None:
        # A lost lock kills the child (the cancellation path below) before it can commit more.
        await (lock.guard(self._run(paths)) if lock is not None else self._run(paths))

    async def _run(self, paths: TenantPaths) -> None:
        if not paths.src.is_dir():
            return  # the tenant was forgotten after this run was scheduled
        # A snapshot rewrote stored lines, or a conversation was deleted: funes is append-only and
        # has no command that deletes a chunk, so the contract's rebuild (an empty memory, then
        # index). Once the memory is emptied the rebuild is an ordinary index run (funes commits
        # each conversation): one cut short by its timeout, a lost lock or a kill goes on from what
        # it committed, so the mark goes now (unless set again meanwhile), not after the run: a
        # tenant too large to rebuild in one run would otherwise start from nothing every time.
        timeout_s = self.timeout_s
        try:
            marked = paths.funes_rebuild.stat().st_mtime_ns
        except FileNotFoundError:
            marked = None
        if marked is not None:
            await _to_the_end_in_thread(_empty_memory, paths.memory)
            with contextlib.suppress(FileNotFoundError):
                if paths.funes_rebuild.stat().st_mtime_ns == marked:
                    paths.funes_rebuild.unlink()
            timeout_s = await asyncio.to_thread(self.rebuild_timeout, paths)
        # Whatever a killed run left in its temp dir (a unit's copy for TruffleHog) goes first.
        await asyncio.to_thread(shutil.rmtree, funes_tmp(paths.root.resolve()), True)
        proc = await start_funes(self.binary, ["index", "--yes", str(paths.src.resolve())], paths.root)
        try:
            _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except asyncio.TimeoutError:
            await _kill_group(proc)
            raise IndexJobFailed(f"index timed out after {timeout_s:.0f}s") from None
        except asyncio.CancelledError:
            await _kill_group(proc)
            raise
        if proc.returncode != 0:
            stderr = err.decode(errors="replace")
            # The contract: exit 1 whose message says "in progress" (a `Caused by:` chain may follow it).
            if proc.returncode == 1 and ("in progress" in stderr or CONTENTION_MESSAGE in stderr):
                raise MemoryBusy()
            message = stderr.strip().splitlines()[-1:] or [""]
            raise IndexJobFailed(f"index exited {proc.returncode}: {message[0][:300]}")


def _empty_memory(memory: Path) -> None:
    """The memory goes whole, or the rebuild fails: a row left behind could be a forgotten one.
    A file already gone is no failure; one the deletion could not remove, or one made meanwhile, is."""
    def gone_already(function, path, exc_info) -> None:
        if not issubclass(exc_info[0], FileNotFoundError):
            raise exc_info[1]

    shutil.rmtree(memory, onerror=gone_already)
    if memory.exists():
        raise OSError(f"{memory.name} still holds files after it was emptied")


async def _to_the_end_in_thread(function: Callable[..., None], *args) -> None:
    """Run `function` in a thread; a cancellation (a lost or yielded lock) waits for it to end
    before it goes on: the caller's lock is released next, and a deletion still at work in the
    memory would delete what the lock's next holder writes there."""
    work = asyncio.ensure_future(asyncio.to_thread(function, *args))
    cancelled = False
    while not work.done():
        try:
            await asyncio.shield(work)  # raises the function's own failure
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError()


async def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """The child runs in its own session: kill it and anything it started, then reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


def make_index_job(engine: str, funes_bin: str, timeout_s: float) -> IndexJob:
    return FunesIndexJob(funes_bin, timeout_s) if engine == "funes" else EmbeddedIndexJob(timeout_s)
