"""The events on the Redis stream, as the ingest service writes them and indexers read them.

Wire format (stable, readable without faststream): each entry has plain fields
`kind`, `user_hash`, `conversation_id` (for operators and targeted clean-up) and `event`, the
JSON of the model below. faststream hands a consumer the fields dict as its body.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

ROLES = ("user", "assistant", "system", "tool")


class StreamTurn(BaseModel):
    id: str
    role: Literal["user", "assistant", "system", "tool"]
    text: str
    ts: datetime


class TurnsEvent(BaseModel):
    """The whole conversation so far; the newest accepted snapshot wins."""

    kind: Literal["turns"] = "turns"
    user_hash: str = Field(description="sha256(user)[:24]; the raw user id never reaches Redis.")
    conversation_id: str
    turns: list[StreamTurn]
    received_at: float = Field(description="Unix time the ingest service accepted it.")

    def fields(self) -> dict[str, str]:
        return {"kind": self.kind, "user_hash": self.user_hash, "conversation_id": self.conversation_id,
                "event": self.model_dump_json()}


def parse_event(fields: dict) -> TurnsEvent:
    return TurnsEvent.model_validate_json(fields["event"])


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
