"""Forgets held beside the stream's message slots (services/indexer/forget_queue.py): each is
carried out once, stays pending until then, and is never dead-lettered while at work."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import pytest
import redis.asyncio as aioredis
from prometheus_client import REGISTRY

from services.indexer import redis_keys as keys
from services.indexer.forget_queue import ForgetQueue
from services.indexer.forgetting import Forgetter
from services.indexer.index_job import EmbeddedIndexJob
from services.indexer.settings import IndexerSettings
from services.indexer.stream_consumer import StreamConsumer
from services.indexer.worker import build_broker
from shared.stream_schema import ForgetEvent, deletion_key, ensure_group_async


def forgotten_users() -> float:
    return REGISTRY.get_sample_value("recall_forgotten_total", {"kind": "forget_user", "reason": "request"})


def user_forget(user_hash: str) -> ForgetEvent:
    return ForgetEvent(kind="forget_user", user_hash=user_hash, receipt=f"r-{user_hash[:4]}", received_at=time.time())


@pytest.fixture
async def client(redis_url, r):
    r.flushdb()
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_forgets_waiting_for_room_stay_pending_and_each_is_carried_out_once(client, redis_url, tmp_path):
    """With room for one forget, the others' handlers wait; their entries were left without a
    heartbeat, so the reclaimer took them meanwhile and each was held, and carried out, twice."""
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url, consumer="w1", forgets_held=1,
                               reclaim_idle_ms=400, retry_backoff_s=0.05)
    await ensure_group_async(client, settings.stream, settings.group)
    consumer = StreamConsumer(client, settings, Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s)))
    users = [c * 24 for c in "abc"]
    await client.set(keys.index_lock(users[0]), "an index run elsewhere", px=2500)  # the first forget waits for it
    before = forgotten_users()
    broker = build_broker(settings, consumer)
    await broker.start()
    try:
        for user in users:
            await client.xadd(settings.stream, user_forget(user).fields())
        deadline = time.monotonic() + 30
        while (await client.xpending(settings.stream, settings.group))["pending"] or forgotten_users() - before < 3:
            assert time.monotonic() < deadline, await client.xpending(settings.stream, settings.group)
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # time for a duplicate to show
    finally:
        await broker.stop()
    assert forgotten_users() - before == 3
    assert await client.xlen(f"{settings.stream}:dead") == 0
    assert REGISTRY.get_sample_value("recall_indexer_forgets_held") == 0
    # Its room is whole: a held twice gave back one place too few, and with none left every
    # later forget's handler waited for good.
    event = user_forget("e" * 24)
    await client.set(keys.index_lock(event.user_hash), "an index run elsewhere", px=60_000)
    await asyncio.wait_for(consumer.handle("9999999999999-0", event.fields(), 1), 5)
    assert consumer.forgets.holds("9999999999999-0")
    await consumer.forgets.stop(0.1)


async def test_a_held_forget_redelivered_past_max_deliveries_is_not_dead_lettered(client, redis_url, tmp_path):
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url, consumer="w1", max_deliveries=5)
    await ensure_group_async(client, settings.stream, settings.group)
    consumer = StreamConsumer(client, settings, Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s)))
    event = user_forget("d" * 24)
    await client.set(keys.index_lock(event.user_hash), "an index run elsewhere", px=60_000)
    entry_id = (await client.xadd(settings.stream, event.fields())).decode()
    await client.xreadgroup(settings.group, "w1", {settings.stream: ">"})
    before = forgotten_users()
    await consumer.handle(entry_id, event.fields(), 5)  # held: it waits for the user's lock
    await consumer.handle(entry_id, event.fields(), 6)  # reclaimed all the same (a late heartbeat)
    assert await client.xlen(f"{settings.stream}:dead") == 0, "a forget at work was dead-lettered"
    await client.delete(keys.index_lock(event.user_hash))
    await consumer.forgets.join()
    assert forgotten_users() - before == 1
    assert (await client.xpending(settings.stream, settings.group))["pending"] == 0


async def test_a_forget_waiting_for_a_lock_held_elsewhere_takes_no_slot_from_other_users(client, redis_url, tmp_path):
    """One forget slot: a forget whose user's lock another worker holds (a long rebuild) took it
    while it waited, and every other user's forget on this worker waited too."""
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url, consumer="w1", forget_concurrency=1)
    await ensure_group_async(client, settings.stream, settings.group)
    consumer = StreamConsumer(client, settings, Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s)))
    blocked, free = user_forget("f" * 24), user_forget("0" * 24)
    await client.set(keys.index_lock(blocked.user_hash), "a rebuild on another worker", px=60_000)
    before = forgotten_users()
    for event in (blocked, free):
        entry_id = (await client.xadd(settings.stream, event.fields())).decode()
        await consumer.handle(entry_id, event.fields(), 1)
    deadline = time.monotonic() + 10
    while forgotten_users() - before < 1:
        assert time.monotonic() < deadline, "the free user's forget waited for another user's lock"
        await asyncio.sleep(0.05)
    await client.delete(keys.index_lock(blocked.user_hash))
    await consumer.forgets.join()
    assert forgotten_users() - before == 2


async def test_held_forgets_wait_out_a_redis_outage_instead_of_failing_in_turn(tmp_path):
    """Redis down for a few seconds while one user's forgets wait for its lock: each failed in
    turn and went back to the reclaimer with a delivery counted (five outages dead-lettered
    forgets that had never begun). They now wait, still held, and are carried out once."""
    from shared.redis_client import async_redis
    from shared.redis_server import EmbeddedRedis

    own = EmbeddedRedis(tmp_path / "redis")
    own.start()
    client = async_redis(own.url, socket_timeout=5)
    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=own.url, consumer="w1", reclaim_idle_ms=60_000)
    try:
        await ensure_group_async(client, settings.stream, settings.group)
        consumer = StreamConsumer(client, settings, Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s)))
        user = "9" * 24
        await client.set(keys.index_lock(user), "an index run elsewhere", px=60_000)
        before = forgotten_users()
        for i in range(3):
            event = ForgetEvent(kind="forget_user", user_hash=user, receipt=f"r-{i}", received_at=time.time())
            await client.xadd(settings.stream, event.fields())
        for _, entries in await client.xreadgroup(settings.group, "w1", {settings.stream: ">"}):
            for entry_id, fields in entries:
                await consumer.handle(entry_id.decode(), {k.decode(): v.decode() for k, v in fields.items()}, 1)
        own.stop()
        await asyncio.sleep(3)  # past the connection's own retries
        own.start()
        await client.delete(keys.index_lock(user))
        await asyncio.wait_for(consumer.forgets.join(), 60)
        assert forgotten_users() - before == 3
        assert (await client.xpending(settings.stream, settings.group))["pending"] == 0
        await consumer.forgets.stop(0.1)
    finally:
        await client.aclose()
        own.stop()


class ForgetterThatLosesACancellation(Forgetter):
    """Waits for its user's lock as a forget does, and drops its first cancellation as Python
    3.11's asyncio.wait_for does (redis-py's socket writes use it) when its inner call finished in
    the same loop iteration."""

    async def forget(self, entry_id, event, slot=contextlib.nullcontext()) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass
        while True:
            await asyncio.sleep(0.02)


async def test_a_stop_ends_a_forget_that_lost_its_cancellation(client, redis_url, tmp_path):
    """The stop cancelled each running forget once and waited for it: one that lost the
    cancellation kept polling for its lock, and the indexer outlived SIGTERM's 30 s grace."""
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url)

    async def nothing(*_) -> None:
        return None

    queue = ForgetQueue(ForgetterThatLosesACancellation(client, settings, EmbeddedIndexJob(settings.index_timeout_s)),
                        ack=nothing, keep_pending=nothing, keep_every_s=60, running=2, held=10)
    await queue.submit("1-0", user_forget("a" * 24))
    started = time.monotonic()
    await asyncio.wait_for(queue.stop(0.1), 10)
    assert time.monotonic() - started < 3
    assert not queue.holds("1-0")


async def test_one_users_waiting_conversation_forgets_share_one_rebuild_of_an_append_only_funes(
        client, redis_url, tmp_path, fake_funes):
    """funes without `forget` removes a conversation's rows by rebuilding the whole memory: five
    deletions of one user (a retention sweep's, a user clearing history) were five rebuilds, one
    after the other. The forgets waiting their turn now share the running one's rebuild."""
    from services.indexer.index_job import FunesIndexJob
    from shared.tenant_paths import TenantPaths, user_hash
    from tests.conftest import funes_status_chunks, write_conversation

    rebuilds = tmp_path / "index-runs"
    append_only = tmp_path / "funes-1.2"  # no `forget` (clap exits 2); each `index` is written down
    append_only.write_text(f'#!/bin/sh\n[ "$1" = forget ] && exit 2\n[ "$1" = index ] && echo run >> "{rebuilds}"\n'
                           f'exec "{fake_funes}" "$@"\n')
    append_only.chmod(0o755)
    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url, engine="funes", funes_bin=str(append_only))
    paths = TenantPaths.for_user(settings.data_dir, "alice")
    for i in range(6):
        write_conversation(paths.src, f"c{i}", [f"Conversation {i} about KESTREL-{i}.", "ok"])
    job = FunesIndexJob(str(append_only), 60)
    await job.run(paths)
    assert funes_status_chunks(fake_funes, paths.memory) == 12
    rebuilds.unlink()
    forgetter = Forgetter(client, settings, job)
    acked: list[str] = []

    async def ack(entry_id: str) -> None:
        acked.append(entry_id)

    async def nothing(*_) -> None:
        return None

    queue = ForgetQueue(forgetter, ack=ack, keep_pending=nothing, keep_every_s=60, running=2, held=100)
    await client.set(keys.index_lock(user_hash("alice")), "an index run elsewhere", px=60_000)
    for i in range(5):
        await queue.submit(f"{1000 + i}-0", ForgetEvent(kind="forget_conversation", user_hash=user_hash("alice"),
                                                       conversation_id=f"c{i}", receipt=f"r{i}" * 12, received_at=time.time()))
    await client.delete(keys.index_lock(user_hash("alice")))
    await asyncio.wait_for(queue.join(), 120)
    assert sorted(acked) == [f"{1000 + i}-0" for i in range(5)]
    assert funes_status_chunks(fake_funes, paths.memory) == 2, "only c5 is left"
    assert len(rebuilds.read_text().splitlines()) == 1, "the first forget's rebuild removed all five"
    removed = [json.loads(await client.hget(deletion_key(f"r{i}" * 12), "record"))["removed"] for i in range(5)]
    assert [r["files"] for r in removed] == [1] * 5
    assert [r["chunks"] for r in removed] == [10, 0, 0, 0, 0], "the rebuild's receipt counts what it removed"
    assert [p.name for p in paths.src.glob("*.funes.jsonl")] == ["c5.funes.jsonl"]
