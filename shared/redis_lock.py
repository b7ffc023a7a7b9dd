"""A Redis lock with an owner token and an expiry, renewed while its holder works.

Only the owner can renew or release it (compare-and-act in Lua), and a holder that dies
simply lets it expire, so another replica can take over after at most one TTL.

A holder that is still alive but lost the lock (a renewal found another owner or no key, e.g.
after a long pause or a Redis failover) must stop writing: `guard()` cancels the work and
raises LockLost, and `fence()` gives a worker thread a check to call right before it commits
(it re-confirms ownership in Redis and extends the expiry, or raises LockLost).

A lock can be made to yield (`yields_to`): while a key of that name exists, its next renewal
gives it up as if lost (`yielded` tells the two apart). A user's index run yields this way to
a forget of that user, which would otherwise wait for the whole run (up to the index timeout).
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
# 2: still ours, but someone waiting for it asked us to yield (the lock is left to expire or be released).
_RENEW_OR_YIELD = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 2 end
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"""
YIELD_POLL_S = 0.5  # how soon a yielding lock notices the request
_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end"
# SET NX that a retry cannot misreport: the services' connections send a command again when its
# connection failed (shared/redis_client.py), also after Redis ran it and only the reply was lost.
# A plain SET NX then answered "taken" for the lock its first send had taken, and its holder
# waited for its own lock to expire.
_ACQUIRE = """
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if held then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


class RedisLock:
    def __init__(self, client: aioredis.Redis, key: str, ttl_s: float, yields_to: str | None = None) -> None:
        self.client = client
        self.key = key
        self.yields_to = yields_to
        self.yielded = False
        self.given_up = False
        self.ttl_ms = max(100, int(ttl_s * 1000))
        self.token = secrets.token_hex(16)
        self._renewer: asyncio.Task | None = None
        self._released = False
        self.lost = False
        self._lost_event = asyncio.Event()

    async def acquire(self) -> bool:
        return bool(await self.client.eval(_ACQUIRE, 1, self.key, self.token, self.ttl_ms))

    async def acquire_wait(self, timeout_s: float, poll_s: float = 0.02) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not await self.acquire():
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(poll_s)
        return True

    def keep_alive(self) -> None:
        """Renew every third of the TTL (a yielding lock: every YIELD_POLL_S) until released; a
        failed renewal marks the lock lost."""
        period = min(self.ttl_ms / 3000, YIELD_POLL_S) if self.yields_to else self.ttl_ms / 3000

        async def renew() -> None:
            while not self._released:
                await asyncio.sleep(period)
                try:
                    if not await self._renew():
                        # Released meanwhile: a renewal the cancellation did not stop (a loaded
                        # indexer's redis client can turn it into a timeout it retries) found the
                        # key gone, and a run that had committed was counted as a lost lock.
                        if not self._released:
                            self._mark_lost()
                        return
                except aioredis.RedisError:
                    continue  # a blip: try again before the TTL runs out (if it ran out, the next try says so)

        self._renewer = asyncio.create_task(renew())

    async def _renew(self) -> bool:
        if self.yields_to is None:
            return bool(await self.client.eval(_RENEW, 1, self.key, self.token, self.ttl_ms))
        held = await self.client.eval(_RENEW_OR_YIELD, 2, self.key, self.yields_to, self.token, self.ttl_ms)
        if held == 2:
            self.yielded = True
            return False
        return bool(held)

    def give_up(self) -> None:
        """Its holder is stopping (SIGTERM): the work stops as if the lock were lost and `guard()`
        cancels it, but the lock is still held, so `fence()` lets a last commit of what was done
        through while Redis confirms it; the caller still releases the lock. A lock already lost
        (or yielded to a forget) stays as it was: that is why its work stopped."""
        if self.lost:
            return
        self.given_up = self.yielded = True
        self._mark_lost()

    def _mark_lost(self) -> None:
        if not self.lost:
            self.lost = True
            if self.yielded:
                log.info("lock.given_up" if self.given_up else "lock.yielded", key=self.key)
            else:
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
            if self.lost and not self.given_up:  # given up (a stop): still ours if Redis says so
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
        self._released = True
        if self._renewer is not None:
            self._renewer.cancel()
        try:
            await self.client.eval(_RELEASE, 1, self.key, self.token)
        except aioredis.RedisError:
            pass  # it expires by itself
