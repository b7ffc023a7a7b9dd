"""The backup and restore procedure of docs/operations.md loses nothing: Redis (unprocessed and
pending forget events with their stream ids, deletion receipts, retention overrides, dead
letters), the artifacts database (PostgreSQL), and DATA_DIR (transcripts with their versions,
user tombstones, the artifacts' search memories). After the restore a real indexer finishes
the pending deletion. Real redis-server, real PostgreSQL, real indexer."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg
import pytest
import redis
import redis.asyncio as aioredis

from services.indexer.snapshot_writer import tombstone_user, version_file, write_snapshot
from services.recall.artifacts.artifact_store import ArtifactStore
from shared.redis_server import EmbeddedRedis
from shared.stream_schema import (RETENTION_OVERRIDES, StreamTurn, TurnsEvent, dead_letter_stream, deletion_key, ensure_group,
                                  request_forget)
from shared.tenant_paths import TenantPaths, user_hash
from tests.conftest import _pg_bin, wait_until

STREAM, GROUP = "recall:turns", "indexers"


# Within carol's 30-day retention override whatever day the suite runs on, so the restored
# indexer's first retention sweep keeps the snapshot it then writes.
RECENT = (datetime.now(timezone.utc) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")


def snapshot(user: str, conversation_id: str, text: str) -> TurnsEvent:
    return TurnsEvent(user_hash=user_hash(user), conversation_id=conversation_id, received_at=time.time(),
                      turns=[StreamTurn(id="t0", role="user", text=text, ts=RECENT)])


def redis_state(client: redis.Redis) -> dict:
    return {"stream": client.xrange(STREAM), "groups": [g["name"] for g in client.xinfo_groups(STREAM)],
            "dead": client.xrange(dead_letter_stream(STREAM)), "overrides": client.hgetall(RETENTION_OVERRIDES),
            "receipts": {k: client.hgetall(k) for k in client.scan_iter("recall:deletion:*")}}


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def new_database(postgres_url: str) -> str:
    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres_url.rsplit("/", 1)[0] + f"/{name}"


async def test_restore_from_backup_loses_no_state_and_finishes_pending_deletions(tmp_path, postgres_url, services, service_env):
    if not _pg_bin("pg_dump") or not _pg_bin("pg_restore"):
        pytest.skip("pg_dump/pg_restore are not installed (Debian package postgresql-client)")
    # ---- live state ------------------------------------------------------------------------------
    live = EmbeddedRedis(tmp_path / "redis-live")
    live.start()
    data = tmp_path / "data-live"
    client = redis.Redis.from_url(live.url, decode_responses=True)
    ensure_group(client, STREAM, GROUP)
    bob = TenantPaths.for_hash(data, user_hash("bob"))
    bob_event = snapshot("bob", "b1", "bob's conversation, to be forgotten")
    write_snapshot(bob, bob_event, client.xadd(STREAM, bob_event.fields()))  # indexed and acked long ago
    client.xdel(STREAM, client.xrange(STREAM)[-1][0])
    tombstone_user(data, user_hash("mallory"), client.xadd(STREAM, {"kind": "noise"}))
    (data / ".artifacts" / "0123456789abcdef01234567").mkdir(parents=True)
    (data / ".artifacts" / "0123456789abcdef01234567" / "marker").write_text("artifact search memory")
    client.hset(RETENTION_OVERRIDES, user_hash("carol"), 30)
    async_client = aioredis.Redis.from_url(live.url, decode_responses=True)
    receipt = await request_forget(async_client, STREAM, kind="forget_user", user_hash=user_hash("bob"), conversation_id=None)
    await async_client.aclose()
    carol_event = snapshot("carol", "c1", "carol's latest snapshot, not yet written")
    client.xadd(STREAM, carol_event.fields())
    client.xadd(dead_letter_stream(STREAM), {"entry_id": "1-0", "reason": "invalid event", "deliveries": "1", "fields": "{}"})
    artifacts_url = new_database(postgres_url)
    store = ArtifactStore(artifacts_url)
    with store.transaction() as tx:
        tx.q("INSERT INTO artifacts (artifact_id, realm_id, artifact_path, artifact_kind, write_mode, status, body, summary,"
             " source_ref, source_context, author, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
             ("a1", "acme", "decisions/db", "decision", "replace", "accepted", "PostgreSQL", "s", "r", "{}", "lead", 1.0, 1.0))
    before_redis, before_files = redis_state(client), tree(data)

    # ---- backup, in the documented order: Redis first, then the database, then files -----------
    backup = tmp_path / "backup"
    backup.mkdir()
    client.bgrewriteaof()
    assert wait_until(lambda: client.info("persistence")["aof_rewrite_in_progress"] == 0, 30)
    for aof in ("appendonly.aof", "appendonlydir"):  # Redis 6 / Redis 7 layout
        source = live.data_dir / aof
        if source.is_dir():
            shutil.copytree(source, backup / "redis" / aof)
        elif source.exists():
            (backup / "redis").mkdir(exist_ok=True)
            shutil.copy2(source, backup / "redis" / aof)
    dump = subprocess.run([_pg_bin("pg_dump"), "-Fc", "-f", str(backup / "artifacts.dump"), artifacts_url], capture_output=True, text=True)
    assert dump.returncode == 0, dump.stderr
    shutil.copytree(data, backup / "data", symlinks=True)

    # ---- disaster: everything gone --------------------------------------------------------------
    client.close()
    live.kill()
    shutil.rmtree(live.data_dir)
    shutil.rmtree(data)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE {artifacts_url.rsplit('/', 1)[1]} WITH (FORCE)")

    # ---- restore: files, database, then Redis; indexers last ------------------------------------
    shutil.copytree(backup / "data", data, symlinks=True)
    restored_url = new_database(postgres_url)
    restore = subprocess.run([_pg_bin("pg_restore"), "--no-owner", "-d", restored_url, str(backup / "artifacts.dump")],
                             capture_output=True, text=True)
    assert restore.returncode == 0, restore.stderr
    shutil.copytree(backup / "redis", tmp_path / "redis-restored")
    restored = EmbeddedRedis(tmp_path / "redis-restored")
    restored.start()
    client = redis.Redis.from_url(restored.url, decode_responses=True)
    try:
        assert redis_state(client) == before_redis
        assert client.ttl(deletion_key(receipt.receipt)) > 0, "receipts keep their expiry"
        assert tree(data) == before_files
        assert version_file(bob, "b1").exists()
        with ArtifactStore(restored_url).transaction() as tx:
            assert [tuple(r) for r in tx.q("SELECT artifact_id, status, body FROM artifacts")] == [("a1", "accepted", "PostgreSQL")]

        # A real indexer on the restored state finishes the pending deletion and the unwritten snapshot.
        indexer = services("indexer", RECALL_REDIS_URL=restored.url, RECALL_DATA_DIR=str(data))
        assert wait_until(lambda: json.loads(client.hget(deletion_key(receipt.receipt), "record"))["status"] == "done", 60)
        assert not bob.root.exists()
        carol = TenantPaths.for_hash(data, user_hash("carol"))
        assert wait_until(lambda: carol.transcript("c1").exists(), 90), indexer.output()[-3000:]
        assert "not yet written" in carol.transcript("c1").read_text()
    finally:
        client.close()
        restored.stop()
