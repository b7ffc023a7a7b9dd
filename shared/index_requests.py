"""Asking the indexers for a tenant's index run: the due list every indexer worker polls (a zset
user_hash -> the time its next run may start). The indexer puts a tenant there after each
snapshot it writes; the recall service asks for a tenant whose stored conversations have no
usable memory (lost or damaged files: the run rebuilds it), so an idle tenant heals too. A
tenant on the list has conversations stored that its memory does not hold yet (`pending`), so an
answer of nothing can say they were not searched."""

from __future__ import annotations

import asyncio
import time

from shared.logging_setup import get_logger
from shared.redis_client import async_redis

DUE = "recall:index:due"
ASK_EVERY_S = 30.0  # one request per tenant per this long: a tenant's every failing call must not write to Redis
PENDING_WAIT_S = 0.25  # an answer is not held longer than this by a slow or absent Redis

log = get_logger("recall.index_requests")


class IndexRequests:
    def __init__(self, redis_url: str) -> None:
        self._client = async_redis(redis_url)
        self._asked: dict[str, float] = {}

    async def ask(self, uhash: str) -> None:
        """Best effort: with Redis away the tenant waits for its next conversation or an indexer's start."""
        now = time.monotonic()
        if now - self._asked.get(uhash, -ASK_EVERY_S) < ASK_EVERY_S:
            return
        if len(self._asked) >= 10_000:  # a bounded map, whatever the tenant count: at worst a tenant is asked again
            self._asked.clear()
        self._asked[uhash] = now
        try:
            await self._client.zadd(DUE, {uhash: time.time()}, nx=True)  # an already due tenant keeps its time
            log.info("recall.index_requested", user_hash=uhash)
        except Exception as exc:  # noqa: BLE001 - Redis away: recall answers all the same
            log.warning("recall.index_request_failed", user_hash=uhash, error=type(exc).__name__)

    async def pending(self, uhash: str) -> bool:
        """Whether an index run of the tenant is due or under way (best effort: False when Redis
        does not answer at once)."""
        try:
            return await asyncio.wait_for(self._client.zscore(DUE, uhash), PENDING_WAIT_S) is not None
        except Exception:  # noqa: BLE001 - Redis away or slow: the answer goes without the note
            return False

    async def close(self) -> None:
        await self._client.aclose()
