"""The retention sweeper used to die silently: an error other than RedisError ended its loop for
every tenant with no log line. Any failed sweep must be logged with its error, and the loop goes on."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis
from structlog.testing import capture_logs

from services.indexer.retention import RetentionSweeper
from services.indexer.settings import IndexerSettings


async def test_a_failing_sweep_is_logged_with_its_error_and_the_next_sweep_runs(tmp_path, redis_url, r, monkeypatch):
    r.flushdb()
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url, retention_days=30, retention_sweep_s=0.05)
    client = aioredis.Redis.from_url(redis_url)
    sweeper = RetentionSweeper(client, settings)
    calls = []

    def tenants_failing_once():
        calls.append(1)
        if len(calls) == 1:
            raise OverflowError("date value out of range")
        return []

    monkeypatch.setattr(sweeper, "_tenants", tenants_failing_once)
    with capture_logs() as logs:
        loop = asyncio.create_task(sweeper.run_forever())
        try:
            for _ in range(200):
                await asyncio.sleep(0.05)
                if len(calls) >= 2:
                    break
            assert not loop.done(), "the loop is still running"
        finally:
            loop.cancel()
            await client.aclose()
    failed = [e for e in logs if e["event"] == "retention.sweep_failed"]
    assert len(failed) == 1 and failed[0]["log_level"] == "error", logs
    assert "OverflowError" in failed[0]["error"]
    assert len(calls) >= 2, "a sweep ran after the failure"


async def test_two_workers_never_sweep_at_once_however_long_a_sweep_takes(tmp_path, redis_url, r, monkeypatch):
    """The sweep lock expired after a fixed time without renewal: a long sweep let a second
    worker sweep alongside, and every expired conversation was asked to be forgotten twice."""
    import time

    from services.indexer import retention
    from shared.tenant_paths import user_hash
    from tests.conftest import write_conversation

    r.flushdb()
    monkeypatch.setattr(retention, "SWEEP_LOCK_TTL_S", 0.3)
    write_conversation(tmp_path / user_hash("uma") / "src", "old", ["an old note"], day="2020-01-10")
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url, retention_days=30)
    client = aioredis.Redis.from_url(redis_url)
    slow_expired = retention.RetentionSweeper._expired

    def slow(paths, cutoff):
        time.sleep(1.0)  # many tenants' transcripts to read
        return slow_expired(paths, cutoff)

    monkeypatch.setattr(retention.RetentionSweeper, "_expired", staticmethod(slow))
    try:
        first = asyncio.create_task(RetentionSweeper(client, settings).sweep_once())
        await asyncio.sleep(0.6)  # past the lock's expiry, mid-sweep
        second = await RetentionSweeper(client, settings).sweep_once()
        assert (await first, second) == (1, 0)
    finally:
        await client.aclose()
    assert r.xlen(settings.stream) == 1, "one forget request for the expired conversation"


async def test_a_conversation_forgotten_while_the_sweep_reads_its_tenant_is_no_error(tmp_path, redis_url, r):
    """A user forget running alongside removes transcripts the sweep has just listed: that was
    logged as retention.tenant_failed and counted in recall_retention_errors_total{where="tenant"}."""
    from prometheus_client import REGISTRY

    from shared.tenant_paths import user_hash
    from tests.conftest import write_conversation

    r.flushdb()
    src = tmp_path / user_hash("vera") / "src"
    write_conversation(src, "old", ["an old note"], day="2020-01-10")
    (src / "gone.funes.jsonl").symlink_to(src / "removed-after-the-listing.funes.jsonl")  # listed, then gone
    settings = IndexerSettings(data_dir=tmp_path, redis_url=redis_url, retention_days=30)
    client = aioredis.Redis.from_url(redis_url)
    errors = REGISTRY.get_sample_value("recall_retention_errors_total", {"where": "tenant"}) or 0.0
    try:
        with capture_logs() as logs:
            assert await RetentionSweeper(client, settings).sweep_once() == 1, "the expired conversation is still found"
    finally:
        await client.aclose()
    assert not [e for e in logs if e["event"] == "retention.tenant_failed"], logs
    assert (REGISTRY.get_sample_value("recall_retention_errors_total", {"where": "tenant"}) or 0.0) == errors
