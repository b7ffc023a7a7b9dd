"""A forget deletes what was accepted before it, and only that: a snapshot accepted after it
(written by another worker while the forget waited for the user's index lock, or a conversation
the user resumed after a retention sweep judged it) belongs to the user's new history."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from services.indexer import redis_keys as keys
from services.indexer import snapshot_writer
from services.indexer.forgetting import Forgetter
from services.indexer.index_job import EmbeddedIndexJob
from services.indexer.retention import RetentionSweeper
from services.indexer.settings import IndexerSettings
from services.indexer.snapshot_writer import tombstone_conversation, tombstone_user, version_file, write_snapshot
from services.indexer.stream_consumer import StreamConsumer
from shared.stream_schema import DeletionReceipt, StreamTurn, TurnsEvent, deletion_key, ensure_group, parse_event
from shared.tenant_paths import TenantPaths, user_hash
from tests.conftest import INGEST_KEY, conversation_payload, indexed_chunks, ingest_url, wait_until

HEADERS = {"x-ingest-key": INGEST_KEY}


def post(env, user: str, cid: str, texts: list[str]) -> None:
    resp = httpx.post(f"{ingest_url(env)}/turns", headers=HEADERS, json=conversation_payload(user, cid, texts), timeout=10)
    assert resp.status_code == 202, resp.text


def receipt_done(env, receipt: str) -> bool:
    return httpx.get(f"{ingest_url(env)}/deletions/{receipt}", headers=HEADERS, timeout=10).json()["status"] == "done"


@pytest.mark.parametrize("kind", ["conversation", "user"])
def test_snapshots_accepted_after_a_forget_that_waited_for_the_index_lock_survive_it(services, service_env, r, kind):
    """The forget waits for the user's index lock (a run yields at its next checkpoint) while
    the worker's other handlers write the user's next snapshots; it then deleted them too."""
    services("ingest")
    services("indexer")
    post(service_env, "nora", "c", ["old plan about pump P-1"])
    post(service_env, "nora", "other", ["old note about valve V-7"])
    assert wait_until(lambda: indexed_chunks(service_env, "nora") == 2, 30)
    uh = user_hash("nora")
    r.set(keys.index_lock(uh), "an index run under way", px=3000)
    path = "/conversations/c?user=nora" if kind == "conversation" else "/users/nora"
    receipt = httpx.delete(f"{ingest_url(service_env)}{path}", headers=HEADERS, timeout=10).json()["receipt"]
    post(service_env, "nora", "c", ["after the forget: new plan N-2"])
    post(service_env, "nora", "d", ["a new conversation after the forget"])
    tenant = TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), "nora")
    assert wait_until(lambda: version_file(tenant, "d").exists(), 20), "written while the forget waits"
    assert wait_until(lambda: receipt_done(service_env, receipt), 30)
    assert "new plan N-2" in tenant.transcript("c").read_text()
    assert tenant.transcript("d").exists()
    assert tenant.transcript("other").exists() == (kind == "conversation")
    expected = 3 if kind == "conversation" else 2
    assert wait_until(lambda: indexed_chunks(service_env, "nora") == expected, 30), indexed_chunks(service_env, "nora")


@pytest.mark.parametrize("written_first", ["forget", "resumed snapshot"])
async def test_a_retention_forget_keeps_a_conversation_resumed_before_it_was_carried_out(tmp_path, redis_url, r, written_first):
    """The sweeper judged the snapshot on disk while the user resumed the conversation (its
    snapshot accepted before the sweep's forget, not yet written): that newer snapshot was
    deleted (or purged from the stream) with the expired one."""
    r.flushdb()
    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url, retention_days=30)
    client = aioredis.Redis.from_url(redis_url)
    ensure_group(r, settings.stream, settings.group)
    consumer = StreamConsumer(client, settings, Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s)))
    uh = user_hash("olaf")
    tenant = TenantPaths.for_hash(settings.data_dir, uh)

    def snapshot(*texts_and_days: tuple[str, str]) -> TurnsEvent:
        return TurnsEvent(user_hash=uh, conversation_id="c", received_at=time.time(), turns=[
            StreamTurn(id=f"t{i}", role="user", text=text, ts=f"{day}T10:00:00Z") for i, (text, day) in enumerate(texts_and_days)])

    old = snapshot(("the old plan", "2026-01-10"))
    await consumer.handle(r.xadd(settings.stream, old.fields()), old.fields(), 1)
    resumed = snapshot(("the old plan", "2026-01-10"), ("picked up again today", "2026-10-01"))
    resumed_id = r.xadd(settings.stream, resumed.fields())
    fake_now = time.mktime((2026, 10, 1, 12, 0, 0, 0, 0, 0))
    assert await RetentionSweeper(client, settings, now=lambda: fake_now).sweep_once() == 1
    [(forget_id, forget_fields)] = [(i, f) for i, f in r.xrange(settings.stream) if f["kind"] == "forget_conversation"]
    if written_first == "forget":
        await consumer.handle(forget_id, forget_fields, 1)
        await consumer.forgets.join()
        assert r.xrange(settings.stream, min=resumed_id, max=resumed_id), "the resumed snapshot is not purged"
        await consumer.handle(resumed_id, resumed.fields(), 1)
    else:
        await consumer.handle(resumed_id, resumed.fields(), 1)
        await consumer.handle(forget_id, forget_fields, 1)
        await consumer.forgets.join()
    assert "picked up again today" in tenant.transcript("c").read_text(), "the resumed conversation stays"
    receipt = DeletionReceipt.model_validate_json(r.hget(deletion_key(parse_event(forget_fields).receipt), "record"))
    assert receipt.status == "done"
    await client.aclose()


async def test_a_forget_that_finds_a_newer_snapshot_on_disk_leaves_it(tmp_path, redis_url, r):
    from shared.stream_schema import ForgetEvent

    r.flushdb()
    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url)
    client = aioredis.Redis.from_url(redis_url)
    forgetter = Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s))
    uh = user_hash("pia")
    tenant = TenantPaths.for_hash(settings.data_dir, uh)
    turns = [StreamTurn(id="t0", role="user", text="written after the forget was accepted", ts="2026-10-08T10:00:00Z")]
    await StreamConsumer(client, settings, forgetter)._store("3000-0", TurnsEvent(user_hash=uh, conversation_id="c",
                                                                                  received_at=time.time(), turns=turns))
    event = ForgetEvent(kind="forget_conversation", user_hash=uh, conversation_id="c", receipt="rp", received_at=time.time())
    await forgetter.job.run(tenant)
    await forgetter.forget("2000-0", event)
    assert tenant.transcript("c").exists() and version_file(tenant, "c").read_text() == "3000-0"
    receipt = DeletionReceipt.model_validate_json(r.hget(deletion_key("rp"), "record"))
    assert receipt.removed["files"] == 0 and receipt.removed["chunks"] == 0, receipt.removed
    await client.aclose()


async def test_a_dead_letter_accepted_after_a_user_forget_is_kept(tmp_path, redis_url, r):
    import json

    from shared.stream_schema import ForgetEvent

    r.flushdb()
    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url)
    client = aioredis.Redis.from_url(redis_url)
    uh = user_hash("quinn")
    for entry_id in ("1000-0", "3000-0"):
        r.xadd("recall:turns:dead", {"entry_id": entry_id, "reason": "max deliveries exceeded", "deliveries": "6",
                                     "user_hash": uh, "conversation_id": "c", "fields": json.dumps({"kind": "turns"})})
    forgetter = Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s))
    await forgetter.forget("2000-0", ForgetEvent(kind="forget_user", user_hash=uh, receipt="rq", received_at=time.time()))
    assert [f["entry_id"] for _, f in r.xrange("recall:turns:dead")] == ["3000-0"]
    await client.aclose()


async def test_a_user_forget_deletes_a_file_found_where_the_users_tree_belongs(tmp_path, redis_url, r):
    """A damaged data dir: a file at the tenant's path (its index runs failed and went to the dead
    letters). The forget said done and left it, renamed <hash>.forgotten."""
    from shared.stream_schema import ForgetEvent

    r.flushdb()
    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url)
    uh = user_hash("rhea")
    settings.data_dir.mkdir()
    (settings.data_dir / uh).write_text("rhea's own words, in a file where her tree belongs")
    client = aioredis.Redis.from_url(redis_url)
    forgetter = Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s))
    await forgetter.forget("2000-0", ForgetEvent(kind="forget_user", user_hash=uh, receipt="rr", received_at=time.time()))
    assert not [f for f in settings.data_dir.rglob("*") if f.is_file() and "rhea" in f.read_text(errors="replace")]
    await client.aclose()


def test_a_snapshot_whose_tree_a_user_deletion_moved_mid_write_is_not_acked(tmp_path, monkeypatch):
    """A user deletion older than the snapshot sets the tree aside without the conversation
    lock; moved between the snapshot's two writes, it was half in the old tree and reported written."""
    from services.indexer.forgetting import set_tenant_aside
    from services.indexer.snapshot_writer import SnapshotMoved

    uh = user_hash("rosa")
    tenant = TenantPaths.for_hash(tmp_path, uh)
    event = TurnsEvent(user_hash=uh, conversation_id="c", received_at=time.time(),
                       turns=[StreamTurn(id="t0", role="user", text="hello", ts="2026-10-08T10:00:00Z")])
    real_atomic_write = snapshot_writer._atomic_write

    def moved_after_the_transcript(path: Path, data: str) -> None:
        real_atomic_write(path, data)
        if path.name.endswith(".funes.jsonl"):
            tombstone_user(tmp_path, uh, "2000-0")
            set_tenant_aside(tenant.root)
            tenant.src.mkdir(parents=True)  # another writer of the user made the new tree

    monkeypatch.setattr(snapshot_writer, "_atomic_write", moved_after_the_transcript)
    with pytest.raises(SnapshotMoved):
        write_snapshot(tenant, event, "3000-0")


def test_forgetting_a_conversation_removes_the_temp_copy_a_writer_killed_before_its_rename_left(tmp_path, monkeypatch):
    """The temp file carries the dead writer's pid, so nobody overwrote it: after the forget's
    receipt said done, the whole text stayed on disk."""
    tenant = TenantPaths.for_hash(tmp_path, user_hash("ivy"))
    event = TurnsEvent(user_hash=tenant.uhash, conversation_id="c1", received_at=time.time(),
                       turns=[StreamTurn(id="t0", role="user", text="the SECRET-PLAN draft", ts=time.time())])
    write_snapshot(tenant, event, "1000-0")

    def killed_before_the_rename(src, dst):
        raise SystemExit("kill -9 between the write and the rename")

    monkeypatch.setattr(snapshot_writer.os, "replace", killed_before_the_rename)
    with pytest.raises(SystemExit):
        write_snapshot(tenant, event, "1500-0")
    monkeypatch.undo()
    assert any("SECRET-PLAN" in f.read_text() for f in tenant.src.glob("*.tmp")), "the dead writer's copy"
    assert tombstone_conversation(tenant, "c1", "2000-0") == 2
    assert not any("SECRET-PLAN" in f.read_text() for f in tenant.src.iterdir() if f.is_file())


def test_a_turn_dated_before_year_1000_keeps_a_date_the_engine_reads(tmp_path):
    """glibc's strftime("%Y") does not pad years below 1000: the snapshot said "999-01-01T…",
    which no RFC 3339 parser reads, so the turn lost its date (no recency, no retention)."""
    from datetime import datetime, timezone

    from shared.engine.transcript import parse_ts, read_transcript

    tenant = TenantPaths.for_hash(tmp_path, user_hash("sam"))
    when = datetime(999, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    event = TurnsEvent(user_hash=tenant.uhash, conversation_id="c", received_at=time.time(),
                       turns=[StreamTurn(id="t0", role="user", text="an old chronicle", ts=when)])
    write_snapshot(tenant, event, "1000-0")
    [turn] = read_transcript(tenant.transcript("c")).turns
    assert turn.ts == "0999-01-02T03:04:05Z"
    assert parse_ts(turn.ts) == when.timestamp()


async def test_a_receipt_that_expired_before_its_forget_ran_does_not_come_back_for_ever(tmp_path, redis_url, r):
    """The forget's tallies (HINCRBY) made an expired receipt again, with no expiry: it stayed."""
    from shared.stream_schema import ForgetEvent

    r.flushdb()
    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url)
    client = aioredis.Redis.from_url(redis_url)
    event = ForgetEvent(kind="forget_user", user_hash=user_hash("walt"), receipt="ab" * 12, received_at=time.time())
    await Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s)).forget("2000-0", event)
    await client.aclose()
    assert r.hget(deletion_key(event.receipt), "record") is not None
    assert 0 < r.ttl(deletion_key(event.receipt)) <= 7 * 86400


async def test_retention_receipts_are_kept_a_day_not_a_month(tmp_path, redis_url, r):
    """One receipt (~840 bytes) per expired conversation, kept 30 days and read by nobody, took
    a large share of Redis's maxmemory at scale."""
    from tests.conftest import write_conversation

    r.flushdb()
    write_conversation(tmp_path / user_hash("xena") / "src", "old", ["an old note"], day="2020-01-10")
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url, retention_days=30)
    client = aioredis.Redis.from_url(redis_url)
    assert await RetentionSweeper(client, settings).sweep_once() == 1
    await client.aclose()
    [receipt_key] = r.keys("recall:deletion:*")
    assert 0 < r.ttl(receipt_key) <= 86_400
