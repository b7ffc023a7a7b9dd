"""Remove consumers of the group that are gone: Kubernetes names each worker after its pod, so
every restart leaves a consumer behind, and XINFO CONSUMERS / XPENDING summaries fill up with
the dead.

Only a consumer with nothing pending is removed (its messages would otherwise be lost to the
reclaimer's view), and only after it has been idle for an hour. Removing a live but quiet
worker is harmless: its next XREADGROUP recreates it.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from shared.logging_setup import get_logger

log = get_logger("recall.indexer.consumers")

STALE_AFTER_MS = 3_600_000
SWEEP_EVERY_S = 600.0
# Atomic: a message delivered between XINFO and the removal would otherwise vanish from the
# pending list with its consumer (and never be reclaimed).
_DELETE_IF_IDLE = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
"""


async def remove_stale_consumers(client: aioredis.Redis, stream: str, group: str, keep: set[str],
                                 idle_ms: int = STALE_AFTER_MS) -> list[str]:
    removed = []
    for c in await client.xinfo_consumers(stream, group):
        name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
        if name in keep or c["pending"] or c["idle"] < idle_ms:
            continue
        if await client.eval(_DELETE_IF_IDLE, 1, stream, group, name):
            removed.append(name)
    if removed:
        log.info("consumers.removed", count=len(removed))
    return removed


async def reap_forever(client: aioredis.Redis, stream: str, group: str, keep: set[str]) -> None:
    while True:
        try:
            await remove_stale_consumers(client, stream, group, keep)
        except aioredis.RedisError as exc:
            log.warning("consumers.reap_failed", error=type(exc).__name__)
        await asyncio.sleep(SWEEP_EVERY_S)
