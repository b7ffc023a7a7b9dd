"""Forget events carried out beside the stream's message slots, not in them.

A forget waits for its user's index lock (up to the index timeout) and, in funes mode, may
rebuild the whole memory. Handled in a message slot, a few forgets of one user held every slot
of a worker while the first one ran, and every other user's turns waited behind them (~105 s
in a fault trial). So the message handler hands a forget here and returns; its entry stays
pending, kept from looking idle (so no other worker reclaims it), until the forget is done and
acked, or failed (then the reclaimer redelivers it, as before; Redis unreachable is tried
again here).

One user's forgets run one at a time, in the order they reach the queue; forgets of different users run
`running` at once, counted from when each holds its user's index lock; past `held` forgets in
this process the handler waits for room (the stream keeps the rest). Where a forget rebuilds the
user's whole memory (funes without `forget`), the user's conversation forgets waiting their turn
share the rebuild of the one running (Forgetter.forget's `alongside`): a burst of N deletions, a
retention sweep's among them, was N rebuilds one after the other."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from services.indexer.forgetting import Forgetter
from services.indexer.metrics import FORGETS_HELD
from shared.error_site import loggable_failure
from shared.logging_setup import get_logger
from shared.stream_schema import ForgetEvent
from shared.task_cancel import cancel_and_wait

log = get_logger("recall.indexer.forget")

KEEP_BATCH = 500  # entries one XCLAIM keeps pending
REDIS_RETRY_MAX_S = 30.0


@dataclass
class _UserForgets:
    turn: asyncio.Lock = field(default_factory=asyncio.Lock)  # one forget of the user at a time
    held: int = 0
    not_begun: dict[str, ForgetEvent] = field(default_factory=dict)  # entry id → a forget waiting its turn


class ForgetQueue:
    def __init__(self, forgetter: Forgetter, ack: Callable[[str], Awaitable[None]],
                 keep_pending: Callable[[list[str]], Awaitable[None]], keep_every_s: float, running: int,
                 held: int) -> None:
        self._forgetter, self._ack, self._keep_pending, self._keep_every_s = forgetter, ack, keep_pending, keep_every_s
        self._running = asyncio.Semaphore(running)
        self._room = asyncio.Semaphore(held)
        self._tasks: dict[str, asyncio.Task] = {}  # entry id → its forget (admitted or waiting for room)
        self._users: dict[str, _UserForgets] = {}
        self._rows_gone: set[str] = set()  # held forgets whose rows another forget's rebuild removed
        self._keeper: asyncio.Task | None = None
        self._stopping = False

    def holds(self, entry_id: str) -> bool:
        """Whether this entry is held here: a redelivery of it (a late heartbeat) is not a new
        forget, nor a failed one to dead-letter."""
        return entry_id in self._tasks

    async def submit(self, entry_id: str, event: ForgetEvent) -> None:
        """Take a forget; returns once it is admitted (waiting only while `held` forgets are)."""
        if self._stopping or entry_id in self._tasks:
            return  # stays pending for another worker; or already held here, which acks it
        if self._keeper is None:
            self._keeper = asyncio.create_task(self._keep_all_pending())
        user = self._users.setdefault(event.user_hash, _UserForgets())
        user.held += 1
        user.not_begun[entry_id] = event
        admitted = asyncio.Event()
        task = asyncio.create_task(self._carry_out(entry_id, event, user, admitted))
        self._tasks[entry_id] = task
        FORGETS_HELD.set(len(self._tasks))
        waiting = asyncio.create_task(admitted.wait())
        try:
            await asyncio.wait([waiting, task], return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()

    async def _keep_all_pending(self) -> None:
        """Every entry held here (admitted or waiting for room: one left to wait without this was
        reclaimed and held twice) is kept from looking idle, a few XCLAIMs per period."""
        while True:
            await asyncio.sleep(self._keep_every_s)
            held = list(self._tasks)
            for start in range(0, len(held), KEEP_BATCH):
                with contextlib.suppress(aioredis.RedisError):  # Redis away for a moment: the next period tries again
                    await self._keep_pending(held[start:start + KEEP_BATCH])

    async def _carry_out(self, entry_id: str, event: ForgetEvent, user: _UserForgets, admitted: asyncio.Event) -> None:
        roomed = False
        try:
            await self._room.acquire()
            roomed = True
            admitted.set()
            async with user.turn:
                if self._stopping:
                    return  # not begun: left pending for another worker
                del user.not_begun[entry_id]
                await self._until_redis_answers(entry_id, event, user)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("message.failed", entry_id=entry_id, **loggable_failure(exc))  # the reclaimer redelivers it
        finally:
            if roomed:
                self._room.release()
            self._release(entry_id, event.user_hash)

    async def _until_redis_answers(self, entry_id: str, event: ForgetEvent, user: _UserForgets) -> None:
        """The forget, and its ack. Redis unreachable is tried again here, the entry still held:
        given back to the reclaimer, every held forget of the user failed in turn at each outage,
        each delivery counted, and five outages dead-lettered forgets that had never begun."""
        def alongside() -> dict[str, ForgetEvent]:
            return {other_id: other for other_id, other in user.not_begun.items() if other.kind == "forget_conversation"}

        pause = 0.5
        while True:
            try:
                # The forget slot is taken once the user's index lock is held: a forget waiting
                # for a lock another worker holds (its rebuild) takes no slot from other users.
                self._rows_gone.update(await self._forgetter.forget(
                    entry_id, event, slot=self._running, alongside=alongside, rows_gone=entry_id in self._rows_gone))
                await self._ack(entry_id)
                return
            except (aioredis.ConnectionError, aioredis.TimeoutError) as exc:
                if self._stopping:
                    raise
                log.warning("forget.redis_unreachable", entry_id=entry_id, retry_in_s=pause, error=type(exc).__name__)
                await asyncio.sleep(pause)
                pause = min(pause * 2, REDIS_RETRY_MAX_S)

    def _release(self, entry_id: str, uhash: str) -> None:
        del self._tasks[entry_id]
        self._rows_gone.discard(entry_id)
        user = self._users[uhash]
        user.not_begun.pop(entry_id, None)
        user.held -= 1
        if not user.held:
            del self._users[uhash]
        FORGETS_HELD.set(len(self._tasks))

    async def join(self) -> None:
        """Until every forget held now is done, failed or cancelled."""
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    async def stop(self, grace_s: float) -> None:
        """Forgets not begun stay pending (another worker reclaims them); running ones get
        `grace_s`, then are cancelled (a cancelled funes child is killed; the redelivery goes on)."""
        self._stopping = True
        tasks = list(self._tasks.values())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace_s)
            if left := await cancel_and_wait(late):
                log.warning("forget.not_stopped", forgets=len(left))  # they stay pending for another worker
        if self._keeper is not None:
            await cancel_and_wait([self._keeper])
