"""A Redis lock with an owner token and an expiry, renewed while its holder works.

Only the owner can renew or release it (compare-and-act in Lua), and a holder that dies
simply lets it expire, so another replica can take over after at most one TTL.
"""

from __future__ import annotations

import asyncio
import secrets

import redis.asyncio as aioredis

_RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) else return 0 end"
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"


class RedisLock:
    def __init__(self, client: aioredis.Redis, key: str, ttl_s: float) -> None:
        self.client = client
        self.key = key
        self.ttl_ms = max(100, int(ttl_s * 1000))
        self.token = secrets.token_hex(16)
        self._renewer: asyncio.Task | None = None
        self.lost = False

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
        """Renew every third of the TTL until released; `lost` turns true if it was taken away."""

        async def renew() -> None:
            while True:
                await asyncio.sleep(self.ttl_ms / 3000)
                try:
                    if not await self.client.eval(_RENEW, 1, self.key, self.token, self.ttl_ms):
                        self.lost = True
                        return
                except aioredis.RedisError:
                    continue  # a blip: try again before the TTL runs out

        self._renewer = asyncio.create_task(renew())

    async def release(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        try:
            await self.client.eval(_RELEASE, 1, self.key, self.token)
        except aioredis.RedisError:
            pass  # it expires by itself
