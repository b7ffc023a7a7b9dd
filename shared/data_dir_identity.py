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

import os
import secrets
from pathlib import Path

KEY = "recall:data-dir"
FILE = ".recall-data-dir"


def local_id(data_dir: Path) -> str:
    """The directory's id, written once: a temporary file linked into place, so that two services
    starting at once on a fresh volume agree on the one that got there first."""
    marker = data_dir / FILE
    try:
        return marker.read_text().strip()
    except FileNotFoundError:
        pass
    draft = data_dir / f"{FILE}.{os.getpid()}.{secrets.token_hex(4)}"
    draft.write_text(secrets.token_hex(16) + "\n")
    try:
        os.link(draft, marker)
    except FileExistsError:
        pass  # another service's id is in place: it is the directory's
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
    theirs = theirs.decode() if isinstance(theirs, bytes) else theirs
    if theirs in (None, ours):
        return None
    return (f"{var}={data_dir} is not the data directory the other services on this Redis use (its id "
            f"{ours[:8]}, theirs {theirs[:8]}): mount the shared volume there; for a new volume for the whole "
            f"deployment, delete the Redis key {KEY} first")
