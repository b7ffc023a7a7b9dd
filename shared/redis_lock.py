"""A Redis lock with an owner token and an expiry, renewed while its holder works.

Only the owner can renew or release it (compare-and-act in Lua), and a holder that dies
simply lets it expire, so another replica can take over after at most one TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from shared.logging_setup import get_logger

log = get_logger("recall.lock")

_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end"
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"


class RedisLock:
    def __init__(self, client: aioredis.Redis, key: str, ttl_s: float) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = max(100, int(ttl_s * 1000))
        self.token = secrets.token_hex(16)
        self._renewer: asyncio.Task | None = None

    async def acquire(self) -> bool:
        return bool(await self.client.set(self.key, self.token, nx=True, px=self.ttl_ms))

    async def acquire_wait(self, timeout_s: float, poll_s: float = 0.02) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not await self.acquire():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    def keep_alive(self) -> None:
        """Renew every third of the TTL until released (a lock that expired anyway is logged)."""

        async def renew() -> None:
            while True:
                await asyncio.sleep(self.ttl_ms / 3000)
                try:
                    if not await self.client.eval(_RENEW, 1, self.key, self.token, self.ttl_ms):
                        log.warning("lock.lost", key=self.key)
                        return
                except aioredis.RedisError:
                    continue  # a blip: try again before the TTL runs out

        self._renewer = asyncio.create_task(renew())

    @contextlib.asynccontextmanager
    async def held(self, wait_s: float, renew: bool = False) -> AsyncIterator[None]:
        """Hold the lock for a block (waiting up to wait_s; TimeoutError if it stays busy)."""
        if not await self.acquire_wait(wait_s):
            raise TimeoutError(f"lock {self.key} stayed busy for {wait_s:.0f}s")
        if renew:
            self.keep_alive()
        try:
            yield
        finally:
            await self.release()

    async def release(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        try:
            await self.client.eval(_RELEASE, 1, self.key, self.token)
        except aioredis.RedisError:
            pass  # it expires by itself
