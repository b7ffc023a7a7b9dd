"""Which user hash a deployment uses, so that every process hashes users alike.

A tenant's directory, its Redis keys and the stream's `user_hash` field are all user_hash(user)
(shared/tenant_paths.py). A service with another RECALL_USER_HASH_KEY (or none) would file a
user's turns where the readers never look, and forget a directory nobody wrote. So the first
service to start records the deployment's scheme where the services meet, in the data directory
(FILE) and in Redis (KEY): `sha256` (unkeyed) or `hmac-sha256:<fingerprint>`, the fingerprint
being an HMAC of a fixed label under the key, never the key (without the key it confirms
nothing). Every later process whose own scheme differs refuses to start with one line naming
RECALL_USER_HASH_KEY.

A data directory that holds tenants from before this record existed, or a Redis whose stream
holds events from then, is unkeyed, and stays so: the raw user id is never stored, so its
tenants' directories cannot be re-hashed, and a key added to it would make its memories
unreachable. docs/operations.md ("Keying the user hash") says how to move to a keyed deployment.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from shared.data_dir_identity import write_once
from shared.tenant_paths import USER_HASH

KEY = "recall:user-hash"
FILE = ".recall-user-hash"
UNKEYED = "sha256"
VARIABLE = "RECALL_USER_HASH_KEY"
_LABEL = b"recall user-hash key fingerprint v1"
_MIGRATION = 'docs/operations.md, "Keying the user hash"'


def scheme(key: str) -> str:
    """What this process's key makes of user ids, as recorded (never the key itself)."""
    if not key:
        return UNKEYED
    return "hmac-sha256:" + hmac.new(key.encode("utf-8"), _LABEL, hashlib.sha256).hexdigest()[:16]


def holds_tenants(data_dir: Path) -> bool:
    """Whether any tenant directory is there (a listing, stopped at the first)."""
    return data_dir.is_dir() and any(p.is_dir() and USER_HASH.fullmatch(p.name) for p in data_dir.iterdir())


def data_dir_scheme(data_dir: Path) -> str | None:
    """The directory's recorded scheme; unkeyed when none is but it holds tenants (stored before
    the record existed); None for a new directory."""
    try:
        return (data_dir / FILE).read_text().strip()
    except FileNotFoundError:
        return UNKEYED if holds_tenants(data_dir) else None


def record_data_dir_scheme(data_dir: Path, ours: str) -> str:
    """Record `ours` as the directory's scheme unless one is; returns the recorded one (the
    first of services starting at once on a fresh volume)."""
    return write_once(data_dir / FILE, ours)


def redis_scheme(client, stream: str, ours: str, register: bool) -> str | None:
    """The scheme recorded in Redis (a sync client); `register`: record one first when none is
    (unkeyed when the stream already holds events from before the record, else `ours`). None
    when none is and we may not record (a recall replica's Redis user reads only). Raises
    redis's errors."""
    recorded = client.get(KEY)
    if recorded is None and register:
        client.set(KEY, UNKEYED if client.xlen(stream) else ours, nx=True)
        recorded = client.get(KEY)
    return recorded.decode() if isinstance(recorded, bytes) else recorded


def mismatch(ours: str, theirs: str | None, where: str) -> str | None:
    """One line when `where` (the data directory, the Redis) records another scheme than ours."""
    if theirs in (None, ours):
        return None
    if theirs == UNKEYED:
        return (f"{VARIABLE} is set, but {where} holds tenants under unkeyed user hashes (sha256 of the user id), which "
                f"cannot be re-hashed: with a key their memories would become unreachable; unset {VARIABLE} to keep "
                f"this deployment, or move to a new keyed one ({_MIGRATION})")
    if ours == UNKEYED:
        return (f"{VARIABLE} is not set, but {where} hashes user ids with a key (fingerprint "
                f"{_fingerprint(theirs)}): set the same {VARIABLE} as the deployment's other services")
    return (f"{VARIABLE} is not the key {where} hashes user ids with (its fingerprint {_fingerprint(theirs)}, this "
            f"key's {_fingerprint(ours)}): set the same {VARIABLE} for every service, or a user's turns land where "
            "their reads never look")


def _fingerprint(recorded: str) -> str:
    return recorded.removeprefix("hmac-sha256:")
