"""The write path end to end: ingest → stream → indexer workers → searchable memory."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import stat
import time
from pathlib import Path

import httpx
import pytest
import redis

from services.indexer.forgetting import Forgetter
from services.indexer.index_job import EmbeddedIndexJob
from services.indexer.settings import IndexerSettings
from services.indexer.snapshot_writer import version_file
from services.indexer.stream_consumer import StreamConsumer
from shared.redis_lock import RedisLock
from shared.redis_server import EmbeddedRedis
from shared.stream_schema import ForgetEvent, StreamTurn, TurnsEvent, ensure_group
from shared.tenant_paths import TenantPaths, user_hash
from tests.conftest import INGEST_KEY, conversation_payload, engine_cli, free_port, ingest_url, wait_until


def post(env, payload) -> None:
    resp = httpx.post(f"{ingest_url(env)}/turns", headers={"x-ingest-key": INGEST_KEY}, json=payload, timeout=10)
    assert resp.status_code == 202, resp.text


def memory_rows(env, user: str) -> list[tuple[str, str, str]]:
    db = Path(env["RECALL_DATA_DIR"]) / user_hash(user) / "memory" / "chunks.sqlite3"
    if not db.exists():
        return []
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT session_id, turn_uuid, text FROM chunks").fetchall()
    finally:
        conn.close()


def searchable(env, user: str, expected_chunks: int) -> bool:
    return len(memory_rows(env, user)) == expected_chunks


def test_posted_turns_become_searchable_and_leave_no_text_in_redis(services, service_env, r):
    services("ingest")
    services("indexer")
    post(service_env, conversation_payload("alice", "c1", ["What about N-11?", "Proceed once MT-4471 closes."]))
    post(service_env, conversation_payload("alice", "c1", ["What about N-11?", "Proceed once MT-4471 closes.", "thanks"]))
    assert wait_until(lambda: searchable(service_env, "alice", 3), 20)
    src = TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), "alice").transcript("c1")
    lines = [json.loads(x) for x in src.read_text().splitlines()]
    assert [x["turn_uuid"] for x in lines] == ["c1-t0", "c1-t1", "c1-t2"] and lines[0]["harness"] == "copilot"
    assert wait_until(lambda: r.xlen("recall:turns") == 0, 10), "acked entries are deleted from the stream"
    assert r.xpending("recall:turns", "indexers")["pending"] == 0


def test_a_burst_of_writes_is_debounced_into_few_index_runs(services, service_env):
    services("ingest")
    worker = services("indexer", RECALL_INDEX_DEBOUNCE_S="1.0")
    msgs: list[str] = []
    for i in range(12):
        msgs.append(f"turn {i} about line N-{i}")
        post(service_env, conversation_payload("bob", "burst", msgs))
    assert wait_until(lambda: searchable(service_env, "bob", 12), 20)
    time.sleep(1.5)
    runs = [line for line in worker.output().splitlines() if '"index.run"' in line and user_hash("bob") in line]
    assert 1 <= len(runs) <= 3, f"{len(runs)} runs for one burst"


async def test_out_of_order_snapshots_never_regress_a_conversation(tmp_path, redis_url, r):
    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url)
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    consumer = StreamConsumer(client, settings, Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s)))
    uh = user_hash("carol")

    def event(n: int) -> TurnsEvent:
        return TurnsEvent(user_hash=uh, conversation_id="c", received_at=time.time(),
                          turns=[StreamTurn(id=f"t{i}", role="user", text=f"message {i}", ts="2026-10-08T10:00:00Z")
                                 for i in range(n)])

    paths = TenantPaths.for_hash(settings.data_dir, uh)
    await consumer._store("2000-0", event(3))
    await consumer._store("1000-5", event(1))  # older, processed later by another worker
    assert paths.transcript("c").read_text().count("\n") == 3
    await asyncio.gather(*[consumer._store(f"{3000 + i}-0", event(4 + i % 3)) for i in range(9)])
    assert version_file(paths, "c").read_text() == "3008-0"
    assert paths.transcript("c").read_text().count("\n") == 4 + 8 % 3
    await consumer._store("3008-0", event(6))  # a redelivery of the newest rewrites it
    assert paths.transcript("c").read_text().count("\n") == 6
    await client.aclose()


async def test_an_edited_snapshot_redelivered_after_a_crash_still_rebuilds_the_funes_memory(tmp_path, redis_url, r,
                                                                                        monkeypatch):
    """The user's index run took the rebuild mark made before the edited text was written (and
    indexed the old text); the worker was killed after the write, before marking again. The
    redelivery found the file as sent (an append to what is there) and marked nothing: funes
    kept the first text for good."""
    import redis.asyncio as aioredis

    from services.indexer import snapshot_writer
    from services.indexer.snapshot_writer import WriteResult
    from services.indexer.stream_consumer import store_snapshot

    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url, engine="funes")
    uh = user_hash("dora")
    paths = TenantPaths.for_hash(settings.data_dir, uh)

    def event(answer: str) -> TurnsEvent:
        return TurnsEvent(user_hash=uh, conversation_id="budget", received_at=time.time(),
                          turns=[StreamTurn(id="q", role="user", text="KESTREL budget?", ts="2026-10-08T10:00:00Z"),
                                 StreamTurn(id="a", role="assistant", text=answer, ts="2026-10-08T10:00:05Z")])

    class Killed(BaseException):
        pass

    real_mark, marks = snapshot_writer.mark_rebuild, []

    def mark_taken_by_an_index_run_then_killed(tenant: TenantPaths) -> None:
        marks.append(tenant)
        if len(marks) > 1:
            raise Killed()
        real_mark(tenant)
        tenant.funes_rebuild.unlink()  # the run empties the memory, drops the mark, indexes the old text

    client = aioredis.Redis.from_url(redis_url)
    try:
        assert await store_snapshot(client, settings, event("48k"), "1000-0", wait_s=5) is WriteResult.WRITTEN
        monkeypatch.setattr(snapshot_writer, "mark_rebuild", mark_taken_by_an_index_run_then_killed)
        with pytest.raises(Killed):
            await store_snapshot(client, settings, event("52k"), "2000-0", wait_s=5)
        monkeypatch.setattr(snapshot_writer, "mark_rebuild", real_mark)
        assert "52k" in paths.transcript("budget").read_text() and not paths.funes_rebuild.exists()
        await store_snapshot(client, settings, event("52k"), "2000-0", wait_s=5)  # the redelivery
    finally:
        await client.aclose()
    assert paths.funes_rebuild.exists(), "the edit would stay unseen: funes keeps the line it stored first"
    assert [p.name for p in paths.src.iterdir() if p.name.endswith(".rewriting")] == []


async def test_a_forget_leaves_no_user_words_cached_in_the_indexer_process(tmp_path, redis_url, r):
    from shared.engine.text_analysis import stem

    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url)
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    forgetter = Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s))
    consumer = StreamConsumer(client, settings, forgetter)
    uh = user_hash("erin")
    turns = [StreamTurn(id="t0", role="user", text="my neighbour Zbigniewski keeps geese", ts="2026-10-08T10:00:00Z")]
    await consumer._store("1000-0", TurnsEvent(user_hash=uh, conversation_id="c", received_at=time.time(), turns=turns))
    await forgetter.job.run(TenantPaths.for_hash(settings.data_dir, uh))
    assert stem.cache_info().currsize > 0  # indexing stemmed the turn's words in this process
    await forgetter.forget("2000-0", ForgetEvent(kind="forget_user", user_hash=uh, receipt="rc", received_at=time.time()))
    assert stem.cache_info().currsize == 0
    await client.aclose()


async def test_an_index_run_that_meets_redis_down_ends_without_an_error(tmp_path):
    import redis.asyncio as aioredis

    from services.indexer.index_job import FunesIndexJob
    from services.indexer.index_scheduler import IndexScheduler
    from shared.redis_lock import RedisLock

    dead = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=0.5)
    scheduler = IndexScheduler(dead, FunesIndexJob("/bin/false", 5), tmp_path, 0.05, 30, 1)
    # It used to raise from its error handler's ZADD: "Task exception was never retrieved".
    await scheduler._run(user_hash("ida"), RedisLock(dead, "k", 30))
    assert not scheduler.running
    await dead.aclose()


async def test_a_forget_redelivered_after_a_crash_keeps_the_counts_of_what_it_removed(tmp_path, redis_url, r):
    from shared.stream_schema import DeletionReceipt, deletion_key

    settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url)
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(redis_url)
    forgetter = Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s))
    uh = user_hash("fay")
    turns = [StreamTurn(id=f"t{i}", role="user", text=f"plan step {i}", ts="2026-10-08T10:00:00Z") for i in range(2)]
    await StreamConsumer(client, settings, forgetter)._store(
        "1000-0", TurnsEvent(user_hash=uh, conversation_id="c", received_at=time.time(), turns=turns))
    await forgetter.job.run(TenantPaths.for_hash(settings.data_dir, uh))
    event = ForgetEvent(kind="forget_conversation", user_hash=uh, conversation_id="c", receipt="rf", received_at=time.time())
    await forgetter.forget("2000-0", event)
    # Killed before its ack: the entry is delivered again and finds everything already gone.
    await forgetter.forget("2000-0", event)
    receipt = DeletionReceipt.model_validate_json(r.hget(deletion_key("rf"), "record"))
    assert receipt.status == "done" and receipt.removed["files"] == 1 and receipt.removed["chunks"] == 2, receipt.removed
    await client.aclose()


def test_kill_9_mid_batch_another_worker_finishes_without_duplicates(services, service_env, r):
    services("ingest")
    convs = {f"k{i}": [f"Conversation {i} opened ticket MT-{5000 + i}.", f"Owner of MT-{5000 + i} is operator {i}."]
             for i in range(24)}
    ensure_group(r, "recall:turns", "indexers")
    for cid, msgs in list(convs.items())[:12]:
        post(service_env, conversation_payload("dave", cid, msgs))
    # A worker that read these and died before acking: they sit in its pending list.
    r.xreadgroup("indexers", "crashed-worker", {"recall:turns": ">"}, count=6)
    first = services("indexer")
    for cid, msgs in list(convs.items())[12:]:
        post(service_env, conversation_payload("dave", cid, msgs))
    time.sleep(0.3)
    first.kill()  # kill -9, mid-batch
    services("indexer")
    assert wait_until(lambda: searchable(service_env, "dave", 48), 60), len(memory_rows(service_env, "dave"))
    rows = memory_rows(service_env, "dave")
    assert len(rows) == len(set(rows)) == 48, "every accepted turn once, none duplicated"
    assert wait_until(lambda: r.xpending("recall:turns", "indexers")["pending"] == 0, 20)


def test_an_indexer_killed_with_a_backlog_strands_a_few_entries_and_the_next_one_takes_them_back(services, service_env, r):
    """A fault trial's kill -9 of an indexer holding a 275-entry backlog stranded all of it: the
    worker had read the whole stream at once, and the reclaimer took entries back one by one."""
    from services.indexer.worker import READ_BATCH, WORKERS

    services("ingest")
    ensure_group(r, "recall:turns", "indexers")
    for i in range(200):
        post(service_env, conversation_payload("erin", f"e{i}", [f"Backlog item {i} names ticket MT-{7000 + i}."]))
    first = services("indexer")
    assert wait_until(lambda: r.xpending("recall:turns", "indexers")["pending"] > 0, 30)
    first.kill()  # kill -9 while it works through the backlog
    stranded = r.xpending("recall:turns", "indexers")["pending"]
    assert stranded <= READ_BATCH + 2 * WORKERS, stranded
    services("indexer")
    assert wait_until(lambda: r.xpending("recall:turns", "indexers")["pending"] == 0 and r.xlen("recall:turns") == 0, 60)


FUNES_MARKER_WRAPPER = """#!/usr/bin/env bash
# A funes binary stand-in that proves mutual exclusion: it records any overlapping index run.
if [ "$1" = "index" ]; then
  marker="$FUNES_HOME/.index-running"
  if ! (set -o noclobber; echo $$ > "$marker") 2>/dev/null; then echo "overlap $FUNES_HOME" >> "{overlaps}"; fi
  echo "run $$" >> "{runs}"
  sleep 0.3
  "{engine}" "$@"; rc=$?
  rm -f "$marker"
  exit $rc
fi
exec "{engine}" "$@"
"""


def test_two_indexer_processes_never_index_one_user_concurrently(services, service_env, tmp_path):
    overlaps, runs = tmp_path / "overlaps", tmp_path / "runs"
    wrapper = tmp_path / "funes"
    wrapper.write_text(FUNES_MARKER_WRAPPER.format(overlaps=overlaps, runs=runs, engine=engine_cli()))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    services("ingest")
    funes_mode = {"RECALL_ENGINE": "funes", "RECALL_FUNES_BIN": str(wrapper), "RECALL_INDEX_DEBOUNCE_S": "0.05"}
    services("indexer", **funes_mode)
    services("indexer", **funes_mode, RECALL_INDEXER_PORT=str(free_port()))
    expected = {"erin": 0, "frank": 0}
    bursts = 3
    # Each burst spreads both users' turns over both indexers; waiting for it to land before the next
    # guarantees at least one index run per user per burst, however the jobs coalesce on a slow machine.
    for burst in range(bursts):
        for round_ in range(3):
            for user in expected:
                msgs = [f"{user} burst {burst} round {round_} note {j}" for j in range(2)]
                post(service_env, conversation_payload(user, f"c{burst}-{round_}", msgs))
                expected[user] += 2
            time.sleep(0.15)
        assert wait_until(lambda: all(searchable(service_env, u, n) for u, n in expected.items()), 90)
    assert not overlaps.exists(), overlaps.read_text()
    assert len(runs.read_text().splitlines()) >= bursts * len(expected), "the jobs really ran through the funes binary"


def test_redis_restart_with_aof_loses_no_accepted_turn(services, service_env, tmp_path):
    port = free_port()
    server = EmbeddedRedis(tmp_path / "redis-aof", port=port)
    server.start()
    try:
        own = {"RECALL_REDIS_URL": server.url}
        services("ingest", **own)
        for i in range(5):
            post(service_env, conversation_payload("gina", f"g{i}", [f"accepted turn {i} with code Q-{i}"]))
        server.stop()  # SIGTERM: Redis fsyncs the AOF
        server = EmbeddedRedis(tmp_path / "redis-aof", port=port)
        server.start()
        assert redis.Redis.from_url(server.url).xlen("recall:turns") == 5
        # The first post after the restart finds ingest's pooled connection dead: still 202.
        post(service_env, conversation_payload("gina", "g5", ["accepted turn 5 with code Q-5"]))
        services("indexer", **own)
        assert wait_until(lambda: searchable(service_env, "gina", 6), 30)
    finally:
        server.stop()


def test_poison_and_failing_messages_go_to_the_dead_letter_stream(services, service_env, r, tmp_path):
    ensure_group(r, "recall:turns", "indexers")
    r.xadd("recall:turns", {"kind": "turns", "event": "{not json"})
    r.xadd("recall:turns", {"kind": "turns", "event": json.dumps(
        {"user_hash": "../../etc", "conversation_id": "x", "turns": [], "received_at": 1})})
    # A tenant whose directory cannot be created: every delivery fails until the limit.
    data = Path(service_env["RECALL_DATA_DIR"])
    data.mkdir(parents=True)
    (data / user_hash("hank")).write_text("a file where a directory should be")
    services("ingest")
    services("indexer", RECALL_MAX_DELIVERIES="3", RECALL_RECLAIM_IDLE_MS="300")
    post(service_env, conversation_payload("hank", "h1", ["this write cannot succeed"]))
    assert wait_until(lambda: r.xlen("recall:turns:dead") == 3, 60), r.xrange("recall:turns:dead")
    reasons = [f["reason"] for _, f in r.xrange("recall:turns:dead")]
    # The order depends on scheduling (a loaded machine can finish hank's retries first).
    assert sorted(reasons) == sorted(["invalid event: ValidationError", "invalid event: UnsafeId", "max deliveries exceeded"])
    assert r.xpending("recall:turns", "indexers")["pending"] == 0
    metrics = httpx.get(f"http://127.0.0.1:{service_env['RECALL_INDEXER_PORT']}/metrics").text
    assert 'recall_indexer_dead_letters_total{reason="max deliveries exceeded"} 1.0' in metrics
    assert "recall_indexer_retries_total 3.0" in metrics


def test_sigterm_after_its_work_exits_cleanly(services, service_env):
    services("ingest")
    worker = services("indexer")
    post(service_env, conversation_payload("ivan", "i1", ["one more thing about K-9"]))
    assert wait_until(lambda: searchable(service_env, "ivan", 1), 20)
    assert worker.terminate(timeout=30) == 0
    assert '"indexer.stopped"' in worker.output()


def test_sigterm_during_a_long_index_run_stops_it_within_seconds_and_the_user_stays_due(services, service_env, r,
                                                                                      funes_with_a_long_first_import):
    from services.indexer import redis_keys as keys
    from services.indexer.index_scheduler import FINISH_ON_STOP_S

    slow, started = funes_with_a_long_first_import
    services("ingest")
    worker = services("indexer", RECALL_ENGINE="funes", RECALL_FUNES_BIN=str(slow), RECALL_INDEX_DEBOUNCE_S="0.05")
    post(service_env, conversation_payload("olga", "o1", ["a first import that takes minutes"]))
    assert wait_until(started.exists, 30)
    stopping = time.monotonic()
    assert worker.terminate(timeout=60) == 0
    assert time.monotonic() - stopping < FINISH_ON_STOP_S + 5, "the run gave up its lock: no wait for the whole import"
    assert '"outcome": "stopped"' in worker.output()
    assert r.zscore(keys.DUE, user_hash("olga")) is not None, "the next start (or another replica) runs it again"
    assert r.get(keys.index_lock(user_hash("olga"))) is None, "its lock was released, not left to expire"


async def test_a_stopping_scheduler_starts_no_run_even_for_the_user_whose_lock_it_was_taking(tmp_path, redis_url, r,
                                                                                             monkeypatch):
    """An SRE trial's SIGTERM landed while the scheduler took a due user's lock; the scheduler was
    told to stop only after the forgets had, so it started that run, which was given up 5 s later."""
    import redis.asyncio as aioredis

    from services.indexer import redis_keys as keys
    from services.indexer.index_scheduler import IndexScheduler
    from shared.redis_lock import RedisLock

    class NeverRun:
        runs = 0

        async def run(self, paths, lock=None) -> None:
            NeverRun.runs += 1

    r.flushdb()
    client = aioredis.Redis.from_url(redis_url)
    scheduler = IndexScheduler(client, NeverRun(), tmp_path, 0.05, 30, 2)
    uh = user_hash("sam")
    r.zadd(keys.DUE, {uh: time.time() - 1})
    real_acquire = RedisLock.acquire

    async def acquire_as_the_stop_begins(lock: RedisLock) -> bool:
        taken = await real_acquire(lock)
        asyncio.get_running_loop().create_task(scheduler.stop())  # SIGTERM lands during the await
        await asyncio.sleep(0)
        return taken

    monkeypatch.setattr(RedisLock, "acquire", acquire_as_the_stop_begins)
    try:
        await asyncio.wait_for(scheduler.run_forever(), 10)
        assert NeverRun.runs == 0 and not scheduler.running
        assert r.get(keys.index_lock(uh)) is None, "the lock it had just taken was released"
        assert r.zscore(keys.DUE, uh) is not None, "the user stays due for the next worker"
    finally:
        await client.aclose()


async def test_a_run_that_yielded_to_a_forget_and_is_then_stopped_still_says_it_yielded(redis_url, r):
    import redis.asyncio as aioredis

    from shared.redis_lock import RedisLock

    client = aioredis.Redis.from_url(redis_url)
    lock = RedisLock(client, "recall:lock:index:test-yield", 30, yields_to="recall:forget-waiters:test-yield")
    try:
        assert await lock.acquire()
        r.sadd("recall:forget-waiters:test-yield", "a-forget")
        lock.keep_alive()
        assert await asyncio.wait_for(lock._lost_event.wait(), 10) is True
        lock.give_up()  # the stop arrives while the run is still winding down
        assert lock.yielded and not lock.given_up, "its index.run outcome said 'stopped'"
        await lock.release()
    finally:
        r.delete("recall:forget-waiters:test-yield")
        await client.aclose()


async def test_a_forget_waits_for_a_yielding_runs_memory_lock_past_five_seconds(tmp_path):
    """A run that yields its Redis lock lets the memory's writer lock go only at its next
    checkpoint, one embedding batch, which took up to 23 s on a loaded host: the forget waited
    5 s, failed with MemoryBusy and was redelivered, counting a delivery."""
    import threading

    from shared.engine.memory_lock import memory_lock

    paths = _tenant_with_conversations(tmp_path, "noa", 2)
    job = EmbeddedIndexJob(900)
    await job.run(paths)
    (paths.src / "c0.funes.jsonl").unlink()
    held, release = threading.Event(), threading.Event()

    def a_run_winding_down() -> None:
        with memory_lock(paths.root):
            held.set()
            release.wait(10)

    holder = threading.Thread(target=a_run_winding_down)
    holder.start()
    assert held.wait(10)
    threading.Timer(6.5, release.set).start()
    try:
        await job.remove_deleted(paths)
    finally:
        release.set()
        holder.join()
    assert len(memory_rows_at(paths)) == 1


def test_a_memory_lock_wait_ends_when_its_run_is_stopped(tmp_path):
    from shared.engine.memory_lock import memory_lock

    class Stopped(Exception):
        pass

    started = time.monotonic()

    def stop_after_a_moment() -> None:
        if time.monotonic() - started > 0.3:
            raise Stopped

    with memory_lock(tmp_path):
        with pytest.raises(Stopped):
            with memory_lock(tmp_path, wait_s=60, waiting=stop_after_a_moment):
                pass
    assert time.monotonic() - started < 5


# ---- a lost lock aborts the job; embedded jobs have a timeout ----------------------------------
def _tenant_with_conversations(data: Path, user: str, n: int) -> TenantPaths:
    from tests.conftest import write_conversation

    paths = TenantPaths.for_user(data, user)
    for i in range(n):
        write_conversation(paths.src, f"c{i}", [f"Conversation {i} opened ticket MT-{7000 + i}."])
    return paths


async def test_an_embedded_job_whose_lock_was_taken_over_commits_nothing(tmp_path, redis_url, r):
    import redis.asyncio as aioredis

    from shared.redis_lock import LockLost, RedisLock

    paths = _tenant_with_conversations(tmp_path, "lena", 3)
    client = aioredis.Redis.from_url(redis_url)
    lock = RedisLock(client, f"recall:lock:index:{paths.uhash}", ttl_s=30)
    try:
        assert await lock.acquire()
        lock.keep_alive()
        r.set(lock.key, "another-worker")  # it expired during a pause and another worker took it
        with pytest.raises(LockLost):
            await EmbeddedIndexJob(900).run(paths, lock=lock)
        assert not (paths.memory / "chunks.sqlite3").exists() or not memory_rows_at(paths)
        assert r.get(lock.key) == "another-worker", "the new owner's lock is left alone"
        await lock.release()
    finally:
        await client.aclose()


class StoppedAtTheThirdBatch:
    """The job's model, and a SIGTERM (`stop`, run on the event loop) arriving while it embeds
    its third batch."""

    def __init__(self, model, stop, lock) -> None:
        self.model, self.stop, self.lock, self.batches = model, stop, lock, 0
        self.loop = asyncio.get_running_loop()

    def __getattr__(self, name):
        return getattr(self.model, name)

    def embed(self, texts, batch_size=32):
        self.batches += 1
        if self.batches == 3:
            self.loop.call_soon_threadsafe(self.stop)
            assert wait_until(lambda: self.lock.lost, 5)
        return self.model.embed(texts, batch_size)


async def _run_stopped_at_the_third_conversation(paths: TenantPaths, redis_url: str, stop_with) -> tuple[RedisLock, str]:
    """An embedded run over `paths`, one conversation per embedding batch, stopped by
    `stop_with(lock)` at the third: LockLost. Returns the lock and its token as the run ended."""
    import redis.asyncio as aioredis

    from shared.redis_lock import LockLost

    client = aioredis.Redis.from_url(redis_url)
    lock = RedisLock(client, f"recall:lock:index:{paths.uhash}", ttl_s=30)
    job = EmbeddedIndexJob(900)
    job.embedder = StoppedAtTheThirdBatch(job.embedder, lambda: stop_with(lock), lock)
    try:
        assert await lock.acquire()
        lock.keep_alive()
        with pytest.raises(LockLost):
            await job.run(paths, lock=lock)
        held = await client.get(lock.key)
        await lock.release()
        return lock, held.decode() if held else ""
    finally:
        await client.aclose()


async def test_an_embedded_run_stopped_mid_import_keeps_the_conversations_it_embedded(tmp_path, redis_url, monkeypatch):
    import shared.engine.index_run as index_run

    monkeypatch.setattr(index_run, "EMBED_BATCH", 1)  # a checkpoint after each conversation's one chunk
    paths = _tenant_with_conversations(tmp_path, "vera", 6)
    lock, held = await _run_stopped_at_the_third_conversation(paths, redis_url, RedisLock.give_up)
    assert sorted(memory_rows_at(paths)) == [(1,), (2,), (3,)], "the three it embedded were committed, the rest not"
    assert lock.given_up and held == lock.token, "it committed while it still held the lock"
    await EmbeddedIndexJob(900).run(paths)
    assert len(memory_rows_at(paths)) == 6, "the next run embeds the other three"


async def test_a_stopped_run_whose_lock_another_worker_took_commits_nothing(tmp_path, redis_url, r, monkeypatch):
    import shared.engine.index_run as index_run

    monkeypatch.setattr(index_run, "EMBED_BATCH", 1)
    paths = _tenant_with_conversations(tmp_path, "wera", 6)

    def taken_over_then_stopped(lock: RedisLock) -> None:
        r.set(lock.key, "another-worker")  # it expired during a pause and another worker took it
        lock.give_up()

    _, held = await _run_stopped_at_the_third_conversation(paths, redis_url, taken_over_then_stopped)
    assert held == "another-worker"
    assert not (paths.memory / "chunks.sqlite3").exists() or not memory_rows_at(paths), "the fence asked Redis"


def memory_rows_at(paths: TenantPaths) -> list:
    conn = sqlite3.connect(paths.memory / "chunks.sqlite3")
    try:
        return conn.execute("SELECT row_id FROM chunks").fetchall()
    finally:
        conn.close()


SLOW_INDEX = """#!/usr/bin/env bash
if [ "$1" = "index" ]; then sleep 30; fi
exec "{engine}" "$@"
"""


async def test_a_funes_job_is_killed_when_its_lock_is_lost(tmp_path, redis_url, r):
    import redis.asyncio as aioredis

    from services.indexer.index_job import FunesIndexJob
    from shared.redis_lock import LockLost, RedisLock

    slow = tmp_path / "funes"
    slow.write_text(SLOW_INDEX.format(engine=engine_cli()))
    slow.chmod(0o755)
    paths = _tenant_with_conversations(tmp_path / "data", "mira", 1)
    client = aioredis.Redis.from_url(redis_url)
    lock = RedisLock(client, f"recall:lock:index:{paths.uhash}", ttl_s=0.6)
    try:
        assert await lock.acquire()
        lock.keep_alive()
        job = asyncio.create_task(FunesIndexJob(str(slow), timeout_s=60).run(paths, lock=lock))
        await asyncio.sleep(0.3)
        r.set(lock.key, "another-worker")
        started = time.monotonic()
        with pytest.raises(LockLost):
            await asyncio.wait_for(job, 10)
        assert time.monotonic() - started < 2.0, "aborted at the next renewal, not after the 30 s run"
        assert not paths.memory.exists()
    finally:
        await client.aclose()


async def test_a_funes_rebuild_cancelled_while_it_empties_the_memory_ends_only_once_it_is_empty(tmp_path):
    """A run that yields or loses its lock gives the lock up as its cancellation ends. The
    deletion used to go on in its thread after that, inside a memory the lock's next holder
    (a forget's rebuild) was already writing."""
    from services.indexer.index_job import FunesIndexJob
    from services.indexer.snapshot_writer import mark_rebuild

    paths = _tenant_with_conversations(tmp_path / "data", "lena", 1)
    for d in range(40):
        shard = paths.memory / "chunks.lance" / f"data-{d}"
        shard.mkdir(parents=True)
        for f in range(500):
            (shard / f"{f}.lance").write_bytes(b"x")
    mark_rebuild(paths)
    lance = paths.memory / "chunks.lance"
    run = asyncio.create_task(FunesIndexJob("/bin/true", timeout_s=60).run(paths))
    while lance.exists() and sum(1 for _ in lance.glob("data-*")) == 40:
        await asyncio.sleep(0.001)  # until the deletion is under way
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert not paths.memory.exists(), "the deletion went on after its run had ended"


def test_a_funes_index_run_dies_with_an_indexer_killed_with_9(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    funes = tmp_path / "funes"  # an index run that would hold the tenant's memory for a minute
    funes.write_text('#!/usr/bin/env bash\necho $$ > "$FUNES_HOME/index.pid"\nexec sleep 60\n')
    funes.chmod(0o755)
    paths = _tenant_with_conversations(tmp_path / "data", "olga", 1)
    worker = subprocess.Popen([sys.executable, "-c", (
        "import asyncio, sys; from services.indexer.index_job import FunesIndexJob; "
        "from shared.tenant_paths import TenantPaths; "
        "asyncio.run(FunesIndexJob(sys.argv[1], timeout_s=120).run(TenantPaths(__import__('pathlib').Path(sys.argv[2]))))"),
        str(funes), str(paths.root)])
    try:
        assert wait_until(lambda: (paths.root / "index.pid").is_file() and (paths.root / "index.pid").read_text().strip(), 30)
        child = int((paths.root / "index.pid").read_text())
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)

        def gone() -> bool:
            try:
                return Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            except FileNotFoundError:
                return True

        assert wait_until(gone, 5), "the funes child outlived its indexer"
    finally:
        worker.kill()
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(int((paths.root / "index.pid").read_text()), signal.SIGKILL)


async def test_an_embedded_job_past_its_timeout_stops_and_commits_nothing(tmp_path):
    from services.indexer.index_job import IndexJobFailed

    paths = _tenant_with_conversations(tmp_path, "nora", 3)
    with pytest.raises(IndexJobFailed, match="timed out"):
        await EmbeddedIndexJob(timeout_s=1e-9).run(paths)
    assert not (paths.memory / "chunks.sqlite3").exists() or not memory_rows_at(paths)
    await EmbeddedIndexJob(timeout_s=900).run(paths)
    assert len(memory_rows_at(paths)) == 3


# ---- a data dir that becomes unwritable: not ready, and ingest refuses what it cannot store ------
def _make_unwritable(path: Path) -> None:
    import os
    import subprocess

    if os.geteuid() != 0:
        path.chmod(0o500)
    else:  # root ignores permission bits; the immutable flag still stops it
        subprocess.run(["chattr", "+i", str(path)], check=True)


def _make_writable(path: Path) -> None:
    import os
    import subprocess

    if os.geteuid() != 0:
        path.chmod(0o700)
    else:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_an_indexer_whose_redis_hangs_says_not_ready_within_the_probe_timeout(services, service_env, tmp_path):
    import os
    import signal

    from shared.redis_server import EmbeddedRedis

    own = EmbeddedRedis(tmp_path / "redis")
    own.start()
    try:
        services("indexer", RECALL_REDIS_URL=own.url)
        ready = f"http://127.0.0.1:{service_env['RECALL_INDEXER_PORT']}/readyz"
        assert httpx.get(ready, timeout=5).status_code == 200
        os.kill(own.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            resp = httpx.get(ready, timeout=10)
            assert resp.status_code == 503 and resp.json()["status"] == "redis unreachable"
            assert time.monotonic() - started < 2.5, "the manifests' probe gives up after 3 s"
        finally:
            os.kill(own.proc.pid, signal.SIGCONT)
    finally:
        own.stop()


def test_after_a_redis_restart_the_next_turns_are_stored_at_once_not_after_a_reclaim(services, service_env, tmp_path):
    """The services' pooled connections die with Redis: their first commands after a restart
    failed, and a stream entry then waited for the reclaimer (10 s by default) to be stored."""
    from shared.redis_server import EmbeddedRedis

    own = EmbeddedRedis(tmp_path / "redis")
    own.start()
    try:
        env = {"RECALL_REDIS_URL": own.url, "RECALL_RECLAIM_IDLE_MS": "10000"}
        service_env.update(env)
        services("ingest", **env)
        worker = services("indexer", **env)
        src = Path(service_env["RECALL_DATA_DIR"]) / user_hash("ria") / "src"
        post(service_env, conversation_payload("ria", "before", ["stored before the restart"]))
        assert wait_until(lambda: (src / "before.funes.jsonl").exists(), 30)
        own.restart()
        started = time.monotonic()
        post(service_env, conversation_payload("ria", "after", ["stored after the restart"]))
        assert wait_until(lambda: (src / "after.funes.jsonl").exists(), 30, 0.05)
        assert time.monotonic() - started < 8, worker.output()[-2000:]  # faststream may wait 5 s before its next read
        assert '"message.failed"' not in worker.output()
    finally:
        own.stop()


def test_an_unwritable_data_dir_makes_indexers_not_ready_and_ingest_refuse_turns_but_take_forgets(services, service_env, r):
    services("ingest")
    worker = services("indexer")
    data = Path(service_env["RECALL_DATA_DIR"])
    ingest_ready = f"{ingest_url(service_env)}/readyz"
    indexer_ready = f"http://127.0.0.1:{service_env['RECALL_INDEXER_PORT']}/readyz"
    assert httpx.get(ingest_ready).status_code == 200 and httpx.get(indexer_ready).status_code == 200
    _make_unwritable(data)
    try:
        assert wait_until(lambda: httpx.get(indexer_ready).status_code == 503, 10)
        assert "data dir not writable" in httpx.get(indexer_ready).json()["status"]
        # Ingest stays in its Service (the flag is every replica's): turns get its own 503, forgets go in.
        assert wait_until(lambda: "data dir not writable" in httpx.get(ingest_ready).json()["status"], 10)
        assert httpx.get(ingest_ready).status_code == 200
        resp = httpx.post(f"{ingest_url(service_env)}/turns", headers={"x-ingest-key": INGEST_KEY},
                          json=conversation_payload("olga", "o1", ["cannot be stored now"]), timeout=10)
        assert resp.status_code == 503 and [f["field"] for f in resp.json()["fields"]] == ["data_dir"], resp.text
        assert r.xlen("recall:turns") == 0, "nothing accepted that cannot be stored"
        forget = httpx.delete(f"{ingest_url(service_env)}/users/olga", headers={"x-ingest-key": INGEST_KEY}, timeout=10)
        assert forget.status_code == 202, forget.text
        lines = [json.loads(x) for x in worker.output().splitlines() if '"indexer.data_dir_not_writable"' in x]
        assert lines and lines[0]["reason"].startswith(("EPERM", "EACCES", "EROFS")), lines
    finally:
        _make_writable(data)
    assert wait_until(lambda: httpx.get(indexer_ready).status_code == 200 and httpx.get(ingest_ready).status_code == 200, 10)
    post(service_env, conversation_payload("olga", "o1", ["stored again"]))
    assert wait_until(lambda: searchable(service_env, "olga", 1), 30)


def test_one_corrupt_memory_does_not_stop_the_indexer_from_starting_for_everyone(services, service_env, r):
    """The start sweep for memories of another embedding model read every tenant's stamp; one
    unreadable chunks.sqlite3 made `recall indexer` exit (MemoryUnusable), so no tenant's turns
    were indexed and a Deployment would crash-loop."""
    corrupt = TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), "mallory")
    corrupt.memory.mkdir(parents=True)
    (corrupt.memory / "chunks.sqlite3").write_bytes(b"SQLite format 3\x00" + b"\x5a" * 8192)
    services("ingest")
    services("indexer")
    post(service_env, conversation_payload("alice", "conv-1", ["the K-2 machine trips", "ticket MT-4471"]))
    assert wait_until(lambda: searchable(service_env, "alice", 2), 60)


def test_ingest_stops_short_of_maxmemory_so_the_indexers_can_drain_the_backlog(services, service_env, r):
    """At maxmemory (noeviction, as deployed) Redis refuses the indexers' locks and schedules
    (SET, INCR, ZADD) and faststream's XGROUP CREATE at start: ingest filled Redis to the limit,
    after which no indexer could start or take a message, and nothing ever freed the memory."""
    services("ingest", RECALL_INGEST_REDIS_MEMORY_SHARE="0.7")  # of a 2 MiB budget: room for the indexer's clients
    before = r.config_get("maxmemory-policy")["maxmemory-policy"], r.config_get("maxmemory")["maxmemory"]
    r.config_set("maxmemory-policy", "noeviction")
    r.config_set("maxmemory", int(r.info("memory")["used_memory"]) + 2 * 2**20)
    try:
        filler = "the backlog grows while no indexer runs; " * 200  # ~8 KB a snapshot
        refused = None
        for i in range(1000):
            resp = httpx.post(f"{ingest_url(service_env)}/turns", headers={"x-ingest-key": INGEST_KEY}, timeout=10,
                              json=conversation_payload(f"filler{i % 7}", f"c{i}", [filler]))
            if resp.status_code != 202:
                refused = resp
                break
        assert refused is not None and refused.status_code == 503, "Redis never filled"
        assert refused.json()["fields"][0]["field"] == "redis" and "nearly full" in refused.text, refused.text
        # Used memory sways by a few KB around the share (client buffers): well past it for the probe.
        r.config_set("maxmemory", int(int(r.info("memory")["used_memory"]) / 0.8))
        ready = httpx.get(f"{ingest_url(service_env)}/readyz").json()["status"]  # said plain "ready" (an SRE's trial)
        assert ready.startswith("ready; turns refused (503): redis nearly full: uses "), ready
        backlog = r.xlen("recall:turns")
        services("indexer")
        assert wait_until(lambda: r.xlen("recall:turns") == 0, 120), f"{r.xlen('recall:turns')} of {backlog} left"
        post(service_env, conversation_payload("after", "c", ["accepted again once the backlog drained"]))
    finally:
        r.config_set("maxmemory", before[1])
        r.config_set("maxmemory-policy", before[0])


def test_ingest_on_a_stream_no_indexer_reads_says_so_in_readyz_and_its_metrics(services, service_env, r):
    """A typo in ingest's RECALL_STREAM: ingest made the group on its own stream and took every
    turn with 202 while the indexer read another; nothing said so (an SRE's trial)."""
    services("indexer")
    services("ingest", RECALL_STREAM="recall:turnz")
    post(service_env, conversation_payload("alice", "c1", ["the pump on line 4 overheats"]))
    ready = httpx.get(f"{ingest_url(service_env)}/readyz").json()["status"]
    assert ready.startswith("ready; no indexer reads RECALL_STREAM=recall:turnz (group indexers has no consumer) "
                            "and 1 entries wait"), ready
    metrics = httpx.get(f"{ingest_url(service_env)}/metrics").text
    assert "recall_ingest_stream_readers 0.0" in metrics and "recall_ingest_stream_length 1.0" in metrics
    # An indexer on that stream reads it: the note goes, and the turn is indexed.
    services("indexer", RECALL_STREAM="recall:turnz", RECALL_INDEXER_PORT=str(free_port()))
    assert wait_until(lambda: r.xlen("recall:turnz") == 0, 60), "the second indexer never read the stream"
    assert httpx.get(f"{ingest_url(service_env)}/readyz").json()["status"] == "ready"
    assert "recall_ingest_stream_readers 1.0" in httpx.get(f"{ingest_url(service_env)}/metrics").text


def test_a_redis_that_came_back_empty_gets_its_group_again_and_turns_flow(services, service_env, r):
    """Redis restarted without its data (no persistence, a new volume): the consumer group was
    gone, ingest went on answering 202, and no indexer ever received another entry, silently."""
    services("ingest")
    worker = services("indexer")
    post(service_env, conversation_payload("lena", "c1", ["before Redis lost its data"]))
    assert wait_until(lambda: searchable(service_env, "lena", 1), 20)
    r.flushdb()
    post(service_env, conversation_payload("lena", "c2", ["after Redis came back empty"]))
    assert wait_until(lambda: searchable(service_env, "lena", 2), 30), worker.output()[-2000:]
    assert '"indexer.consumers_restarted"' in worker.output()


async def test_the_services_redis_client_outlives_a_redis_restart(tmp_path):
    """redis-py tries nothing again by default: after a restart the first command on each pooled
    connection failed ("Connection closed by server"), a stream entry then waited for the reclaimer."""
    from shared.redis_client import async_redis
    from shared.redis_server import EmbeddedRedis

    own = EmbeddedRedis(tmp_path / "redis")
    own.start()
    client = async_redis(own.url, socket_timeout=5)
    try:
        await asyncio.gather(*(client.set(f"k{i}", i) for i in range(4)))  # four pooled connections
        own.restart()
        assert await client.pipeline(transaction=True).set("a", 1).get("a").execute() == [True, b"1"]
        assert await client.eval("return redis.call('GET', KEYS[1])", 1, "a") == b"1"
        assert await asyncio.gather(*(client.get(f"k{i}") for i in range(4))) == [b"0", b"1", b"2", b"3"]
    finally:
        await client.aclose()
        own.stop()


async def test_a_lock_whose_first_reply_was_lost_is_its_holders_after_the_retry(reply_losing_redis, r):
    """The services' connections send a command again when its connection fails, also after
    Redis ran it and only the reply was lost. A plain SET NX then said "taken" of the lock its
    first send took, and its holder waited for its own lock to expire."""
    from shared.redis_client import async_redis
    from shared.redis_lock import RedisLock

    client = async_redis(await reply_losing_redis.url(b"recall:lock:test"), socket_timeout=5)
    try:
        r.delete("recall:lock:test")
        lock = RedisLock(client, "recall:lock:test", ttl_s=30)
        assert await lock.acquire(), "its own lock, taken by the send whose reply was lost"
        assert reply_losing_redis.lost and r.get("recall:lock:test") == lock.token
        assert not await RedisLock(client, "recall:lock:test", ttl_s=30).acquire(), "and nobody else's"
    finally:
        await client.aclose()


async def test_a_renewal_still_running_when_its_lock_is_released_is_no_lost_lock(redis_url):
    """An SRE's trial fired RecallLocksLost under ordinary load: runs of ~0.5 s (one yielding
    renewal) logged lock.lost half a second after their own index.run ok. A renewal the release's
    cancellation did not stop (here: one that swallows it, as a client retrying a timeout does)
    found the key gone."""
    from shared.redis_client import async_redis
    from shared.redis_lock import LOCKS_LOST

    client = async_redis(redis_url)
    lock = RedisLock(client, "recall:lock:index:renewal-race", 30, yields_to="recall:forget-waiters:renewal-race")
    renewing = asyncio.Event()
    plain_renew = lock._renew

    async def renewal_that_outlives_its_cancellation() -> bool:
        renewing.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.3)
        return await plain_renew()

    lock._renew = renewal_that_outlives_its_cancellation
    lost_before = LOCKS_LOST._value.get()
    assert await lock.acquire()
    lock.keep_alive()
    await asyncio.wait_for(renewing.wait(), 5)
    await lock.release()
    await asyncio.sleep(0.6)
    assert not lock.lost and LOCKS_LOST._value.get() == lost_before
    await client.aclose()


async def test_the_longest_a_user_has_been_due_is_sampled_as_well_as_how_many_are(redis_url, r, tmp_path):
    """A soak trial's backlog grew from seconds to 25 minutes while recall_index_due_users sat at
    its ceiling, every tenant: the wait itself is now a gauge."""
    import redis.asyncio as aioredis

    from services.indexer import redis_keys
    from prometheus_client import REGISTRY

    from services.indexer.worker import _sample_stream
    from shared.stream_schema import ensure_group_async

    r.flushdb()
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url)
    client = aioredis.Redis.from_url(redis_url)
    await ensure_group_async(client, settings.stream, settings.group)
    r.zadd(redis_keys.DUE, {user_hash("waited"): time.time() - 600, user_hash("just-now"): time.time() + 1})
    sampler = asyncio.create_task(_sample_stream(client, settings))
    try:
        def gauge(name: str) -> float | None:
            return REGISTRY.get_sample_value(name)

        assert await asyncio.to_thread(wait_until, lambda: gauge("recall_index_due_users") == 2, 5)
        assert 600 <= gauge("recall_index_due_oldest_seconds") < 660
        r.delete(redis_keys.DUE)
        assert await asyncio.to_thread(wait_until, lambda: gauge("recall_index_due_oldest_seconds") == 0, 5)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        await client.aclose()
