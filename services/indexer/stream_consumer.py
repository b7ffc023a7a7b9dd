"""Handling one stream message: validate, write the snapshot, schedule the index run, ack.

The message is acked (XACK and XDEL in one transaction, so no message text outlives its
processing) only after the snapshot is durably on disk. A failure leaves it pending; another
delivery comes through the reclaimer after `reclaim_idle_ms`, waiting out an exponential
backoff first; after `max_deliveries` it goes to the dead-letter stream with the reason.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import redis.asyncio as aioredis
from pydantic import ValidationError

from services.indexer import redis_keys as keys
from services.indexer.forget_queue import ForgetQueue
from services.indexer.forgetting import Forgetter
from services.indexer.index_scheduler import mark_dirty
from services.indexer.metrics import DEAD_LETTERS, RETRIES, SNAPSHOTS
from services.indexer.settings import IndexerSettings
from services.indexer.snapshot_writer import WriteResult, write_snapshot
from shared.logging_setup import get_logger
from shared.redis_lock import RedisLock
from shared.stream_schema import ForgetEvent, StreamEvent, TurnsEvent, dead_letter_stream, parse_event
from shared.tenant_paths import USER_HASH, TenantPaths, UnsafeId, check_conversation_id

# Dead-letter an entry in one step: the consumer whose XACK takes it off the pending list
# writes the record, so the worker whose handler ran past the reclaim idle time and the
# reclaimer that took it over write one record between them; and nothing is acked without its
# record (a claim key set in a step of its own, then a kill -9, left the redelivery to ack the
# entry as "already dead-lettered": the event was gone, no record anywhere). Never trimmed: a
# cap drops the oldest dead letters, a failed forget among them; growth is alerted from the
# first one (RecallDeadLetters) and bounded by Redis's memory alerts.
_DEAD_LETTER = """
local acked = redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if acked == 1 then redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3)) end
redis.call('XDEL', KEYS[1], ARGV[2])
return acked
"""

log = get_logger("recall.indexer.consumer")


class Poison(Exception):
    """A message that can never succeed (bad schema): dead-lettered at once."""


async def store_snapshot(client: aioredis.Redis, s: IndexerSettings, event: TurnsEvent, entry_id: str,
                         wait_s: float) -> WriteResult:
    """Write a conversation's snapshot under its lock and make its user due (the stream, or a
    dead letter replayed)."""
    paths = TenantPaths.for_hash(s.data_dir, event.user_hash)
    lock = RedisLock(client, keys.conversation_lock(event.user_hash, event.conversation_id), 30)
    async with lock.held(wait_s=wait_s):
        result, grown = await asyncio.to_thread(_write_measured, paths, event, entry_id, s.engine == "funes")
    if result is not WriteResult.STALE:
        await mark_dirty(client, event.user_hash, event.received_at, s.index_debounce_s, grown)
    return result


def _write_measured(paths: TenantPaths, event: TurnsEvent, entry_id: str, tell_rewrites: bool) -> tuple[WriteResult, int]:
    """write_snapshot, and how many bytes the conversation's file grew by: what the next index
    run embeds, roughly (the scheduler's heavy runs), known without parsing anything."""
    target = paths.transcript(event.conversation_id)
    before = _size(target)
    result = write_snapshot(paths, event, entry_id, tell_rewrites)
    return result, max(0, _size(target) - before)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class StreamConsumer:
    def __init__(self, client: aioredis.Redis, settings: IndexerSettings, forgetter: Forgetter) -> None:
        self.client = client
        self.s = settings
        self.forgets = ForgetQueue(forgetter, self.ack, self.keep_pending, settings.reclaim_idle_ms / 3000,
                                   settings.forget_concurrency, settings.forgets_held)

    async def handle(self, entry_id: str, fields: dict, deliveries: int) -> None:
        if deliveries > 1:
            RETRIES.inc()
        if self.forgets.holds(entry_id):
            return  # a forget at work here, reclaimed all the same (a late heartbeat): not failed, not new
        if deliveries > self.s.max_deliveries:
            await self.dead_letter(entry_id, fields, deliveries, "max deliveries exceeded")
            return
        if deliveries > 1:
            await asyncio.sleep(min(self.s.retry_backoff_s * 2 ** (deliveries - 2), 30.0))
        try:
            event = self._parse(fields)
            if isinstance(event, ForgetEvent):
                await self.forgets.submit(entry_id, event)  # acked there once carried out
                return
            await self._store(entry_id, event)
        except Poison as exc:
            await self.dead_letter(entry_id, fields, deliveries, str(exc))
            return
        await self.ack(entry_id)

    async def keep_pending(self, entry_ids: list[str]) -> None:
        """Keep entries at work here from looking idle, so no worker reclaims them: XCLAIM …
        JUSTID resets their idle time, not their delivery count (one command for many)."""
        await self.client.xclaim(self.s.stream, self.s.group, self.s.consumer, min_idle_time=0,
                                 message_ids=entry_ids, justid=True)

    @staticmethod
    def _parse(fields: dict) -> StreamEvent:
        try:
            event = parse_event(fields)
            if not USER_HASH.fullmatch(event.user_hash):
                raise UnsafeId("user_hash is not a tenant hash")
            if event.conversation_id is not None:
                check_conversation_id(event.conversation_id)  # it names a file
            return event
        except (KeyError, TypeError, ValidationError, ValueError) as exc:
            raise Poison(f"invalid event: {type(exc).__name__}") from exc

    async def _store(self, entry_id: str, event: TurnsEvent) -> None:
        SNAPSHOTS.labels((await store_snapshot(self.client, self.s, event, entry_id, wait_s=10)).value).inc()

    async def ack(self, entry_id: str) -> None:
        """Acknowledge and delete the entry (one transaction: no message text outlives its processing)."""
        pipe = self.client.pipeline(transaction=True)
        pipe.xack(self.s.stream, self.s.group, entry_id)
        pipe.xdel(self.s.stream, entry_id)
        await pipe.execute()

    async def dead_letter(self, entry_id: str, fields: dict, deliveries: int, reason: str) -> None:
        # The ids as plain fields too, so a forget finds the record without parsing it.
        record = {"entry_id": entry_id, "reason": reason, "deliveries": str(deliveries),
                  "user_hash": str(fields.get("user_hash", "")), "conversation_id": str(fields.get("conversation_id", "")),
                  "fields": json.dumps(fields, default=str)}
        flat = [part for pair in record.items() for part in pair]
        recorded = await self.client.eval(_DEAD_LETTER, 2, self.s.stream, dead_letter_stream(self.s.stream),
                                          self.s.group, entry_id, *flat)
        if not recorded:
            return  # another consumer already dead-lettered this very entry (or a forget purged it)
        DEAD_LETTERS.labels(reason.split(":")[0]).inc()
        log.error("message.dead_lettered", entry_id=entry_id, reason=reason, deliveries=deliveries,
                  user_hash=fields.get("user_hash"))
