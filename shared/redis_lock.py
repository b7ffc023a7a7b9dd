"""A Redis lock with an owner token and an expiry, renewed while its holder works.

Only the owner can renew or release it (compare-and-act in Lua), and a holder that dies
simply lets it expire, so another replica can take over after at most one TTL.

A holder that is still alive but lost the lock (a renewal found another owner or no key, e.g.
after a long pause or a Redis failover) must stop writing: `guard()` cancels the work and
raises LockLost, and `fence()` gives a worker thread a check to call right before it commits
(it re-confirms ownership in Redis and extends the expiry, or raises LockLost).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
from prometheus_client import Counter

from shared.logging_setup import get_logger

log = get_logger("recall.lock")
LOCKS_LOST = Counter("recall_locks_lost_total", "Locks a live holder lost (its work was aborted or fenced).")
FENCE_TIMEOUT_S = 5.0
T = TypeVar("T")


class LockLost(Exception):
    """The lock expired or has another owner: whatever its holder was doing must not commit."""

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
        self._lost_event = asyncio.Event()

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
        """Renew every third of the TTL until released; a failed renewal marks the lock lost."""

        async def renew() -> None:
            while True:
                await asyncio.sleep(self.ttl_ms / 3000)
                try:
                    if not await self._renew():
                        self._mark_lost()
                        return
                except aioredis.RedisError:
                    continue  # a blip: try again before the TTL runs out (if it ran out, the next try says so)

        self._renewer = asyncio.create_task(renew())

    async def _renew(self) -> bool:
        return bool(await self.client.eval(_RENEW, 1, self.key, self.token, self.ttl_ms))

    def _mark_lost(self) -> None:
        if not self.lost:
            self.lost = True
            LOCKS_LOST.inc()
            log.warning("lock.lost", key=self.key)
        self._lost_event.set()

    async def guard(self, work: Awaitable[T]) -> T:
        """Await `work`; if the lock is lost first, cancel it and raise LockLost."""
        task = asyncio.ensure_future(work)
        lost = asyncio.create_task(self._lost_event.wait())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            lost.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise LockLost(self.key)

    def fence(self) -> Callable[[], None]:
        """A check for a worker thread to call right before it commits (see the module doc)."""
        loop = asyncio.get_running_loop()

        def confirm() -> None:
            if self.lost:
                raise LockLost(self.key)
            try:
                held = asyncio.run_coroutine_threadsafe(self._renew(), loop).result(FENCE_TIMEOUT_S)
            except Exception:  # Redis unreachable or too slow: ownership cannot be shown, so do not commit
                held = False
            if not held:
                loop.call_soon_threadsafe(self._mark_lost)
                raise LockLost(self.key)

        return confirm

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
