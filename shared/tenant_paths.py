"""Where a tenant's files live. Nothing from outside reaches a path without passing here.

`DATA_DIR/<user_hash(user)>/` is the tenant's FUNES_HOME: `src/` holds one
`<conversation_id>.funes.jsonl` per conversation, `memory/` the index. Directory names never
reveal user ids, and conversation ids must match a strict pattern before they name a file.

The user hash is `HMAC-SHA256(RECALL_USER_HASH_KEY, user)[:24]` once a service installed the
deployment's key (`use_user_hash_key`, after shared/user_hash_scheme.py checked that it is the
one the deployment's other services use), else `sha256(user)[:24]`: the scheme of deployments
started before the key existed, kept because their tenants' directories cannot be re-hashed
(the raw user id is never stored). Unkeyed, anyone who reads the logs or the volume can confirm a
guessable id (an e-mail) by hashing it; keyed, not without the key.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

CONVERSATION_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
USER_HASH = re.compile(r"[0-9a-f]{24}")


class UnsafeId(ValueError):
    pass


# The keyed HMAC, its key already absorbed: each hash copies it (cheaper than hmac.new per request).
_keyed: hmac.HMAC | None = None


def use_user_hash_key(key: str) -> None:
    """Hash users with `key` from now on in this process (an empty key: unkeyed sha256)."""
    global _keyed
    _keyed = hmac.new(key.encode("utf-8"), digestmod=hashlib.sha256) if key else None


def user_hash(user: str) -> str:
    """The tenant's directory name, also the id logs carry instead of the user id."""
    data = user.encode("utf-8", "surrogatepass")  # total: never raises
    if _keyed is None:
        return hashlib.sha256(data).hexdigest()[:24]
    digest = _keyed.copy()
    digest.update(data)
    return digest.hexdigest()[:24]


def check_conversation_id(conversation_id: str) -> str:
    if not CONVERSATION_ID.fullmatch(conversation_id):
        raise UnsafeId("conversation_id must match [A-Za-z0-9_-]{1,128}")
    return conversation_id


@dataclass(frozen=True)
class TenantPaths:
    root: Path  # FUNES_HOME of the tenant

    @classmethod
    def for_user(cls, data_dir: Path, user: str) -> "TenantPaths":
        return cls(data_dir / user_hash(user))

    @classmethod
    def for_hash(cls, data_dir: Path, uhash: str) -> "TenantPaths":
        if not USER_HASH.fullmatch(uhash):
            raise UnsafeId("not a tenant hash")
        return cls(data_dir / uhash)

    @property
    def uhash(self) -> str:
        return self.root.name

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def memory(self) -> Path:
        return self.root / "memory"

    @property
    def funes_rebuild(self) -> Path:
        """Marks a tenant whose funes memory must be rebuilt (funes is append-only): a snapshot
        rewrote lines it had stored, or a conversation was forgotten with a funes that has no
        `forget`. Its next funes index run starts from an empty memory (services/indexer/index_job.py)."""
        return self.root / ".funes-rebuild"

    def transcript(self, conversation_id: str) -> Path:
        return self.src / f"{check_conversation_id(conversation_id)}.funes.jsonl"

    def has_conversations(self) -> bool:
        """Whether any conversation is stored (a directory listing, stopped at the first)."""
        return self.src.is_dir() and any(self.src.glob("*.funes.jsonl"))
