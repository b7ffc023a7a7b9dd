"""Consumers left behind by dead workers are removed from the group; one with pending messages,
or a worker's own, never is (real redis-server)."""

from __future__ import annotations

import redis.asyncio as aioredis

from services.indexer.consumer_reaper import remove_stale_consumers
from shared.stream_schema import ensure_group

STREAM = "test:reaper:turns"


async def test_only_idle_consumers_with_nothing_pending_are_removed(r, redis_url):
    r.delete(STREAM)
    ensure_group(r, STREAM, "indexers")
    for _ in range(3):
        r.xadd(STREAM, {"kind": "turns"})
    [(_, [(first, _)])] = r.xreadgroup("indexers", "pod-gone", {STREAM: ">"}, count=1)
    r.xack(STREAM, "indexers", first)
    r.xreadgroup("indexers", "pod-crashed-mid-message", {STREAM: ">"}, count=1)  # stays pending
    r.xreadgroup("indexers", "me", {STREAM: ">"}, count=1)
    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await remove_stale_consumers(client, STREAM, "indexers", keep={"me"}, idle_ms=0) == ["pod-gone"]
        assert await remove_stale_consumers(client, STREAM, "indexers", keep=set()) == [], "not idle for an hour yet"
    finally:
        await client.aclose()
    names = {c["name"] for c in r.xinfo_consumers(STREAM, "indexers")}
    assert names == {"pod-crashed-mid-message", "me"}
