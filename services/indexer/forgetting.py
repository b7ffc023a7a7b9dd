"""Carrying out a forget event (a conversation, or a whole user).

In order, while holding the user's index lock (so no index run interleaves):
1. tombstone: the conversation's version file (or the user's tombstone) records the deletion's
   stream id, so a snapshot accepted before it can never be written again, whichever worker
   processes it and when; one accepted after it starts a new conversation;
2. the source file goes (a conversation) or the whole tenant directory (a user). A snapshot
   accepted after the deletion but written before it was carried out (by another worker,
   while this forget waited for the user's index lock) is newer than the tombstone and stays:
   a user's tree is set aside and such snapshots are moved back before it is deleted;
3. the index forgets the rows (`forget_rows.py`): embedded engine at once, funes by its
   `forget` command (or a rebuild from what remains where it has none);
4. stream entries of that conversation/user older than the deletion are deleted unprocessed
   (for a conversation, still under its lock, so a worker that picked one up meanwhile drops it
   as stale after the purge counted it, never before), and so are its dead-letter entries;
5. Redis rewrites its append-only file (and RDB, if configured), so the deleted text is not
   left in Redis's files either (redis_compaction);
6. recall replicas are told (pub/sub) to drop cached readers and `funes mcp` children;
7. the receipt becomes `done` with what was removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path

import redis.asyncio as aioredis

from services.indexer import redis_keys as keys
from services.indexer.forget_rows import RebuildContinues, make_forget_rows
from services.indexer.index_job import IndexJob
from services.indexer.index_scheduler import mark_dirty
from services.indexer.metrics import FORGOTTEN
from services.indexer.redis_compaction import DurableCompaction
from services.indexer.settings import IndexerSettings
from services.indexer.snapshot_writer import (
    move_snapshot_back,
    parse_version,
    snapshots_newer_than,
    tombstone_conversation,
    tombstone_user,
    user_deletion_version,
)
from shared.logging_setup import get_logger
from shared.redis_lock import RedisLock
from shared.stream_schema import FORGET_CHANNEL, DeletionReceipt, ForgetEvent, dead_letter_stream, decode_fields, deletion_key
from shared.tenant_paths import TenantPaths

log = get_logger("recall.indexer.forget")


REMOVED_KINDS = ("files", "chunks", "stream_entries", "dead_letters")  # a receipt's `removed`
LATE_RECEIPT_TTL_S = 7 * 86400  # a receipt made again after it expired is kept this long
# The forget-waiting request of a user: the set of its waiting forgets' tokens, with an expiry.
# A set, not a count: the services' connections send a command again when the connection failed
# after Redis ran it (shared/redis_client.py), and a count joined twice was never left, so the
# user's index runs yielded to nobody until it expired.
_JOIN_WAITING = "redis.call('SADD', KEYS[1], ARGV[1]) return redis.call('PEXPIRE', KEYS[1], ARGV[2])"
_LEAVE_WAITING = "redis.call('SREM', KEYS[1], ARGV[1]) return 1"
# What a step removed, added to the receipt once per token, so that the same resend adds nothing.
_TALLY = """
if redis.call('HSETNX', KEYS[1], 'tallied:' .. ARGV[1], 1) == 0 then return 0 end
for i = 2, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], 'removed:' .. ARGV[i], ARGV[i + 1]) end
return 1
"""
# A conversation forget counts its rows once per receipt, whichever attempt gets to count them.
_ROWS_TOKEN = "rows"
_FIRST_COUNT = """
redis.call('HSETNX', KEYS[1], 'before:' .. ARGV[1], ARGV[2])
return redis.call('HGET', KEYS[1], 'before:' .. ARGV[1])
"""


def set_tenant_aside(root: Path) -> Path | None:
    """Move a tenant's directory aside before deleting it: a reader opening the memory while
    the tree is deleted in place re-creates files in it (SQLite's -shm, tantivy's lock file),
    and a leftover file in `memory/` fails every later index run of that user (ENOTEMPTY on the
    swap). Once moved, the path is gone at once and what is opened there fails cleanly as "no
    memory". Returns the moved tree (`<hash>.forgotten`; scans of tenants skip it, not being a
    user hash), or None when there was no tree. A crash leaves it for the redelivered forget."""
    aside = aside_of(root)
    try:
        os.rename(root, aside)
    except FileNotFoundError:
        return None
    return aside


def aside_of(root: Path) -> Path:
    return root.with_name(root.name + ".forgotten")


TALLY_TOKEN = ".tallied"  # in a set-aside tree: which tally on the receipt counted it


def _read_token(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _delete_tallied_tree(tree: Path) -> None:
    """Like rmtree, but the tally token goes last: a tree interrupted while deleted still
    says it was counted, whatever rmtree's order."""
    for entry in tree.iterdir():
        if entry.name == TALLY_TOKEN:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
    shutil.rmtree(tree, ignore_errors=True)


def _original_fields(record: dict[str, str]) -> dict[str, str]:
    """The ids of a dead-letter record: plain fields, or (older records) inside its `fields` JSON."""
    if "user_hash" in record:
        return record
    try:
        original = json.loads(record.get("fields", "{}"))
    except ValueError:
        return {}
    return original if isinstance(original, dict) else {}


def _deletion_version(event: ForgetEvent, entry_id: str) -> str:
    """What the forget deletes up to: its own stream id, or the older snapshot a retention
    sweep found expired (never later than the forget itself)."""
    if event.version is not None and parse_version(event.version) < parse_version(entry_id):
        return event.version
    return entry_id


def _accepted_after(record: dict[str, str], deletion: tuple[int, int]) -> bool:
    try:
        return parse_version(record.get("entry_id", "")) > deletion
    except ValueError:  # an older record without its id: it goes with what is forgotten
        return False


class Forgetter:
    def __init__(self, client: aioredis.Redis, settings: IndexerSettings, job: IndexJob) -> None:
        self.client = client
        self.s = settings
        self.job = job
        self.rows = make_forget_rows(settings.engine, settings.funes_bin, job, settings.index_timeout_s)
        self.compaction = DurableCompaction(client, [settings.stream, dead_letter_stream(settings.stream)])

    async def forget(self, entry_id: str, event: ForgetEvent,
                     slot: contextlib.AbstractAsyncContextManager = contextlib.nullcontext(),
                     alongside: Callable[[], Mapping[str, ForgetEvent]] = dict, rows_gone: bool = False) -> list[str]:
        """Carry the forget out; `slot` is entered once the user's index lock is held (a worker's
        limit on forgets at work, so one waiting for a lock takes none).

        Where removing a conversation's rows rebuilds the whole memory (funes without `forget`),
        the sources of `alongside()` (the user's other conversation forgets waiting their turn,
        asked once the lock is held) go before the rebuild, and their entry ids are returned: their
        rows went with it, and each is then carried out with `rows_gone` (one rebuild for a burst,
        not one each)."""
        paths = TenantPaths.for_hash(self.s.data_dir, event.user_hash)
        lock = RedisLock(self.client, keys.index_lock(event.user_hash), self.s.index_lock_ttl_s)
        covered: list[str] = []
        async with self._index_run_yielded(event.user_hash), lock.held(wait_s=self.s.index_timeout_s, renew=True), slot:
            if event.kind == "forget_conversation":
                covered = await self._forget_conversation(paths, event, entry_id, lock, alongside, rows_gone)
            else:
                await self._forget_user(paths, entry_id, event)
                await self._tally(event, stream_entries=await self._purge_stream(event, entry_id))
            await self._tally(event, dead_letters=await self._purge_dead_letters(event, _deletion_version(event, entry_id)))
        self.job.forget_cached_texts()
        await self.compaction.compact()
        await self.client.publish(FORGET_CHANNEL, json.dumps({"user_hash": event.user_hash,
                                                              "conversation_id": event.conversation_id}))
        removed = await self._complete_receipt(event)
        FORGOTTEN.labels(event.kind, event.reason).inc()
        log.info("forget.done", kind=event.kind, reason=event.reason, user_hash=event.user_hash,
                 conversation_id=event.conversation_id, rebuilt_for=len(covered), **removed)
        return covered

    @contextlib.asynccontextmanager
    async def _index_run_yielded(self, uhash: str) -> AsyncIterator[None]:
        """While this forget waits for the user's index lock, a running index run gives it up
        at its next checkpoint (and runs again later) instead of finishing first. The request
        holds a token per waiting forget of the user (the last one out removes it) and expires with them:
        a worker killed mid-forget blocks the user's indexing for one lock TTL at most."""
        waiting, ttl_ms, token = keys.forget_waiting(uhash), int(self.s.index_lock_ttl_s * 1000), secrets.token_hex(8)
        await self.client.eval(_JOIN_WAITING, 1, waiting, token, ttl_ms)

        async def keep_asking() -> None:
            while True:
                await asyncio.sleep(self.s.index_lock_ttl_s / 3)
                with contextlib.suppress(aioredis.RedisError):
                    await self.client.pexpire(waiting, ttl_ms)

        asking = asyncio.create_task(keep_asking())
        try:
            yield
        finally:
            asking.cancel()
            with contextlib.suppress(aioredis.RedisError):  # it expires by itself
                await self.client.eval(_LEAVE_WAITING, 1, waiting, token)

    async def _forget_conversation(self, paths: TenantPaths, event: ForgetEvent, entry_id: str, lock: RedisLock,
                                   alongside: Callable[[], Mapping[str, ForgetEvent]], rows_gone: bool) -> list[str]:
        """The conversation's source and rows; returns the `alongside` forgets whose rows went too."""
        await self._remove_source(paths, event, entry_id)
        if rows_gone or not paths.src.is_dir():
            return []  # a rebuild of another forget of the user removed them (it counted their chunks)
        ahead = dict(alongside()) if self.rows.removal_rebuilds() is not False else {}
        for other_id, other in ahead.items():
            await self._remove_source(paths, other, other_id)
        first_count = functools.partial(self._first_count, event)
        try:
            await self._tally(event, token=_ROWS_TOKEN,
                              chunks=await self.rows.remove_conversation(paths, event.conversation_id, lock, first_count))
        except RebuildContinues as unfinished:
            await self._tally(event, token=_ROWS_TOKEN, chunks=unfinished.chunks)
            await mark_dirty(self.client, event.user_hash, None, self.s.index_debounce_s)
        return list(ahead) if self.rows.removal_rebuilds() else []

    async def _remove_source(self, paths: TenantPaths, event: ForgetEvent, entry_id: str) -> None:
        """Tombstone the conversation and delete its source file and its older stream entries."""
        assert event.conversation_id is not None
        conv_lock = RedisLock(self.client, keys.conversation_lock(event.user_hash, event.conversation_id), 30)
        # A retention forget deletes the snapshot it found expired, not what was accepted since
        # (the conversation resumed): its deletion is at that snapshot's version.
        deletion = _deletion_version(event, entry_id)
        async with conv_lock.held(wait_s=30):
            await self._tally(event, files=await asyncio.to_thread(tombstone_conversation, paths, event.conversation_id, deletion))
            await self._tally(event, stream_entries=await self._purge_stream(event, deletion))

    async def _forget_user(self, paths: TenantPaths, entry_id: str, event: ForgetEvent) -> None:
        await asyncio.to_thread(tombstone_user, self.s.data_dir, paths.uhash, entry_id)
        await self.client.delete(keys.dirty(paths.uhash), keys.received(paths.uhash), keys.pending_bytes(paths.uhash))
        await self.client.zrem(keys.DUE, paths.uhash)
        await self.client.srem(keys.REEMBED_PENDING, paths.uhash)
        aside = aside_of(paths.root)
        await self._clear_aside(paths, aside, event)  # what a crashed attempt left
        if await asyncio.to_thread(set_tenant_aside, paths.root) is not None:
            await self._clear_aside(paths, aside, event)

    async def _clear_aside(self, paths: TenantPaths, aside: Path, event: ForgetEvent) -> None:
        """Delete a tree set aside, but first move back every snapshot in it that is newer than
        the user's deletion: accepted after it, and written by another worker while this forget
        waited for the user's index lock, it belongs to the user's new history. What it deletes
        is added to the receipt before the deletion starts (`_tally_tree_once`)."""
        if not aside.is_dir():
            # A file where the tenant's tree belongs (a damaged data dir): nothing in it to count,
            # but the forget says done, so it goes too.
            await asyncio.to_thread(aside.unlink, True)
            return
        # A writer that was mid-write when the tree moved finishes first (its snapshot is then
        # whole in the set-aside tree, or it finds itself moved and is redelivered).
        writers = await self._writers_in_flight(paths.uhash)
        deadline = time.monotonic() + 35
        while writers and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            writers = {key: token for key, token in writers.items() if await self.client.get(key) == token}
        set_aside = TenantPaths(aside)
        deleted = await asyncio.to_thread(lambda: sum(1 for _ in set_aside.src.glob("*.funes.jsonl")) if set_aside.src.is_dir() else 0)
        forgotten_at = await asyncio.to_thread(user_deletion_version, self.s.data_dir, paths.uhash)
        kept = 0
        keep_after = forgotten_at or (2**63, 0)  # always tombstoned first; without one, keep nothing
        for cid in await asyncio.to_thread(snapshots_newer_than, set_aside, keep_after):
            async with RedisLock(self.client, keys.conversation_lock(paths.uhash, cid), 30).held(wait_s=30):
                if await asyncio.to_thread(move_snapshot_back, set_aside, paths, cid):
                    kept += 1
                deleted -= 1
        await self._tally_tree_once(event, set_aside, files=deleted)
        await asyncio.to_thread(_delete_tallied_tree, aside)
        if kept:
            log.info("forget.kept_newer_snapshots", user_hash=paths.uhash, conversations=kept)
            await mark_dirty(self.client, paths.uhash, None, self.s.index_debounce_s)

    async def _tally_tree_once(self, event: ForgetEvent, tree: TenantPaths, files: int) -> None:
        """Add a set-aside tree's transcripts and chunks to the receipt, once. Counted before it
        is deleted (deleting a large tenant takes seconds): a forget killed meanwhile is
        redelivered to a tree partly gone, whose remains would count for less. The tree carries
        the token its tally was made with, so the redelivery knows it was counted (and a tree
        whose tally never reached Redis is still whole: counted again)."""
        token_file = tree.root / TALLY_TOKEN
        token = await asyncio.to_thread(_read_token, token_file)
        if token is not None and await self.client.hexists(deletion_key(event.receipt), f"tallied:{token}"):
            return
        chunks = await self.rows.count(tree)
        token = secrets.token_hex(12)
        await asyncio.to_thread(token_file.write_text, token)
        await self._tally(event, token=token, files=files, chunks=chunks)

    async def _writers_in_flight(self, uhash: str) -> dict[str, bytes]:
        """The user's conversation locks held now, with their owners' tokens."""
        held = {}
        async for key in self.client.scan_iter(match=keys.conversation_lock(uhash, "*"), count=1000):
            token = await self.client.get(key)
            if token is not None:
                held[key] = token
        return held

    async def _purge_stream(self, event: ForgetEvent, entry_id: str) -> int:
        """Delete unprocessed stream entries of what is forgotten that are older than the deletion."""
        limit = parse_version(entry_id)
        purged, start = 0, "-"
        while True:
            batch = await self.client.xrange(self.s.stream, min=start, max=entry_id, count=500)
            if not batch:
                return purged
            doomed = []
            for raw_id, fields in batch:
                eid = raw_id.decode() if isinstance(raw_id, bytes) else raw_id
                f = decode_fields(fields)
                if parse_version(eid) >= limit or f.get("kind") != "turns" or f.get("user_hash") != event.user_hash:
                    continue
                if event.kind == "forget_user" or f.get("conversation_id") == event.conversation_id:
                    doomed.append(eid)
            if doomed:
                pipe = self.client.pipeline(transaction=True)
                pipe.xack(self.s.stream, self.s.group, *doomed)
                pipe.xdel(self.s.stream, *doomed)
                await pipe.execute()
                purged += len(doomed)
            last = batch[-1][0]
            last = last.decode() if isinstance(last, bytes) else last
            if parse_version(last) >= limit:
                return purged
            ms, seq = parse_version(last)
            start = f"{ms}-{seq + 1}"

    async def _purge_dead_letters(self, event: ForgetEvent, deletion: str) -> int:
        """Dead-lettered entries keep the original event (its text): those of what is forgotten
        go too; one accepted after the deletion belongs to the new history and stays."""
        limit = parse_version(deletion)
        stream = dead_letter_stream(self.s.stream)
        purged, start = 0, "-"
        while True:
            batch = await self.client.xrange(stream, min=start, count=500)
            if not batch:
                return purged
            doomed = []
            for raw_id, fields in batch:
                original = _original_fields(decode_fields(fields))
                if original.get("user_hash") != event.user_hash or _accepted_after(original, limit):
                    continue
                if event.kind == "forget_user" or original.get("conversation_id") == event.conversation_id:
                    doomed.append(raw_id)
            if doomed:
                purged += await self.client.xdel(stream, *doomed)
            last = batch[-1][0]
            ms, seq = parse_version(last.decode() if isinstance(last, bytes) else last)
            start = f"{ms}-{seq + 1}"

    async def _tally(self, event: ForgetEvent, token: str | None = None, **removed: int) -> None:
        """What a step removed, added to the receipt as soon as it is done: a forget redelivered
        after a crash finds those things already gone (and removes 0), so counting per attempt
        would report less than was removed. Added once for its `token` (a new one by default)."""
        counts = [part for what, n in removed.items() for part in (what, n)]
        await self.client.eval(_TALLY, 1, deletion_key(event.receipt), token or secrets.token_hex(8), *counts)

    async def _first_count(self, event: ForgetEvent, chunks: int) -> int:
        """The chunks counted before the forget's first attempt removed any (kept in its receipt):
        a redelivery after a crash counts from there, not from the rows that attempt left."""
        return int(await self.client.eval(_FIRST_COUNT, 1, deletion_key(event.receipt), "chunks", chunks))

    async def _complete_receipt(self, event: ForgetEvent) -> dict[str, int]:
        key = deletion_key(event.receipt)
        raw, *counts = await self.client.hmget(key, ["record", *(f"removed:{w}" for w in REMOVED_KINDS)])
        removed = {what: int(n or 0) for what, n in zip(REMOVED_KINDS, counts)}
        record = DeletionReceipt.model_validate_json(raw) if raw else DeletionReceipt(
            receipt=event.receipt, status="pending", kind=event.kind, conversation_id=event.conversation_id,
            reason=event.reason, requested_at=event.received_at)
        done = record.model_copy(update={"status": "done", "done_at": time.time(), "removed": removed})
        pipe = self.client.pipeline(transaction=True)
        pipe.hset(key, "record", done.model_dump_json())
        pipe.ttl(key)
        _, ttl = await pipe.execute()
        if ttl < 0:
            # The receipt expired before this forget was carried out (a backlog, a replayed dead
            # letter) and the tallies made it again, without an expiry: it would stay for ever.
            await self.client.expire(key, LATE_RECEIPT_TTL_S)
        return removed