"""The events on the Redis stream, as the ingest service writes them and indexers read them.

Wire format (stable, readable without faststream): each entry has plain fields
`kind`, `user_hash`, `conversation_id` (for operators and targeted clean-up) and `event`, the
JSON of the model below. faststream hands a consumer the fields dict as its body.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class StreamTurn(BaseModel):
    id: str
    role: Literal["user", "assistant", "system", "tool"]
    text: str
    ts: datetime


class TurnsEvent(BaseModel):
    """The whole conversation so far; the newest accepted snapshot wins."""

    kind: Literal["turns"] = "turns"
    user_hash: str = Field(description="user_hash(user) (shared/tenant_paths.py: keyed by RECALL_USER_HASH_KEY); the raw user id never reaches Redis.")
    conversation_id: str
    turns: list[StreamTurn]
    received_at: float = Field(description="Unix time the ingest service accepted it.")

    def fields(self) -> dict[str, str]:
        return {"kind": self.kind, "user_hash": self.user_hash, "conversation_id": self.conversation_id,
                "event": self.model_dump_json()}


class ForgetEvent(BaseModel):
    """Forget one conversation, or everything of a user. It travels the same stream as turns,
    so the stream id orders it against every snapshot: older snapshots are gone for good,
    newer ones start a new conversation."""

    kind: Literal["forget_conversation", "forget_user"]
    user_hash: str
    conversation_id: str | None = None
    receipt: str
    reason: Literal["request", "retention"] = "request"
    received_at: float
    version: str | None = Field(None, pattern=r"^[0-9]{1,20}-[0-9]{1,20}$", description="Retention: the stream id of the snapshot found expired. The deletion "
                                "is at that version, so a snapshot accepted since (the conversation resumed) stays.")

    def fields(self) -> dict[str, str]:
        return {"kind": self.kind, "user_hash": self.user_hash, "conversation_id": self.conversation_id or "",
                "event": self.model_dump_json()}


StreamEvent = TurnsEvent | ForgetEvent


def decode_fields(fields: dict) -> dict[str, str]:
    """Stream entry fields as str (redis-py hands bytes unless the client decodes responses)."""
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in fields.items()}


def parse_event(fields: dict) -> StreamEvent:
    kind = fields.get("kind", "turns")
    model = TurnsEvent if kind == "turns" else ForgetEvent
    return model.model_validate_json(fields["event"])


def deletion_key(receipt: str) -> str:
    """Redis hash holding a deletion receipt's status (pending/done) and what was removed."""
    return f"recall:deletion:{receipt}"


class DeletionReceipt(BaseModel):
    receipt: str
    status: Literal["pending", "done"]
    kind: Literal["forget_conversation", "forget_user"]
    conversation_id: str | None = None
    reason: Literal["request", "retention"] = "request"
    requested_at: float
    done_at: float | None = None
    removed: dict[str, int] = Field(default_factory=dict, description="What was removed: files, chunks, stream_entries, dead_letters.")


async def request_forget(client, stream: str, *, kind: str, user_hash: str, conversation_id: str | None,
                         reason: str = "request", receipt_ttl_s: int = 30 * 86400,
                         version: str | None = None) -> DeletionReceipt:
    """Put a forget event on the stream together with its pending receipt (one transaction).
    Never with MAXLEN: trimming drops the oldest entries whether processed or not, which would
    lose accepted snapshots and forget events (a receipt pending for ever)."""
    import secrets
    import time

    event = ForgetEvent(kind=kind, user_hash=user_hash, conversation_id=conversation_id, receipt=secrets.token_hex(12),
                        reason=reason, received_at=time.time(), version=version)
    record = DeletionReceipt(receipt=event.receipt, status="pending", kind=kind, conversation_id=conversation_id,
                             reason=reason, requested_at=event.received_at)
    pipe = client.pipeline(transaction=True)
    pipe.hset(deletion_key(event.receipt), mapping={"record": record.model_dump_json()})
    pipe.expire(deletion_key(event.receipt), receipt_ttl_s)
    pipe.xadd(stream, event.fields())
    await pipe.execute()
    return record


FORGET_CHANNEL = "recall:forget"  # pub/sub: recall replicas drop the tenant's handles and children
RETENTION_OVERRIDES = "recall:retention:days"  # hash user_hash -> days (a per-user override)
MAX_RETENTION_DAYS = 36_500  # a century: anything longer is a typo, and overflows date arithmetic
# Set, with a short TTL, by every indexer whose data-dir write probe fails (value: the reason);
# ingest refuses turns with 503 while it exists, rather than accepting what cannot be stored.
STORAGE_UNWRITABLE = "recall:storage:unwritable"


def dead_letter_stream(stream: str) -> str:
    return f"{stream}:dead"


def ensure_group(client, stream: str, group: str) -> None:
    """Create the consumer group at id 0 before anything is published or consumed.

    faststream would create it at `$`, losing whatever was published before (infra notes).
    """
    import redis

    try:
        client.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


async def ensure_group_async(client, stream: str, group: str) -> bool:
    """`ensure_group` on an asyncio client; True when the group was missing and is made now."""
    import redis

    try:
        await client.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
        return False
    return True
