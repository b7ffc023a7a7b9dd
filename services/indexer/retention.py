"""Retention: forget conversations whose last turn is older than the tenant's limit.

The default is `RECALL_RETENTION_DAYS` (off when unset); a per-user override lives in Redis
(`PUT /users/{user}/retention` on ingest). One worker sweeps at a time (a Redis lock). An
expired conversation is not deleted here: a forget event goes onto the stream, so it is
ordered against in-flight turns and carried out like any deletion, with a receipt.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import redis.asyncio as aioredis

from services.indexer.metrics import RETENTION_ERRORS, RETENTION_EXPIRED, RETENTION_SWEEPS
from services.indexer.settings import IndexerSettings
from services.indexer.snapshot_writer import snapshot_version
from shared.engine.transcript import TRANSCRIPT_SUFFIX, parse_ts
from shared.error_site import loggable_failure
from shared.logging_setup import get_logger
from shared.redis_lock import RedisLock
from shared.stream_schema import MAX_RETENTION_DAYS, RETENTION_OVERRIDES, request_forget
from shared.tenant_paths import USER_HASH, TenantPaths

log = get_logger("recall.indexer.retention")
SWEEP_LOCK = "recall:lock:retention"
SWEEP_LOCK_TTL_S = 60.0  # a dead sweeper's lock frees within this
# Nobody asks for a retention forget's receipt (recall_forgotten_total{reason="retention"}
# counts them): kept the 30 days of a requested one, at ~840 bytes each, one per expired
# conversation, they took a large share of Redis's maxmemory (10,000 users expiring 5
# conversations a day: ~1.3 GB), and from 95 % of it ingest refuses turns.
RETENTION_RECEIPT_TTL_S = 86_400


def last_turn_time(path: Path) -> float | None:
    """The newest `ts` of a transcript (files are small: one line per turn)."""
    newest = None
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                ts = parse_ts(json.loads(raw).get("ts", ""))
            except (ValueError, AttributeError):
                continue
            if ts is not None and (newest is None or ts > newest):
                newest = ts
    return newest


class RetentionSweeper:
    def __init__(self, client: aioredis.Redis, settings: IndexerSettings, now: Callable[[], float] = time.time) -> None:
        self.client = client
        self.s = settings
        self.now = now

    async def run_forever(self) -> None:
        # Nothing may stop the sweeper for good: any error is logged, counted, and the next sweep runs.
        while True:
            try:
                await self.sweep_once()
            except aioredis.RedisError as exc:
                RETENTION_ERRORS.labels("redis").inc()
                log.warning("retention.redis_error", error=type(exc).__name__)
            except Exception as exc:
                RETENTION_ERRORS.labels("sweep").inc()
                log.error("retention.sweep_failed", **loggable_failure(exc))
            await asyncio.sleep(self.s.retention_sweep_s)

    async def sweep_once(self) -> int:
        """One sweep over every tenant; returns how many conversations it asked to forget."""
        lock = RedisLock(self.client, SWEEP_LOCK, ttl_s=SWEEP_LOCK_TTL_S)
        if not await lock.acquire():
            return 0  # another worker sweeps now
        # Renewed while the sweep runs: a sweep longer than the expiry (many tenants, every
        # transcript read) let another worker sweep alongside and ask to forget each expired
        # conversation twice (two receipts, retention_expired counted twice).
        lock.keep_alive()
        try:
            overrides = await self._overrides()
            if self.s.retention_days is None and not overrides:
                return 0
            expired = tenants = 0
            now = self.now()
            for tenant in await asyncio.to_thread(self._tenants):
                days = overrides.get(tenant.name, self.s.retention_days)
                if days is None:
                    continue
                tenants += 1
                try:
                    expired += await self._sweep_tenant(tenant, now - days * 86400)
                except aioredis.RedisError:
                    raise  # Redis is gone for every tenant: the loop retries the sweep
                except Exception as exc:  # one tenant's bad file must not stop the others
                    RETENTION_ERRORS.labels("tenant").inc()
                    log.error("retention.tenant_failed", user_hash=tenant.name,
                              **loggable_failure(exc))
            RETENTION_SWEEPS.inc()
            RETENTION_EXPIRED.inc(expired)
            log.info("retention.sweep", tenants=tenants, expired_conversations=expired,
                     default_days=self.s.retention_days, overrides=len(overrides))
            return expired
        finally:
            await lock.release()

    async def _overrides(self) -> dict[str, int]:
        """Per-user overrides; one the API would refuse (written before it validated) is skipped, loudly."""
        out = {}
        for raw_key, raw_days in (await self.client.hgetall(RETENTION_OVERRIDES)).items():
            uhash = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            try:
                days = int(raw_days)
            except ValueError:
                days = 0
            if not 1 <= days <= MAX_RETENTION_DAYS:
                RETENTION_ERRORS.labels("override").inc()
                log.error("retention.invalid_override", user_hash=uhash, allowed=f"1-{MAX_RETENTION_DAYS} days")
                continue
            out[uhash] = days
        return out

    async def _sweep_tenant(self, tenant: Path, cutoff: float) -> int:
        expired = 0
        for cid, version in await asyncio.to_thread(self._expired, TenantPaths(tenant), cutoff):
            # At the version judged: a newer snapshot (the user resumed the conversation, its
            # event maybe still on the stream) is not forgotten with it.
            await request_forget(self.client, self.s.stream, kind="forget_conversation", user_hash=tenant.name,
                                 conversation_id=cid, reason="retention", version=version,
                                 receipt_ttl_s=RETENTION_RECEIPT_TTL_S)
            expired += 1
        return expired

    def _tenants(self) -> list[Path]:
        if not self.s.data_dir.is_dir():
            return []
        return [p for p in self.s.data_dir.iterdir() if p.is_dir() and USER_HASH.fullmatch(p.name)]

    @staticmethod
    def _expired(paths: TenantPaths, cutoff: float) -> list[tuple[str, str | None]]:
        """Expired conversations, each with the version of the snapshot read (read first: a
        snapshot written between the two reads is then newer than the version named)."""
        out = []
        for path in sorted(paths.src.glob(f"*{TRANSCRIPT_SUFFIX}")):
            cid = path.name[: -len(TRANSCRIPT_SUFFIX)]
            version = snapshot_version(paths, cid)
            try:
                newest = last_turn_time(path)
            except FileNotFoundError:
                continue  # forgotten since it was listed (a user forget runs alongside): no error
            if newest is not None and newest < cutoff:
                out.append((cid, version))
        return out
