"""Deletion you can prove: after a forget, no query finds the text, the files are gone and the
stream holds nothing of it; retention and redaction do what they say."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from services.indexer.forgetting import Forgetter
from services.indexer.index_job import EmbeddedIndexJob
from services.indexer.retention import RetentionSweeper
from services.indexer.settings import IndexerSettings
from services.ingest.redaction import Redactor
from shared.engine.text_analysis import stem
from shared.recall_answer_format import NO_MEMORY, looks_like_recall_answer, without_notes
from shared.tenant_paths import TenantPaths, user_hash
from tests.conftest import (INGEST_KEY, call_recall, engine_cli, files_on_disk, indexed_chunks, ingest_url, mint,
                            post_conversation, user_hash_under, wait_until)
from tests.data.secret_corpus import LOOK_ALIKES, PII, PII_LOOK_ALIKES, SECRETS

SECRET_PLAN = ["What did we decide for the Q-731 vault migration?", "Vault migration Q-731: codename BLUEHERON, budget 48k.", "ok"]
KEEP = ["The N-11 upgrade goes ahead.", "Proceed once MT-4471 is closed.", "thanks"]
HEADERS = {"x-ingest-key": INGEST_KEY}


def delete(env, path: str, **params) -> dict:
    resp = httpx.delete(f"{ingest_url(env)}{path}", headers=HEADERS, params=params, timeout=10)
    assert resp.status_code == 202, resp.text
    return resp.json()


def receipt_done(env, receipt: str) -> dict | None:
    body = httpx.get(f"{ingest_url(env)}/deletions/{receipt}", headers=HEADERS, timeout=10).json()
    return body if body["status"] == "done" else None


def stream_text(r) -> str:
    return json.dumps(r.xrange("recall:turns"))


@pytest.fixture(params=["embedded", "funes"])
def stack(request, services, service_env):
    engine = {"RECALL_ENGINE": request.param, "RECALL_FUNES_BIN": engine_cli()}
    services("ingest")
    services("indexer", **engine)
    services("serve", **engine)
    post_conversation(service_env, "alice", "secret-plan", SECRET_PLAN)
    post_conversation(service_env, "alice", "keep", KEEP)
    assert wait_until(lambda: indexed_chunks(service_env, "alice") == 6, 30)
    return service_env


async def assert_forgotten(env, user: str) -> None:
    """By exact identifier, by codename, by paraphrase: nothing of the secret plan comes back."""
    token = mint(user)
    for query in ("Q-731", "BLUEHERON", "vault migration codename and budget", "48k budget"):
        out = without_notes(await call_recall(env, token, query))  # a note may repeat the query's Q-731
        assert "BLUEHERON" not in out and "Q-731" not in out, (query, out)


async def test_forget_a_conversation(stack, r):
    env = stack
    token = mint("alice")
    assert "BLUEHERON" in await call_recall(env, token, "Q-731 codename")  # also warms the pool child
    tenant = Path(env["RECALL_DATA_DIR"]) / user_hash("alice")
    # The text, and its words as BM25 stems (lower case: chunk_stems, the snapshot's vocabulary).
    needles = (b"BLUEHERON", stem("blueheron").encode())
    stored = {n for data in files_on_disk(tenant).values() for n in needles if n in data}
    assert stored == set(needles), "the grep below looks for what is stored"
    receipt = delete(env, "/conversations/secret-plan", user="alice")
    assert receipt["status"] == "pending" and receipt["kind"] == "forget_conversation"
    assert wait_until(lambda: receipt_done(env, receipt["receipt"]) is not None, 30)
    done = receipt_done(env, receipt["receipt"])
    assert done["removed"]["files"] == 1 and done["removed"]["chunks"] == 3
    await assert_forgotten(env, "alice")
    assert "Proceed once MT-4471 is closed." in await call_recall(env, token, "MT-4471")
    src = TenantPaths.for_user(Path(env["RECALL_DATA_DIR"]), "alice").src
    assert not (src / "secret-plan.funes.jsonl").exists() and (src / "keep.funes.jsonl").exists()
    assert "BLUEHERON" not in stream_text(r)
    leftovers = [(p, n) for p, data in files_on_disk(tenant).items() for n in needles if n in data]
    assert not leftovers, f"deleted text still on disk in {leftovers}"


async def test_forget_a_user(stack, r):
    env = stack
    assert "BLUEHERON" in await call_recall(env, mint("alice"), "Q-731")
    receipt = delete(env, "/users/alice")
    assert wait_until(lambda: receipt_done(env, receipt["receipt"]) is not None, 30)
    assert receipt_done(env, receipt["receipt"])["removed"]["files"] == 2
    metrics_url = f"http://127.0.0.1:{env['RECALL_RECALL_PORT']}/metrics"
    assert wait_until(lambda: "recall_pool_processes 0.0" in httpx.get(metrics_url).text, 10), \
        "the recall replica dropped the forgotten tenant's engine child / reader"
    assert await call_recall(env, mint("alice"), "Q-731") == NO_MEMORY
    assert await call_recall(env, mint("alice"), "MT-4471") == NO_MEMORY
    assert not (Path(env["RECALL_DATA_DIR"]) / user_hash("alice")).exists()
    assert "BLUEHERON" not in stream_text(r) and "MT-4471" not in stream_text(r)
    post_conversation(env, "alice", "fresh", ["A new start: ticket Z-1 opened."])
    assert wait_until(lambda: indexed_chunks(env, "alice") == 1, 30), "a turn after the delete is a new memory"
    assert "Z-1" in await call_recall(env, mint("alice"), "Z-1 ticket")


async def test_a_forgotten_users_tombstone_under_a_keyed_hash_cannot_be_confirmed_by_hashing_their_id(services, service_env, r):
    """Unkeyed, sha256 of a guessable id (an e-mail) found its tombstone, its log lines and its
    stream fields: who once stored memories here stayed provable after the forget."""
    import hashlib
    import secrets

    user = "ursula@example.com"
    service_env["RECALL_USER_HASH_KEY"] = secrets.token_urlsafe(32)
    running = [services("ingest"), services("indexer"), services("serve")]
    post_conversation(service_env, user, "secret-plan", SECRET_PLAN)
    assert wait_until(lambda: indexed_chunks(service_env, user) == 3, 30)
    assert "BLUEHERON" in await call_recall(service_env, mint(user), "Q-731")
    receipt = delete(service_env, f"/users/{user}")
    assert wait_until(lambda: receipt_done(service_env, receipt["receipt"]) is not None, 30)
    data = Path(service_env["RECALL_DATA_DIR"])
    keyed = user_hash_under(service_env["RECALL_USER_HASH_KEY"], user)
    assert (data / ".tombstones" / keyed).exists(), "the tombstone is under the keyed hash"
    guess = hashlib.sha256(user.encode()).hexdigest()[:24]
    assert not [p for p in data.rglob("*") if guess in p.name]
    logs = "".join(p.output() for p in running)
    assert keyed in logs and guess not in logs and user not in logs
    assert guess not in json.dumps([r.xrange("recall:turns"), r.keys("*")])


def test_unprocessed_stream_entries_are_purged(services, service_env, r):
    services("ingest")
    for i in range(3):  # accepted, but no indexer is running yet
        post_conversation(service_env, "bob", "b1", [f"draft {i}: BLUEHERON plan"])
    post_conversation(service_env, "bob", "b2", ["unrelated MT-4471"])
    # A worker read b1's three snapshots and died: they sit pending. The reclaim idle time is
    # longer than the test, so no worker can pick one up before the delete is carried out (it
    # used to, now and then, and the receipt then counted 2).
    r.xreadgroup("indexers", "crashed-worker", {"recall:turns": ">"}, count=3)
    receipt = delete(service_env, "/conversations/b1", user="bob")
    services("indexer", RECALL_RECLAIM_IDLE_MS="120000")
    assert wait_until(lambda: receipt_done(service_env, receipt["receipt"]) is not None, 30)
    assert receipt_done(service_env, receipt["receipt"])["removed"]["stream_entries"] == 3
    assert wait_until(lambda: indexed_chunks(service_env, "bob") == 1, 30)
    assert "BLUEHERON" not in stream_text(r)
    assert wait_until(lambda: r.xpending("recall:turns", "indexers")["pending"] == 0, 10), "purged entries are acked too"
    assert not TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), "bob").transcript("b1").exists()


def test_deletes_racing_with_ingest_of_the_same_conversation(services, service_env):
    services("ingest")
    services("indexer")
    accepted_before_delete: list[int] = []
    stop = threading.Event()
    delete_sent = threading.Event()
    sent_after: list[int] = []

    def writer() -> None:
        i = 0
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                started_after = delete_sent.is_set()
                body = {"user": "carol", "conversation_id": "race",
                        "turns": [{"role": "user", "text": f"version marker V{i:04d}", "ts": "2026-10-08T10:00:00Z"}]}
                assert c.post(f"{ingest_url(service_env)}/turns", json=body, headers=HEADERS).status_code == 202
                (sent_after if started_after else accepted_before_delete).append(i)
                i += 1

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(1.0)
    receipt = delete(service_env, "/conversations/race", user="carol")
    delete_sent.set()
    time.sleep(1.0)
    stop.set()
    t.join()
    assert wait_until(lambda: receipt_done(service_env, receipt["receipt"]) is not None, 30)
    path = TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), "carol").transcript("race")
    assert sent_after, "some writes were sent after the delete"
    expected = f"V{max(sent_after):04d}"
    assert wait_until(lambda: path.exists() and expected in path.read_text(), 30), "the newest write after the delete wins"
    assert wait_until(lambda: indexed_chunks(service_env, "carol") == 1, 30)
    text = path.read_text()
    assert not any(f"V{i:04d}" in text for i in accepted_before_delete), "nothing accepted before the delete survives"


async def test_retention_sweep_with_a_fake_clock(services, service_env, redis_url, r):
    services("ingest")
    services("indexer")
    post_conversation(service_env, "dave", "old", ["Old plan about K-77."], day="2026-01-10")
    post_conversation(service_env, "dave", "recent", ["Recent plan about K-78."], day="2026-09-20")
    post_conversation(service_env, "erin", "old", ["Erin's old note about K-79."], day="2026-01-10")
    assert wait_until(lambda: indexed_chunks(service_env, "dave") == 2 and indexed_chunks(service_env, "erin") == 1, 30)
    httpx.put(f"{ingest_url(service_env)}/users/erin/retention", json={"days": 9999}, headers=HEADERS).raise_for_status()
    settings = IndexerSettings(data_dir=Path(service_env["RECALL_DATA_DIR"]), redis_url=redis_url, retention_days=90)
    client = aioredis.Redis.from_url(redis_url)
    fake_now = time.mktime((2026, 10, 1, 0, 0, 0, 0, 0, 0))
    try:
        assert await RetentionSweeper(client, settings, now=lambda: fake_now).sweep_once() == 1
    finally:
        await client.aclose()
    assert wait_until(lambda: indexed_chunks(service_env, "dave") == 1, 30)
    src = TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), "dave").src
    assert not (src / "old.funes.jsonl").exists() and (src / "recent.funes.jsonl").exists()
    assert indexed_chunks(service_env, "erin") == 1, "a per-user override keeps erin's note"


def test_secrets_never_reach_redis_or_disk(services, service_env, r):
    services("ingest")
    services("indexer")
    texts = [text for _, text, _ in SECRETS]
    post_conversation(service_env, "frank", "leaky", texts)
    assert wait_until(lambda: indexed_chunks(service_env, "frank") >= len(texts), 30)
    tenant = Path(service_env["RECALL_DATA_DIR"]) / user_hash("frank")
    on_disk = b"".join(files_on_disk(tenant).values())
    for kind, _, secret in SECRETS:
        assert secret.encode() not in on_disk, kind
    assert b"[REDACTED:private_key]" in on_disk and b"[REDACTED:aws_access_key]" in on_disk


def test_redactor_corpus_catches_every_secret_and_no_look_alike():
    plain, pii = Redactor(pii=False), Redactor(pii=True)
    for kind, text, secret in SECRETS:
        out = plain.redact(text)
        assert secret not in out.text and kind in out.kinds, (kind, out.text)
    for text in LOOK_ALIKES:
        assert plain.redact(text).text == text, text
    for kind, text, value in PII:
        assert value not in pii.redact(text).text and value in plain.redact(text).text, kind
    for text in PII_LOOK_ALIKES + LOOK_ALIKES:
        assert pii.redact(text).text == text, text


@pytest.mark.parametrize("unit", ["a.", "a-", "a+", "password:", "eyJaaaaaaaa-", "-----BEGIN PRIVATE KEY-----\n", "1-"])
def test_redaction_takes_time_linear_in_the_text_even_for_hostile_text(unit):
    """Runs of one pattern's characters made scheme / local-part / look-ahead scans restart at
    every position: 40k characters of "a.a.a…" took ~1.5 s of CPU (a 200k turn, ~35 s) inside
    ingest's event loop. Measured in process CPU time against prose of the same length."""
    redactor = Redactor(pii=True)
    size = 40_000
    prose = ("The N-11 upgrade goes ahead after MT-4471; Priya owns the K-2 ticket. " * (size // 60))[:size]

    def cpu(text: str) -> float:
        started = time.process_time()
        redactor.redact(text)
        return time.process_time() - started

    baseline = min(cpu(prose) for _ in range(3))
    hostile = min(cpu((unit * (size // len(unit) + 1))[:size]) for _ in range(2))
    assert hostile < 10 * baseline + 0.05, f"{hostile:.3f} s of CPU for {unit!r} runs vs {baseline:.3f} s for prose"


def test_recall_answers_echoed_back_are_not_stored(services, service_env, r):
    services("ingest")
    answer = "[2026-10-08 10:01 UTC]\nProceed once MT-4471 closes.\n  ~ user: what about N-11?\n---"
    body = {"user": "gina", "conversation_id": "echo", "turns": [
        {"role": "user", "text": "what did we decide on N-11?", "ts": "2026-10-09T10:00:00Z"},
        {"role": "tool", "text": "anything the tool said", "tool_name": "recall_my_conversations", "ts": "2026-10-09T10:00:01Z"},
        {"role": "tool", "text": answer, "ts": "2026-10-09T10:00:02Z"},
        {"role": "assistant", "text": "We decided to proceed once MT-4471 closes (2026-10-08).", "ts": "2026-10-09T10:00:03Z"}]}
    resp = httpx.post(f"{ingest_url(service_env)}/turns", json=body, headers=HEADERS)
    assert resp.status_code == 202 and resp.json()["turns"] == 2
    event = r.xrange("recall:turns")[-1][1]["event"]
    assert "anything the tool said" not in event and "~ user: what about N-11?" not in event
    assert looks_like_recall_answer(answer) and not looks_like_recall_answer("I found this: " + answer)


SLOW_FUNES = """#!/usr/bin/env bash
# A funes stand-in whose index runs take a while, to outlast the reclaim idle time.
if [ "$1" = "index" ]; then sleep 1.5; fi
exec "{engine}" "$@"
"""


def test_a_long_forget_is_not_reclaimed_and_run_twice(services, service_env, tmp_path):
    slow = tmp_path / "funes"
    slow.write_text(SLOW_FUNES.format(engine=engine_cli()))
    slow.chmod(0o755)
    services("ingest")
    worker = services("indexer", RECALL_ENGINE="funes", RECALL_FUNES_BIN=str(slow), RECALL_RECLAIM_IDLE_MS="300",
                      RECALL_INDEX_DEBOUNCE_S="0.05")
    post_conversation(service_env, "hana", "h1", ["The KESTREL-2 plan."])
    assert wait_until(lambda: indexed_chunks(service_env, "hana") == 1, 30)
    receipt = delete(service_env, "/conversations/h1", user="hana")
    assert wait_until(lambda: receipt_done(service_env, receipt["receipt"]) is not None, 30)
    time.sleep(3.0)  # long enough for a stolen redelivery to have run the forget a second time
    metrics = httpx.get(f"http://127.0.0.1:{service_env['RECALL_INDEXER_PORT']}/metrics").text
    assert "recall_indexer_retries_total 0.0" in metrics, "the heartbeat kept the message from being reclaimed"
    assert worker.output().count('"forget.done"') == 1


def test_forgets_waiting_for_one_users_lock_do_not_hold_back_other_users_turns_nor_a_stop(services, service_env, r):
    """Each forget waits for its user's index lock; in the message slots, six of one user took all
    four of a worker's slots and nobody else's turns were stored until that lock came free. Held
    beside the slots, they stay pending: a stopping worker leaves them to the next one."""
    from services.indexer import redis_keys as keys

    services("ingest")
    worker = services("indexer")
    for i in range(6):
        post_conversation(service_env, "alice", f"a{i}", [f"Alice note {i} about KESTREL."])
    assert wait_until(lambda: indexed_chunks(service_env, "alice") == 6, 30)
    lock = keys.index_lock(user_hash("alice"))
    r.set(lock, "a long rebuild elsewhere", px=120_000)  # as another worker's rebuild holds it
    receipts = [delete(service_env, f"/conversations/a{i}", user="alice")["receipt"] for i in range(6)]
    def metrics() -> str:  # the indexer's port may move when it is started again
        return httpx.get(f"http://127.0.0.1:{service_env['RECALL_INDEXER_PORT']}/metrics", timeout=10).text

    assert wait_until(lambda: "recall_indexer_forgets_held 6.0" in metrics(), 20)
    post_conversation(service_env, "bob", "b1", ["Bob's turn, posted behind alice's forgets."])
    assert wait_until(lambda: indexed_chunks(service_env, "bob") == 1, 20), "bob's turn waited for alice's lock"
    assert r.xpending("recall:turns", "indexers")["pending"] == 6, "the forgets stay pending until done"
    assert all(receipt_done(service_env, receipt) is None for receipt in receipts)
    started = time.monotonic()
    assert worker.terminate(timeout=30) == 0, worker.output()[-6000:]
    assert time.monotonic() - started < 15, "a stop waited for forgets that had not begun"
    services("indexer")
    r.delete(lock)
    assert wait_until(lambda: all(receipt_done(service_env, receipt) for receipt in receipts), 60)
    assert indexed_chunks(service_env, "alice") == 0
    assert wait_until(lambda: r.xpending("recall:turns", "indexers")["pending"] == 0, 10)
    assert wait_until(lambda: "recall_indexer_forgets_held 0.0" in metrics(), 10)


def test_a_worker_whose_held_forgets_are_full_still_stops_within_seconds(services, service_env, r):
    """Past RECALL_FORGETS_HELD the message handlers wait for room; the stop must not wait on them."""
    from services.indexer import redis_keys as keys

    services("ingest")
    worker = services("indexer", RECALL_FORGETS_HELD="1")
    r.set(keys.index_lock(user_hash("alice")), "a long rebuild elsewhere", px=120_000)
    for i in range(3):
        delete(service_env, f"/conversations/a{i}", user="alice")
    assert wait_until(lambda: r.xpending("recall:turns", "indexers")["pending"] == 3, 20)
    started = time.monotonic()
    assert worker.terminate(timeout=30) == 0
    assert time.monotonic() - started < 15


def test_a_forget_does_not_wait_for_a_long_index_run_of_the_user(services, service_env, funes_with_a_long_first_import):
    slow, started = funes_with_a_long_first_import
    services("ingest")
    worker = services("indexer", RECALL_ENGINE="funes", RECALL_FUNES_BIN=str(slow), RECALL_INDEX_DEBOUNCE_S="0.05")
    post_conversation(service_env, "yuki", "secret-plan", SECRET_PLAN)
    post_conversation(service_env, "yuki", "keep", KEEP)
    assert wait_until(started.exists, 30)
    time.sleep(0.5)
    receipt = delete(service_env, "/conversations/secret-plan", user="yuki")
    # The index run yields its lock at once; before, the forget waited out the whole run.
    assert wait_until(lambda: receipt_done(service_env, receipt["receipt"]) is not None, 20)
    assert '"outcome": "yielded"' in worker.output()
    # The yielded run is run again, over what remains.
    assert wait_until(lambda: indexed_chunks(service_env, "yuki") == len(KEEP), 30)


async def test_the_yield_request_stays_until_the_last_waiting_forget_of_the_user_is_done(tmp_path, redis_url, r):
    from services.indexer import redis_keys as keys
    from services.indexer.forgetting import Forgetter
    from services.indexer.index_job import FunesIndexJob

    client = aioredis.Redis.from_url(redis_url)
    forgetter = Forgetter(client, IndexerSettings(data_dir=tmp_path, redis_url=redis_url), FunesIndexJob("/bin/false", 5))
    waiting = keys.forget_waiting(user_hash("zoe"))
    first, second = forgetter._index_run_yielded(user_hash("zoe")), forgetter._index_run_yielded(user_hash("zoe"))
    await first.__aenter__()
    await second.__aenter__()
    await first.__aexit__(None, None, None)
    assert r.exists(waiting), "the second forget still waits: index runs must keep yielding"
    await second.__aexit__(None, None, None)
    assert not r.exists(waiting), "no forget waits: the user's index runs go on"
    await client.aclose()


async def test_a_yield_request_whose_reply_was_lost_is_still_withdrawn(tmp_path, reply_losing_redis, r):
    """The services' connections send a command again when the connection failed after Redis
    ran it. The request was a count: joined twice and left once, it stayed, and the user's
    index runs gave up their lock to no forget until it expired (one lock TTL)."""
    from services.indexer import redis_keys as keys
    from services.indexer.forgetting import Forgetter
    from services.indexer.index_job import FunesIndexJob
    from shared.redis_client import async_redis

    waiting = keys.forget_waiting(user_hash("zoe"))
    r.delete(waiting)
    client = async_redis(await reply_losing_redis.url(waiting.encode()), socket_timeout=5)
    forgetter = Forgetter(client, IndexerSettings(data_dir=tmp_path, redis_url="redis://unused"), FunesIndexJob("/bin/false", 5))
    try:
        async with forgetter._index_run_yielded(user_hash("zoe")):
            assert r.exists(waiting)
        assert reply_losing_redis.lost, "the request's first reply was lost"
        assert not r.exists(waiting), "no forget waits: the user's index runs go on"
    finally:
        await client.aclose()


async def test_a_receipt_tally_whose_reply_was_lost_is_counted_once(tmp_path, reply_losing_redis, r):
    from services.indexer.forgetting import Forgetter
    from services.indexer.index_job import EmbeddedIndexJob
    from shared.redis_client import async_redis
    from shared.stream_schema import ForgetEvent, deletion_key

    event = ForgetEvent(kind="forget_conversation", user_hash=user_hash("zoe"), conversation_id="c1", receipt="t" * 24,
                        received_at=time.time())
    r.delete(deletion_key(event.receipt))
    client = async_redis(await reply_losing_redis.url(deletion_key(event.receipt).encode()), socket_timeout=5)
    forgetter = Forgetter(client, IndexerSettings(data_dir=tmp_path, redis_url="redis://unused"), EmbeddedIndexJob(5))
    try:
        await forgetter._tally(event, files=1, chunks=7)
        await forgetter._tally(event, stream_entries=2)
        assert reply_losing_redis.lost, "the tally's first reply was lost"
        assert r.hmget(deletion_key(event.receipt), ["removed:files", "removed:chunks", "removed:stream_entries"]) == ["1", "7", "2"]
    finally:
        await client.aclose()


async def test_a_user_forget_moves_the_tenant_aside_and_a_crashed_attempts_leftovers_go_too(tmp_path, redis_url, r):
    import redis.asyncio as aioredis

    from services.indexer.snapshot_writer import tombstone_user, version_file
    from shared.stream_schema import ForgetEvent, deletion_key

    r.flushdb()
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url)
    client = aioredis.Redis.from_url(redis_url)
    forgetter = Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s))
    uh = user_hash("olga")
    root = tmp_path / uh
    (root / "memory").mkdir(parents=True)
    (root / "memory" / "chunks.sqlite3").write_text("olga's rows")
    leftover = TenantPaths(root.with_name(root.name + ".forgotten"))  # an earlier attempt killed mid-delete
    leftover.src.mkdir(parents=True)
    leftover.transcript("c").write_text("olga's turns")
    version_file(leftover, "c").write_text("1000-0")
    leftover.transcript("later").write_text("accepted after the deletion")
    version_file(leftover, "later").write_text("3000-0")
    tombstone_user(tmp_path, uh, "2000-0")
    r.sadd("recall:reembed:pending", uh)  # its memory had waited for a re-embed to another model
    event = ForgetEvent(kind="forget_user", user_hash=uh, receipt="b" * 24, received_at=time.time())
    await forgetter._forget_user(TenantPaths(root), "2000-0", event)  # its memory is unreadable: deleted all the same
    assert not r.sismember("recall:reembed:pending", uh), "a forgotten memory waits for no re-embed"
    assert r.hmget(deletion_key(event.receipt), ["removed:files", "removed:chunks"]) == ["1", "0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tombstones", uh]
    assert TenantPaths(root).transcript("later").read_text() == "accepted after the deletion"
    assert not (root / "memory").exists() and not TenantPaths(root).transcript("c").exists()
    assert r.zscore("recall:index:due", uh) is not None, "the kept snapshot is indexed anew"
    await forgetter._forget_user(TenantPaths(root), "2000-0", event)
    assert r.hget(deletion_key(event.receipt), "removed:files") == "1", "a redelivery: nothing more to remove"
    assert TenantPaths(root).transcript("later").exists()
    await client.aclose()


class Killed(BaseException):
    """kill -9 in the middle of a forget: nothing after it runs."""


async def _forget_killed_then_redelivered(client, settings, job, event, monkeypatch, obj, name: str, killed) -> dict:
    """The forget with `obj.<name>` replaced by `killed` (which raises Killed) dies; its redelivery
    and one more carry it out. Returns the receipt's record."""
    from shared.stream_schema import deletion_key

    real = getattr(obj, name)
    monkeypatch.setattr(obj, name, killed)
    with pytest.raises(Killed):
        await Forgetter(client, settings, job).forget("2000-0", event)
    monkeypatch.setattr(obj, name, real)
    await Forgetter(client, settings, job).forget("2000-0", event)  # the redelivery
    await Forgetter(client, settings, job).forget("2000-0", event)  # and one more: nothing is counted twice
    return json.loads(await client.hget(deletion_key(event.receipt), "record"))


@pytest.mark.parametrize("deleted_first", ["memory", "src"])
async def test_a_user_forget_killed_while_it_deletes_still_reports_everything_it_removed(tmp_path, redis_url, r, monkeypatch,
                                                                                         deleted_first):
    """kill -9 of the indexer while it deletes a large tenant: the redelivered forget finds part
    of the tree gone, and its receipt must still count every transcript and chunk, once."""
    import shutil

    from services.indexer.snapshot_writer import version_file
    from shared.engine.api import chunk_count
    from shared.engine.index_run import index_tree
    from shared.stream_schema import ForgetEvent
    from tests.conftest import write_conversation

    r.flushdb()
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url)
    client = aioredis.Redis.from_url(redis_url)
    job = EmbeddedIndexJob(settings.index_timeout_s)
    paths = TenantPaths.for_user(tmp_path, "pia")
    for i in range(3):
        write_conversation(paths.src, f"c{i}", [f"pump P-{i} overheats", "swap the bearing"])
        version_file(paths, f"c{i}").write_text(f"{1000 + i}-0")
    index_tree(paths.root, paths.src, job.embedder)
    assert chunk_count(paths.memory) == 6
    event = ForgetEvent(kind="forget_user", user_hash=paths.uhash, receipt="a" * 24, received_at=time.time())

    real_rmtree = shutil.rmtree

    def killed_midway(path, *args, **kwargs):
        real_rmtree(tmp_path / f"{paths.uhash}.forgotten" / deleted_first, ignore_errors=True)
        raise Killed

    record = await _forget_killed_then_redelivered(client, settings, job, event, monkeypatch, shutil, "rmtree", killed_midway)
    assert record["status"] == "done"
    assert record["removed"] == {"files": 3, "chunks": 6, "stream_entries": 0, "dead_letters": 0}
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tombstones"]
    await client.aclose()


@pytest.mark.parametrize("engine", ["embedded", "funes-without-forget"])
async def test_a_conversation_forget_killed_after_its_rows_went_still_counts_them_once(tmp_path, redis_url, r, monkeypatch,
                                                                                      fake_funes, engine):
    """kill -9 of the indexer after a conversation's rows were removed (or, in funes mode, after
    the rebuild without it) and before they were counted: the redelivery found them gone and
    its receipt said 0 chunks. It now counts from the first attempt's count, and only once."""
    from services.indexer.index_job import FunesIndexJob
    from shared.stream_schema import ForgetEvent
    from tests.conftest import write_conversation

    r.flushdb()
    paths = TenantPaths.for_user(tmp_path / "data", "pia")
    for i in range(3):
        write_conversation(paths.src, f"c{i}", [f"pump P-{i} overheats", "swap the bearing"])
    if engine == "embedded":
        settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url)
        job = EmbeddedIndexJob(settings.index_timeout_s)
    else:
        append_only = tmp_path / "funes-1.2"  # no `forget` (clap exits 2): a conversation goes by a rebuild
        append_only.write_text(f'#!/bin/sh\n[ "$1" = forget ] && exit 2\nexec "{fake_funes}" "$@"\n')
        append_only.chmod(0o755)
        settings = IndexerSettings(data_dir=tmp_path / "data", redis_url=redis_url, engine="funes", funes_bin=str(append_only))
        job = FunesIndexJob(str(append_only), 60)
    await job.run(paths)
    client = aioredis.Redis.from_url(redis_url)
    event = ForgetEvent(kind="forget_conversation", user_hash=paths.uhash, conversation_id="c1", receipt="k" * 24,
                        received_at=time.time())
    real_remove = job.remove_deleted

    async def killed_once_removed(*args, **kwargs):
        await real_remove(*args, **kwargs)
        raise Killed

    record = await _forget_killed_then_redelivered(client, settings, job, event, monkeypatch, job, "remove_deleted",
                                                   killed_once_removed)
    assert record["removed"] == {"files": 1, "chunks": 2, "stream_entries": 0, "dead_letters": 0}
    assert sorted(p.name for p in paths.src.glob("*.funes.jsonl")) == ["c0.funes.jsonl", "c2.funes.jsonl"]
    await client.aclose()


async def test_a_user_whose_memory_is_unreadable_is_forgotten_all_the_same(tmp_path, redis_url, r):
    """Counting the chunks for the receipt must not stop the deletion (it raised MemoryUnusable)."""
    from shared.stream_schema import ForgetEvent, deletion_key
    from tests.conftest import write_conversation

    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url)
    client = aioredis.Redis.from_url(redis_url)
    paths = TenantPaths.for_user(tmp_path, "ugo")
    write_conversation(paths.src, "c", ["the Q-731 codename is BLUEHERON"])
    paths.memory.mkdir(parents=True)
    (paths.memory / "chunks.sqlite3").write_text("not a database: a disk that lost it")
    event = ForgetEvent(kind="forget_user", user_hash=paths.uhash, receipt="c" * 24, received_at=time.time())
    await Forgetter(client, settings, EmbeddedIndexJob(settings.index_timeout_s)).forget("2000-0", event)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tombstones"]
    assert json.loads(r.hget(deletion_key(event.receipt), "record"))["removed"]["files"] == 1
    await client.aclose()


def _sample(name: str, **labels) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_an_absurd_retention_override_is_skipped_loudly_and_the_others_are_swept(tmp_path, redis_url, r):
    """An override written before the API validated it (or by hand) used to raise OverflowError
    and stop the sweep for every tenant, silently."""
    from tests.conftest import write_conversation

    r.flushdb()
    data = tmp_path / "data"
    for user in ("dave", "erin"):
        write_conversation(TenantPaths.for_user(data, user).src, "old", [f"{user}'s old plan"], day="2026-01-10")
    r.hset("recall:retention:days", mapping={user_hash("erin"): "1" + "0" * 40})
    settings = IndexerSettings(data_dir=data, redis_url=redis_url, retention_days=90)
    client = aioredis.Redis.from_url(redis_url)
    before = _sample("recall_retention_errors_total", where="override")
    try:
        expired = await RetentionSweeper(client, settings, now=lambda: time.mktime((2026, 10, 1, 0, 0, 0, 0, 0, 0))).sweep_once()
    finally:
        await client.aclose()
    assert expired == 2, "both fall back to the 90-day default; the bad override is ignored"
    assert _sample("recall_retention_errors_total", where="override") == before + 1


async def test_the_retention_loop_survives_any_error_and_counts_it(tmp_path, redis_url, r, monkeypatch):
    import asyncio

    r.flushdb()
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url, retention_days=30, retention_sweep_s=0.05)
    client = aioredis.Redis.from_url(redis_url)
    sweeper = RetentionSweeper(client, settings)
    failures = iter([PermissionError("data dir unreadable"), OverflowError("date value out of range")])

    def tenants_failing_twice():
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return []

    monkeypatch.setattr(sweeper, "_tenants", tenants_failing_twice)
    errors, sweeps = _sample("recall_retention_errors_total", where="sweep"), _sample("recall_retention_sweeps_total")
    loop = asyncio.create_task(sweeper.run_forever())
    try:
        for _ in range(200):
            await asyncio.sleep(0.05)
            if _sample("recall_retention_sweeps_total") > sweeps:
                break
        assert not loop.done(), "the loop is still running"
        assert _sample("recall_retention_sweeps_total") > sweeps, "a sweep completed after the two failures"
        assert _sample("recall_retention_errors_total", where="sweep") == errors + 2
    finally:
        loop.cancel()
        await client.aclose()


# ---- a done receipt means gone from every copy: Redis's files and the dead-letter stream too ----
def _files_holding(root: Path, marker: bytes) -> list[Path]:
    return [p for p, data in files_on_disk(root).items() if marker in data]


@pytest.mark.parametrize("kind", ["conversation", "user"])
def test_after_done_no_byte_of_the_text_is_left_in_the_data_dir_or_redis_files(services, service_env, tmp_path, kind):
    """Redis runs with its AOF inside the data dir, as under `recall up`; the byte grep covers
    every file there: tenant files, tombstones, appendonly.aof."""
    import redis as sync_redis

    from shared.redis_server import EmbeddedRedis

    data = Path(service_env["RECALL_DATA_DIR"])
    server = EmbeddedRedis(data / "redis")
    server.start()
    try:
        own = {"RECALL_REDIS_URL": server.url, "RECALL_MAX_DELIVERIES": "1"}
        env = {**service_env, **own}
        client = sync_redis.Redis.from_url(server.url, decode_responses=True)
        services("ingest", **own)
        services("indexer", **own)
        marker = "BLUEHERON-7f3a9c"
        post_conversation(env, "ivy", "secret-plan", [f"Vault migration codename {marker}, budget 48k."])
        post_conversation(env, "ivy", "keep", ["The N-11 upgrade goes ahead."])
        post_conversation(env, "zoe", "other", ["Zoe's unrelated note about K-5."])
        # A malformed copy of the secret conversation's event ends up in the dead-letter stream.
        client.xadd("recall:turns", {"kind": "turns", "user_hash": user_hash("ivy"), "conversation_id": "secret-plan",
                                     "event": f'{{"broken": "{marker}"'})
        client.xadd("recall:turns", {"kind": "turns", "user_hash": user_hash("zoe"), "conversation_id": "other",
                                     "event": '{"broken": "zoe"'})
        assert wait_until(lambda: client.xlen("recall:turns:dead") == 2, 30)
        assert wait_until(lambda: indexed_chunks(env, "ivy") == 2 and indexed_chunks(env, "zoe") == 1, 30)
        assert wait_until(lambda: _files_holding(data / "redis", marker.encode()), 5), "the AOF holds the text before"
        if kind == "conversation":
            receipt = delete(env, "/conversations/secret-plan", user="ivy")
        else:
            receipt = delete(env, "/users/ivy")
        assert wait_until(lambda: receipt_done(env, receipt["receipt"]) is not None, 60)
        assert receipt_done(env, receipt["receipt"])["removed"]["dead_letters"] == 1
        leftovers = _files_holding(data, marker.encode())
        assert not leftovers, f"deleted text still on disk in {leftovers}"
        assert marker not in json.dumps(client.xrange("recall:turns:dead"))
        assert client.xlen("recall:turns:dead") == 1, "the other user's dead letter stays"
    finally:
        server.stop()


async def test_rebuilding_a_stream_drops_deleted_bytes_and_keeps_groups_and_pending_entries(r, redis_url):
    """XDEL only flags an entry inside its listpack node; the rebuild must remove the bytes
    without disturbing consumers: same live ids, group cursor, pending owners and delivery counts."""
    from services.indexer.redis_compaction import DurableCompaction

    r.flushdb()
    ids = [r.xadd("s", {"kind": "turns", "event": f"text {i} " + ("SECRET-X" if i in (1, 3) else "kept")}) for i in range(6)]
    r.xgroup_create("s", "g", id="0")
    r.xreadgroup("g", "worker-a", {"s": ">"}, count=4)  # ids 0-3 pending with worker-a
    r.xclaim("s", "g", "worker-b", 0, [ids[2]])  # delivered twice now, owned by worker-b
    r.xack("s", "g", ids[1], ids[3])
    r.xdel("s", ids[1], ids[3])
    import redis as sync_redis

    raw_client = sync_redis.Redis.from_url(redis_url)
    assert b"SECRET-X" in raw_client.dump("s"), "XDEL alone leaves the bytes"
    before_pending = r.xpending_range("s", "g", "-", "+", 100)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await DurableCompaction(client, ["s", "absent-stream"]).compact()
    finally:
        await client.aclose()
    assert b"SECRET-X" not in raw_client.dump("s"), "the deleted entries' bytes are gone"
    assert [e[0] for e in r.xrange("s")] == [ids[0], ids[2], ids[4], ids[5]]
    after_pending = r.xpending_range("s", "g", "-", "+", 100)
    strip = lambda rows: [(p["message_id"], p["consumer"], p["times_delivered"]) for p in rows]  # noqa: E731
    assert strip(after_pending) == strip(before_pending) and len(after_pending) == 2
    assert r.xinfo_groups("s")[0]["last-delivered-id"] == ids[3]
    assert [e[0] for e in r.xreadgroup("g", "worker-c", {"s": ">"})[0][1]] == [ids[4], ids[5]]
    assert r.xadd("s", {"kind": "turns"}) > ids[5], "new ids keep growing"


async def test_rebuilding_a_large_backlog_needs_one_copy_of_it_not_two(tmp_path):
    """The rebuild read every entry into the script before writing the new stream: besides the
    AOF's copy of the rewrite, the script's copy took Redis's resident memory to about three
    times the backlog, at the moment (a forget during a large backlog) memory is high anyway."""
    import time

    from services.indexer.redis_compaction import DurableCompaction
    from shared.redis_server import EmbeddedRedis

    def used_mib(r) -> tuple[float, float]:
        # Redis's own allocator count (what maxmemory and a container's limit see first), not the
        # process's VmHWM: RSS also moved with how soon jemalloc handed freed pages back and with
        # the host (the same rebuild read +44 MiB here and +69 MiB on a CI runner).
        memory = r.info("memory")
        return memory["used_memory"] / 2**20, memory["used_memory_peak"] / 2**20

    server = EmbeddedRedis(tmp_path / "redis")  # its own: the peak is per process
    server.start()
    try:
        import redis as sync_redis

        sync = sync_redis.Redis.from_url(server.url)
        for batch in range(40):  # small pipelines: loading must not set the peak itself
            pipe = sync.pipeline(transaction=False)
            for i in range(500):
                pipe.xadd("s", {"kind": "turns", "event": f"{batch}-{i} " + "backlog text " * 150})
            pipe.execute()
        sync.xgroup_create("s", "g", id="0")
        sync.xreadgroup("g", "worker", {"s": ">"}, count=10)
        sync.xdel("s", *[entry_id for entry_id, _ in sync.xrange("s", count=5)])
        stream_mib = sync.memory_usage("s", samples=0) / 2**20
        time.sleep(1.5)  # the loading's AOF buffer written out
        before, loading_peak = used_mib(sync)
        client = aioredis.Redis.from_url(server.url)
        await DurableCompaction(client, ["s"])._rewrite()
        await client.aclose()
        _, peak = used_mib(sync)
        assert peak > loading_peak + 0.5 * stream_mib, "the rebuild set the peak measured, not the loading"
        # One copy: the new stream fills as the old one empties, and the AOF holds the rewrite's record (~1x).
        assert peak - before < 1.5 * stream_mib, f"+{peak - before:.0f} MiB to rebuild a {stream_mib:.0f} MiB stream"
        assert sync.xlen("s") == 19_995 and sync.xpending("s", "g")["pending"] == 5
        assert not sync.exists("s:rebuilding")
        sync.close()
    finally:
        server.stop()
