"""Is the data dir writable? An indexer that cannot write snapshots must say so: its /readyz
answers 503 with the reason, a log line says why (on every change), and while it lasts the
shared key `STORAGE_UNWRITABLE` tells ingest to refuse turns with 503 instead of accepting
what cannot be stored."""

from __future__ import annotations

import asyncio
import errno
import os
import re
from pathlib import Path

import redis.asyncio as aioredis
from prometheus_client import Gauge

from shared.logging_setup import get_logger
from shared.stream_schema import STORAGE_UNWRITABLE

log = get_logger("recall.indexer.storage")
DATA_DIR_WRITABLE = Gauge("recall_data_dir_writable", "1 when this indexer's write probe of the data dir succeeds.")


def probe_write(data_dir: Path, name: str) -> str | None:
    """Create, fsync and remove a small file in the data dir; None when that works, else why not."""
    probe = data_dir / f".write-probe-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}"
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"ok")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
        return None
    except OSError as exc:
        code = errno.errorcode.get(exc.errno or 0, "error")
        return f"{code}: {exc.strerror or type(exc).__name__}"


class StorageProbe:
    def __init__(self, client: aioredis.Redis, data_dir: Path, name: str, interval_s: float = 2.0) -> None:
        self.client = client
        self.data_dir = data_dir
        self.name = name
        self.interval_s = interval_s
        self.reason: str | None = None

    async def check(self) -> str | None:
        reason = await asyncio.to_thread(probe_write, self.data_dir, self.name)
        if reason != self.reason:
            if reason is None:
                log.info("indexer.data_dir_writable_again", data_dir=str(self.data_dir))
            else:
                log.error("indexer.data_dir_not_writable", data_dir=str(self.data_dir), reason=reason)
        self.reason = reason
        DATA_DIR_WRITABLE.set(0 if reason else 1)
        try:
            if reason is not None:
                await self.client.set(STORAGE_UNWRITABLE, reason, ex=max(5, int(self.interval_s * 5)))
            elif await self.client.exists(STORAGE_UNWRITABLE):
                await self.client.delete(STORAGE_UNWRITABLE)  # another indexer still failing sets it again
        except aioredis.RedisError:
            pass  # /readyz reports Redis itself
        return reason

    async def run_forever(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.interval_s)
