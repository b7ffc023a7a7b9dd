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
