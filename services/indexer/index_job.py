"""One index run over one tenant's memory, embedded (in-process) or through a funes binary."""

from __future__ import annotations

import asyncio
import shutil
from typing import Protocol

from shared.engine.memory_lock import CONTENTION_MESSAGE, MemoryBusy
from shared.funes_env import funes_environment
from shared.tenant_paths import TenantPaths


class IndexJobFailed(Exception):
    pass


class IndexJob(Protocol):
    async def run(self, paths: TenantPaths) -> None:
        """Bring the tenant's memory up to date with its src/. MemoryBusy if another run holds it."""
        ...

    async def remove_deleted(self, paths: TenantPaths) -> None:
        """After sources were deleted: make sure no row of them stays searchable."""
        ...


class EmbeddedIndexJob:
    """The project's engine in this process: the model is loaded once per worker."""

    def __init__(self) -> None:
        from shared.engine.embedder import shared_embedder

        self.embedder = shared_embedder()

    async def run(self, paths: TenantPaths, purge: bool = False) -> None:
        from shared.engine.index_run import index_tree
        from services.indexer.reembed_job import reembed_if_stale

        if not paths.src.is_dir():
            return  # the tenant was forgotten after this run was scheduled
        await asyncio.to_thread(reembed_if_stale, paths, self.embedder)
        await asyncio.to_thread(index_tree, paths.root, paths.src, self.embedder, 5.0, purge)

    async def remove_deleted(self, paths: TenantPaths) -> None:
        # Beyond funes: an index run removes the rows of deleted sources at once, and the
        # purge scrubs their text from the index files too.
        await self.run(paths, purge=True)


class FunesIndexJob:
    """`<bin> index --yes <src>` with FUNES_HOME set, a cleaned environment and a timeout."""

    def __init__(self, binary: str, timeout_s: float) -> None:
        self.binary = binary
        self.timeout_s = timeout_s

    async def remove_deleted(self, paths: TenantPaths) -> None:
        # funes is append-only: a deletion is a rebuild of the memory from the remaining files.
        await asyncio.to_thread(shutil.rmtree, paths.memory, True)
        await self.run(paths)

    async def run(self, paths: TenantPaths) -> None:
        if not paths.src.is_dir():
            return  # the tenant was forgotten after this run was scheduled
        proc = await asyncio.create_subprocess_exec(
            self.binary, "index", "--yes", str(paths.src.resolve()), env=funes_environment(paths.root),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True)
        try:
            _, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise IndexJobFailed(f"index timed out after {self.timeout_s:.0f}s") from None
        except asyncio.CancelledError:
            proc.kill()
            raise
        if proc.returncode != 0:
            message = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
            if "in progress" in message[0] or CONTENTION_MESSAGE in message[0]:
                raise MemoryBusy()
            raise IndexJobFailed(f"index exited {proc.returncode}: {message[0][:300]}")


def make_index_job(engine: str, funes_bin: str, timeout_s: float) -> IndexJob:
    return FunesIndexJob(funes_bin, timeout_s) if engine == "funes" else EmbeddedIndexJob()
