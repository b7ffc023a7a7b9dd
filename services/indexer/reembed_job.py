"""The indexer's side of a model change: re-embed a tenant's memory before its next index run,
and at start put every tenant whose memory carries another model's stamp on the due list, so
idle tenants move too — and every tenant whose sources have no usable memory (lost, or damaged:
its run rebuilds it). The work itself is `shared/engine/reembed.py` and `index_run.py`."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import redis.asyncio as aioredis

from services.indexer import redis_keys as keys
from services.indexer.metrics import REEMBED_PENDING, REEMBED_PROGRESS, REEMBEDS
from shared.engine.embedder import Embedder
from shared.engine.index_run import Checkpoint
from shared.engine.reembed import model_stamp, needs_reembed, reembed_memory, stamp_of
from shared.error_site import loggable_failure
from shared.logging_setup import get_logger
from shared.tenant_paths import USER_HASH, TenantPaths

log = get_logger("recall.indexer.reembed")


def reembed_if_stale(paths: TenantPaths, embedder: Embedder, checkpoint: Checkpoint | None = None) -> None:
    """Runs in the index job's thread, under the tenant's index lock (one run per tenant);
    `checkpoint` aborts it (a lost lock) with the live memory untouched."""
    if not needs_reembed(paths.root, embedder):
        return
    started = time.monotonic()
    gauge = REEMBED_PROGRESS.labels(paths.uhash)
    try:
        chunks = reembed_memory(paths.root, paths.src, embedder,
                                progress=lambda done, total: gauge.set(min(1.0, done / total) if total else 1.0),
                                checkpoint=checkpoint)
    except Exception:
        REEMBEDS.labels("failed").inc()
        raise
    finally:
        REEMBED_PROGRESS.remove(paths.uhash)
    REEMBEDS.labels("ok").inc()
    log.info("reembed.done", user_hash=paths.uhash, model=embedder.spec.model_id, chunks=chunks,
             seconds=round(time.monotonic() - started, 3))


def tenants_to_rebuild(data_dir: Path, embedder: Embedder) -> tuple[list[str], list[str]]:
    """(tenants whose memory carries another model's stamp, tenants whose sources have no usable
    memory: none, or a damaged one — lost or corrupted files, which nothing else would rebuild
    before the user's next conversation)."""
    if not data_dir.is_dir():
        return [], []
    stale: list[str] = []
    unbuilt: list[str] = []
    for tenant in sorted(data_dir.iterdir()):
        need = _need(tenant, embedder) if USER_HASH.fullmatch(tenant.name) else None
        if need == "reembed":
            stale.append(tenant.name)
        elif need == "rebuild":
            unbuilt.append(tenant.name)
    return stale, unbuilt


def _need(tenant: Path, embedder: Embedder) -> str | None:
    # One memory that cannot be opened now must not stop the indexer from starting for every
    # other tenant: it is left to its own index runs, which fail and are counted there.
    try:
        stamp = stamp_of(tenant)
    except Exception as exc:
        log.warning("reembed.memory_unreadable", user_hash=tenant.name, **loggable_failure(exc))
        return None
    if stamp is None:
        return "rebuild" if TenantPaths(tenant).has_conversations() else None
    return "reembed" if stamp != model_stamp(embedder) else None


async def schedule_stale_tenants(client: aioredis.Redis, data_dir: Path, embedder: Embedder) -> int:
    """Make due now every tenant with another model's stamp (the scheduler re-embeds them one
    index slot at a time, like any index run) and every tenant with sources but no usable memory
    (its run rebuilds it); how many. NX: an already due tenant keeps its time."""
    stale, unbuilt = await asyncio.to_thread(tenants_to_rebuild, data_dir, embedder)
    if stale or unbuilt:
        pipe = client.pipeline(transaction=True)
        if stale:
            pipe.sadd(keys.REEMBED_PENDING, *stale)
        pipe.zadd(keys.DUE, {uhash: time.time() for uhash in stale + unbuilt}, nx=True)
        await pipe.execute()
        log.info("reembed.scheduled", memories=len(stale), rebuilds=len(unbuilt), model=embedder.spec.model_id)
    REEMBED_PENDING.set(await client.scard(keys.REEMBED_PENDING))
    return len(stale) + len(unbuilt)
