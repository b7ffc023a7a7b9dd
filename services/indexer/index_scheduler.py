"""Per-user index runs, debounced and coordinated across all indexer replicas through Redis.

- A snapshot write bumps the user's `dirty` counter and puts the user in the `due` zset
  (NX: the first write of a burst sets when the run may start, later ones do not push it).
- Every worker polls `due`; whoever takes the user's lock (token + expiry, renewed while the
  job runs) runs the job. So there are never two concurrent runs on one user's memory.
- A run remembers the `dirty` value it started with. When it finishes, one Lua step either
  clears the user (nothing was written meanwhile) or re-arms it after the debounce: a write
  that lands during a run causes exactly one more run.
- A worker that dies mid-run leaves the user due; its lock expires and another worker runs it.
- Fairness: a write also adds how many bytes it grew the user's transcripts by (`pending-bytes`);
  a user with at least `heavy_bytes` of them is a heavy run (a pasted log of 150,000 characters
  embeds for minutes on two cores). A worker runs one heavy run at a time and passes over other
  heavy users meanwhile (they stay due, first in line, for its next free heavy turn or another
  replica's), so its other slots keep indexing small users: two such pastes held both slots of a
  worker and everyone's new turns waited minutes to become searchable.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import redis.asyncio as aioredis

from services.indexer import redis_keys as keys
from services.indexer.index_job import IndexJob
from services.indexer.memory_return import return_free_memory
from services.indexer.metrics import (INDEX_HEAVY_RUNNING, INDEX_JOB_FAILURES, INDEX_JOB_SECONDS, INDEX_RUNNING,
                                      INGEST_TO_SEARCHABLE)
from shared.engine.memory_lock import MemoryBusy
from shared.error_site import loggable_failure
from shared.logging_setup import get_logger
from shared.redis_lock import LockLost, RedisLock
from shared.tenant_paths import TenantPaths

log = get_logger("recall.indexer.scheduler")

FINISH_ON_STOP_S = 5.0  # how long a stopping indexer lets its running index runs end before they give up
_MARK_DIRTY = """
redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], 'NX', ARGV[1], ARGV[2])
if ARGV[3] ~= '' then redis.call('RPUSH', KEYS[3], ARGV[3]) end
if ARGV[4] ~= '0' then redis.call('INCRBY', KEYS[4], ARGV[4]) end
"""
# A run covered the bytes it read at its start; bytes written during it stay for the next run.
_FINISH = """
local cur = redis.call('GET', KEYS[1])
if (cur == false and ARGV[1] == '') or cur == ARGV[1] then
  redis.call('DEL', KEYS[1], KEYS[3]); redis.call('ZREM', KEYS[2], ARGV[2]); return 1
end
if redis.call('DECRBY', KEYS[3], ARGV[4]) <= 0 then redis.call('DEL', KEYS[3]) end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2]); return 0
"""
# Due users read at a time; the scheduler reads further pages while it passes users over (run
# elsewhere, a forget waiting, heavy), up to DUE_SCAN of them per poll.
DUE_PAGE = 32
DUE_SCAN = 256


async def mark_dirty(client: aioredis.Redis, uhash: str, received_at: float | None, debounce_s: float,
                     grown_bytes: int = 0) -> None:
    """Schedule the user's next index run; `received_at` (when ingest accepted the snapshot)
    feeds ingest-to-searchable, None for a write that is no new snapshot; `grown_bytes`, how much
    the write grew the user's transcripts, tells a heavy run before it starts."""
    await client.eval(_MARK_DIRTY, 4, keys.dirty(uhash), keys.DUE, keys.received(uhash), keys.pending_bytes(uhash),
                      time.time() + debounce_s, uhash, "" if received_at is None else repr(received_at), max(0, grown_bytes))


class IndexScheduler:
    def __init__(self, client: aioredis.Redis, job: IndexJob, data_dir, debounce_s: float, lock_ttl_s: float,
                 concurrency: int, heavy_bytes: int = 65_536, poll_s: float = 0.05) -> None:
        self.client = client
        self.job = job
        self.data_dir = data_dir
        self.debounce_s = debounce_s
        self.lock_ttl_s = lock_ttl_s
        self.concurrency = concurrency
        self.heavy_bytes = heavy_bytes
        self.poll_s = poll_s
        self.running: dict[str, tuple[asyncio.Task, RedisLock]] = {}  # the lock, so that a stop can make a run give up
        self.heavy: set[str] = set()  # the users of `running` whose run is heavy (at most one)
        self._stopping = asyncio.Event()

    async def run_forever(self) -> None:
        while not self._stopping.is_set():
            try:
                await self._tick()
            except aioredis.RedisError as exc:
                log.warning("scheduler.redis_error", error=type(exc).__name__)
                await asyncio.sleep(1.0)
            try:
                await asyncio.wait_for(self._stopping.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass

    async def _tick(self) -> None:
        now = time.time()
        for start in range(0, DUE_SCAN, DUE_PAGE):
            if len(self.running) >= self.concurrency or self._stopping.is_set():
                return
            page = [raw.decode() if isinstance(raw, bytes) else raw
                    for raw in await self.client.zrangebyscore(keys.DUE, "-inf", now, start=start, num=DUE_PAGE)]
            if not page:
                return
            checks = self.client.pipeline(transaction=False)
            for uhash in page:
                checks.exists(keys.forget_waiting(uhash))
                checks.get(keys.pending_bytes(uhash))
            answers = await checks.execute()
            for uhash, forget_waits, pending in zip(page, answers[::2], answers[1::2]):
                if uhash in self.running:
                    continue
                if forget_waits:
                    continue  # a forget of this user goes first; the user stays due
                heavy = int(pending or 0) >= self.heavy_bytes
                if heavy and self.heavy:
                    continue  # one heavy run per worker; the user stays due, first in line
                if not await self._start(uhash, heavy):
                    continue
                if len(self.running) >= self.concurrency or self._stopping.is_set():
                    return
            if len(page) < DUE_PAGE:
                return

    async def _start(self, uhash: str, heavy: bool) -> bool:
        """Take the user's lock and start its run; False if another replica runs it (it stays due)."""
        lock = RedisLock(self.client, keys.index_lock(uhash), self.lock_ttl_s, yields_to=keys.forget_waiting(uhash))
        if not await lock.acquire():
            return False
        if self._stopping.is_set():  # the stop began while the lock was taken: the user stays due
            await lock.release()
            return False
        if heavy:
            self.heavy.add(uhash)
            INDEX_HEAVY_RUNNING.set(len(self.heavy))
        self.running[uhash] = (asyncio.create_task(self._run(uhash, lock)), lock)
        INDEX_RUNNING.set(len(self.running))
        return True

    async def _run(self, uhash: str, lock: RedisLock) -> None:
        lock.keep_alive()
        started = time.monotonic()
        outcome = "ok"
        try:
            # One atomic read: a write lands either in both (this run covers it) or in neither
            # (it bumps `dirty`, so the finish step schedules the next run).
            snapshot = self.client.pipeline(transaction=True)
            snapshot.get(keys.dirty(uhash))
            snapshot.lrange(keys.received(uhash), 0, -1)
            snapshot.get(keys.pending_bytes(uhash))
            dirty_at_start, received, pending_at_start = await snapshot.execute()
            await self.job.run(TenantPaths.for_hash(self.data_dir, uhash), lock=lock)
            committed = time.time()
            for t in received:
                INGEST_TO_SEARCHABLE.observe(max(0.0, committed - float(t)))
            pipe = self.client.pipeline(transaction=True)
            pipe.ltrim(keys.received(uhash), len(received), -1)
            pipe.eval(_FINISH, 3, keys.dirty(uhash), keys.DUE, keys.pending_bytes(uhash), dirty_at_start or "", uhash,
                      time.time() + self.debounce_s, int(pending_at_start or 0))
            pipe.srem(keys.REEMBED_PENDING, uhash)  # a finished run re-embedded first, if it had to
            await pipe.execute()
        except MemoryBusy:
            outcome = "busy"  # someone outside the scheduler holds the memory; stays due
            await self._stay_due(uhash, max(self.debounce_s, 0.5))
        except LockLost:
            # Another worker may own the user now, or a forget asked for the lock; this run
            # commits nothing more (what it committed before stays). It stays due.
            outcome = "stopped" if lock.given_up else "yielded" if lock.yielded else "lock_lost"
            await self._stay_due(uhash, max(self.debounce_s, 0.5))
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except Exception as exc:
            outcome = "failed"
            INDEX_JOB_FAILURES.inc()
            log.error("index.failed", user_hash=uhash, **loggable_failure(exc))
            await self._stay_due(uhash, 5.0)
        finally:
            INDEX_JOB_SECONDS.labels(outcome).observe(time.monotonic() - started)
            await lock.release()
            self.running.pop(uhash, None)
            INDEX_RUNNING.set(len(self.running))
            log.info("index.run", user_hash=uhash, outcome=outcome, seconds=round(time.monotonic() - started, 3))
            if uhash in self.heavy:
                try:  # before the next heavy run: what this one freed stays resident otherwise (memory_return.py)
                    await asyncio.to_thread(return_free_memory)
                finally:
                    self.heavy.discard(uhash)
                    INDEX_HEAVY_RUNNING.set(len(self.heavy))

    async def _stay_due(self, uhash: str, delay_s: float) -> None:
        """Put the next run `delay_s` out. With Redis down the user simply stays due as it was
        (its entry is removed only by a finished run), and the run task ends without an error."""
        with contextlib.suppress(aioredis.RedisError):
            await self.client.zadd(keys.DUE, {uhash: time.time() + delay_s})

    async def stop(self) -> None:
        """Start no new run (SIGTERM); give the running ones FINISH_ON_STOP_S to end, then have them
        give up their lock: they stop at their next checkpoint (an embedding batch; a funes child is
        killed), committing the whole conversations they embedded first, and their users stay due.
        Waiting for a long import to end held Ctrl-C until `recall up` killed the indexer."""
        self._stopping.set()
        if self.running:
            await asyncio.wait([task for task, _ in self.running.values()], timeout=FINISH_ON_STOP_S)
            for _, lock in list(self.running.values()):
                lock.give_up()
            await asyncio.gather(*(task for task, _ in self.running.values()), return_exceptions=True)
