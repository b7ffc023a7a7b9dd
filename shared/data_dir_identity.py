"""Which data directory a deployment's services share. The directory holds a random id, written
by the first service to start on it (RECALL_DATA_DIR/.recall-data-dir); the first indexer to
start on a Redis puts its directory's id there too (`recall:data-dir`), and every indexer and
recall replica after checks that its directory holds that id (a replica only reads the key: its
Redis user can write nothing but the due list).

An indexer started on a mistyped path created the directory, reported ready and took its share
of the stream into it: its users' conversations were indexed where no replica reads, and its
forgets answered `done` while the files it was never given stayed where the others read them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from pathlib import Path

import redis.asyncio as aioredis

from shared.logging_setup import get_logger

KEY = "recall:data-dir"
FILE = ".recall-data-dir"
WATCH_EVERY_S = 10.0

log = get_logger("recall.data_dir")


def local_id(data_dir: Path) -> str:
    """The directory's id, written once: a temporary file linked into place, so that two services
    starting at once on a fresh volume agree on the one that got there first."""
    marker = data_dir / FILE
    try:
        return marker.read_text().strip()
    except FileNotFoundError:
        return write_once(marker, secrets.token_hex(16))


def write_once(marker: Path, text: str) -> str:
    """Write `text` to `marker` unless it holds something already; returns what it holds. A
    temporary file linked into place, so that two services starting at once on a fresh volume
    agree on the first one's."""
    draft = marker.with_name(f"{marker.name}.{os.getpid()}.{secrets.token_hex(4)}")
    draft.write_text(text + "\n")
    try:
        os.link(draft, marker)
    except FileExistsError:
        pass  # another service's record is in place: it is the directory's
    finally:
        draft.unlink()
    return marker.read_text().strip()


def shared_dir_problem(redis_url: str, data_dir: Path, register: bool, var: str = "RECALL_DATA_DIR") -> str | None:
    """One line when `data_dir` is not the directory the services on `redis_url` share; None when
    it is, or when none is known yet (`register`: its id becomes the deployment's). Raises
    redis's errors."""
    import redis

    ours = local_id(data_dir)
    client = redis.Redis.from_url(redis_url, socket_connect_timeout=5, socket_timeout=10)
    try:
        if register:
            client.set(KEY, ours, nx=True)
        theirs = client.get(KEY)
    finally:
        client.close()
    return _problem(data_dir, ours, theirs, var)


def _problem(data_dir: Path, ours: str, theirs: bytes | str | None, var: str) -> str | None:
    theirs = theirs.decode() if isinstance(theirs, bytes) else theirs
    if theirs in (None, ours):
        return None
    return (f"{var}={data_dir} is not the data directory the other services on this Redis use (its id "
            f"{ours[:8]}, theirs {theirs[:8]}): mount the shared volume there; for a new volume for the whole "
            f"deployment, delete the Redis key {KEY} first")


class SharedDirWatch:
    """The same check while a service runs, every WATCH_EVERY_S: a Redis that lost its data (a
    FLUSHALL, a restart without its AOF) named no directory until the next start, so an indexer on
    a mistyped path could name its own and lock the right ones out at their restart; a replica
    started before any indexer had nothing to compare with. An indexer (`register`) names its
    directory (and its user hash scheme) again; a service whose directory is not the named one
    says so (`problem`, for its /readyz, and one log line when that changes)."""

    def __init__(self, client: aioredis.Redis, data_dir: Path, register: bool, var: str = "RECALL_DATA_DIR") -> None:
        self.client, self.data_dir, self.register, self.var = client, data_dir, register, var
        self.ours = ""
        self.problem: str | None = None

    async def check(self) -> None:
        self.ours = self.ours or local_id(self.data_dir)
        if self.register:
            await self.client.set(KEY, self.ours, nx=True)
            await self._record_user_hash_scheme()
        problem = _problem(self.data_dir, self.ours, await self.client.get(KEY), self.var)
        if problem and problem != self.problem:
            log.error("data_dir.not_shared", ours=self.ours[:8])
        self.problem = problem

    async def _record_user_hash_scheme(self) -> None:
        # The directory's user hash scheme too (shared/user_hash_scheme.py): after Redis lost it,
        # an ingest started with another key would otherwise record its own.
        from shared.user_hash_scheme import FILE as SCHEME_FILE
        from shared.user_hash_scheme import KEY as SCHEME_KEY

        with contextlib.suppress(FileNotFoundError):
            await self.client.set(SCHEME_KEY, (self.data_dir / SCHEME_FILE).read_text().strip(), nx=True)

    async def run_forever(self) -> None:
        while True:
            with contextlib.suppress(aioredis.RedisError, OSError):  # Redis or the volume away: the last verdict stands
                await self.check()
            await asyncio.sleep(WATCH_EVERY_S)
