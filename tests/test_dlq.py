"""`recall dlq`: dead-lettered events go back at their ORIGINAL version, so a replay never
overwrites newer content nor revives what was forgotten (real redis-server, real files, the
real `recall` command)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from services.indexer import redis_keys as keys
from services.indexer.settings import IndexerSettings
from services.indexer.snapshot_writer import tombstone_user, version_file, write_snapshot
from services.indexer.stream_consumer import StreamConsumer
from shared.stream_schema import ForgetEvent, StreamTurn, TurnsEvent, dead_letter_stream, ensure_group
from shared.tenant_paths import TenantPaths, user_hash
from tests.conftest import BIN

UHASH = user_hash("alice")


def turns_event(conversation_id: str, *texts: str) -> TurnsEvent:
    return TurnsEvent(user_hash=UHASH, conversation_id=conversation_id, received_at=time.time(),
                      turns=[StreamTurn(id=f"t{i}", role="user", text=t, ts="2026-10-08T10:00:00Z") for i, t in enumerate(texts)])


@pytest.fixture
def dlq_env(service_env, redis_url, tmp_path):
    settings = IndexerSettings(data_dir=Path(service_env["RECALL_DATA_DIR"]), redis_url=redis_url)
    import redis

    ensure_group(redis.Redis.from_url(redis_url), settings.stream, settings.group)
    return service_env, settings


async def publish_and_dead_letter(settings: IndexerSettings, fields: dict[str, str]) -> str:
    """XADD the event like ingest, then dead-letter it with the indexer's own code; returns its entry id."""
    client = aioredis.Redis.from_url(settings.redis, decode_responses=True)
    try:
        entry_id = await client.xadd(settings.stream, fields)
        await client.xreadgroup(settings.group, "a-worker", {settings.stream: ">"})  # delivered, and failed since
        await StreamConsumer(client, settings, forgetter=None).dead_letter(entry_id, fields, 6, "max deliveries exceeded")
        return entry_id
    finally:
        await client.aclose()


def dlq(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "recall"), "dlq", *args], env=env, capture_output=True, text=True, timeout=120)


def transcript(settings: IndexerSettings, conversation_id: str) -> Path:
    return TenantPaths.for_hash(settings.data_dir, UHASH).transcript(conversation_id)


async def test_replay_writes_the_snapshot_at_its_original_version_and_schedules_indexing(dlq_env, r):
    env, settings = dlq_env
    entry_id = await publish_and_dead_letter(settings, turns_event("c1", "the vault moved to MT-4471").fields())
    later = r.xadd(settings.stream, {"kind": "noise"})  # the stream moves on meanwhile
    assert later > entry_id

    listed = dlq(env, "list")
    assert listed.returncode == 0 and f"version={entry_id}" in listed.stdout and "1 dead-lettered" in listed.stdout
    assert "MT-4471" not in listed.stdout, "list never prints message text"

    replayed = dlq(env, "replay", "--all")
    assert replayed.returncode == 0 and "written" in replayed.stdout, replayed.stdout + replayed.stderr
    assert "MT-4471" in transcript(settings, "c1").read_text()
    assert version_file(TenantPaths.for_hash(settings.data_dir, UHASH), "c1").read_text() == entry_id
    assert r.zscore(keys.DUE, UHASH) is not None, "a running indexer picks the tenant up"
    assert r.xlen(dead_letter_stream(settings.stream)) == 0


async def test_replay_of_an_old_snapshot_never_overwrites_a_newer_one(dlq_env, r):
    env, settings = dlq_env
    await publish_and_dead_letter(settings, turns_event("c1", "old draft: port 80").fields())
    newer = turns_event("c1", "old draft: port 80", "final: port 8443")
    newer_id = r.xadd(settings.stream, newer.fields())
    write_snapshot(TenantPaths.for_hash(settings.data_dir, UHASH), newer, newer_id)  # what an indexer did meanwhile

    replayed = dlq(env, "replay", "--all")
    assert replayed.returncode == 0 and "stale" in replayed.stdout, replayed.stdout + replayed.stderr
    assert "final: port 8443" in transcript(settings, "c1").read_text()
    # What the old runbook did, for contrast: XADD gives the old snapshot a NEWER version.
    assert r.xadd(settings.stream, {"kind": "turns"}) > newer_id


async def test_replay_does_not_revive_a_forgotten_user(dlq_env, r):
    env, settings = dlq_env
    await publish_and_dead_letter(settings, turns_event("c1", "something alice later asked us to forget").fields())
    tombstone_user(settings.data_dir, UHASH, r.xadd(settings.stream, {"kind": "forget_user"}))

    replayed = dlq(env, "replay", "--all")
    assert replayed.returncode == 0 and "stale" in replayed.stdout, replayed.stdout + replayed.stderr
    assert not transcript(settings, "c1").exists()
    assert r.zscore(keys.DUE, UHASH) is None


async def test_replay_carries_out_a_dead_lettered_forget_and_completes_its_receipt(dlq_env, r):
    env, settings = dlq_env
    first = turns_event("c1", "a conversation to forget")
    write_snapshot(TenantPaths.for_hash(settings.data_dir, UHASH), first, r.xadd(settings.stream, first.fields()))
    forget = ForgetEvent(kind="forget_user", user_hash=UHASH, receipt="ab" * 12, received_at=time.time())
    await publish_and_dead_letter(settings, forget.fields())

    replayed = dlq(env, "replay", "--all")
    assert replayed.returncode == 0 and "forgotten" in replayed.stdout, replayed.stdout + replayed.stderr
    assert not TenantPaths.for_hash(settings.data_dir, UHASH).root.exists()
    assert json.loads(r.hget("recall:deletion:" + "ab" * 12, "record"))["status"] == "done"


async def test_invalid_events_stay_until_dropped(dlq_env, r):
    env, settings = dlq_env
    await publish_and_dead_letter(settings, {"kind": "turns", "user_hash": "../../etc", "event": "{}"})
    [dead_id] = [i for i, _ in r.xrange(dead_letter_stream(settings.stream))]

    replayed = dlq(env, "replay", "--all")
    assert replayed.returncode == 1 and "invalid" in replayed.stdout
    assert r.xlen(dead_letter_stream(settings.stream)) == 1
    assert dlq(env, "drop").returncode == 2, "drop needs ids or --all"
    dropped = dlq(env, "drop", dead_id)
    assert dropped.returncode == 0 and "dropped 1" in dropped.stdout
    assert r.xlen(dead_letter_stream(settings.stream)) == 0


async def test_an_entry_given_up_by_two_consumers_is_dead_lettered_once(dlq_env, r):
    # A handler that runs past the reclaim idle time: its worker and the reclaimer both give up.
    env, settings = dlq_env
    fields = turns_event("c1", "poison that two consumers gave up on").fields()
    client = aioredis.Redis.from_url(settings.redis, decode_responses=True)
    try:
        entry_id = await client.xadd(settings.stream, fields)
        await client.xreadgroup(settings.group, "a-worker", {settings.stream: ">"})
        for consumer in range(2):
            await StreamConsumer(client, settings, forgetter=None).dead_letter(entry_id, fields, 6, f"gave up {consumer}")
    finally:
        await client.aclose()
    assert [f["entry_id"] for _, f in r.xrange(dead_letter_stream(settings.stream))] == [entry_id]
    assert r.xlen(settings.stream) == 0


async def test_beside_make_run_dlq_uses_the_running_stacks_redis(dlq_env, r, tmp_path):
    """`recall status` of a `make run` stack counts dead letters; `recall dlq list` in the same
    place (no RECALL_REDIS_URL: the embedded Redis's port is chosen at start) must reach them."""
    from services.stack_state import DataDirLock, StackInfo, remove_info, write_info

    env, settings = dlq_env
    entry_id = await publish_and_dead_letter(settings, turns_event("c1", "stuck").fields())
    beside_make_run = {k: v for k, v in env.items() if k != "RECALL_REDIS_URL"}
    assert "no recall up is running" in dlq(beside_make_run, "list").stderr, "without a stack: one line saying so"

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    lock = DataDirLock(settings.data_dir)
    lock.acquire()
    try:
        write_info(StackInfo(pid=0, data_dir=str(settings.data_dir), redis_url=settings.redis, embedded_redis=True,
                             ingest_url="http://127.0.0.1:1", indexer_url="http://127.0.0.1:1", recall_url="http://127.0.0.1:1"))
        listed = dlq(beside_make_run, "list")
        assert listed.returncode == 0 and f"version={entry_id}" in listed.stdout, listed.stdout + listed.stderr
        replayed = dlq(beside_make_run, "replay", "--all")
        assert replayed.returncode == 0 and "written" in replayed.stdout, replayed.stdout + replayed.stderr
        assert "stuck" in transcript(settings, "c1").read_text()
    finally:
        remove_info(settings.data_dir)
        lock.release()


async def test_a_dead_lettered_forget_survives_any_number_of_later_dead_letters(service_env, redis_url, r, monkeypatch):
    """The dead-letter stream used to be capped (RECALL_DEAD_LETTER_MAXLEN, trimming the oldest):
    a failed forget then vanished behind later failures, its receipt pending for ever."""
    import redis

    monkeypatch.setenv("RECALL_DEAD_LETTER_MAXLEN", "100")  # what an operator may have set: no cap applies
    settings = IndexerSettings(data_dir=Path(service_env["RECALL_DATA_DIR"]), redis_url=redis_url)
    ensure_group(redis.Redis.from_url(redis_url), settings.stream, settings.group)
    forget = ForgetEvent(kind="forget_user", user_hash=UHASH, receipt="cd" * 12, received_at=time.time())
    forget_id = await publish_and_dead_letter(settings, forget.fields())
    for i in range(300):
        await publish_and_dead_letter(settings, turns_event(f"c{i}", "a failing snapshot").fields())
    dead = r.xrange(dead_letter_stream(settings.stream), count=1)
    assert r.xlen(dead_letter_stream(settings.stream)) == 301
    assert forget_id in " ".join(str(v) for _, fields in dead for v in fields.values()), dead


async def test_a_worker_killed_while_dead_lettering_leaves_the_entry_to_be_dead_lettered_by_the_next(dlq_env, r):
    """Dead-lettering took a claim key first, then wrote the record and acked in a second step:
    killed in between, the redelivery found the claim, acked the entry as "already
    dead-lettered", and the event was gone with no record anywhere."""
    env, settings = dlq_env
    fields = turns_event("c1", "a snapshot that keeps failing").fields()
    entry_id = r.xadd(settings.stream, fields)
    r.xreadgroup(settings.group, "a-worker", {settings.stream: ">"})
    r.set(f"recall:dead-lettered:{entry_id}", "1", ex=600)  # what the killed worker's first step left
    client = aioredis.Redis.from_url(settings.redis, decode_responses=True)
    try:
        await StreamConsumer(client, settings, forgetter=None).dead_letter(entry_id, fields, 6, "max deliveries exceeded")
    finally:
        await client.aclose()
    assert [f["entry_id"] for _, f in r.xrange(dead_letter_stream(settings.stream))] == [entry_id]
    assert r.xlen(settings.stream) == 0 and r.xpending(settings.stream, settings.group)["pending"] == 0


@pytest.mark.parametrize("action", ["replay", "drop"])
def test_an_id_that_is_no_dead_letter_id_is_one_line_naming_it(dlq_env, action):
    env, _ = dlq_env
    done = dlq(env, action, "1-0", "bogus")
    assert done.returncode == 1 and "'bogus' is not a dead-letter id" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "ResponseError" not in done.stderr
