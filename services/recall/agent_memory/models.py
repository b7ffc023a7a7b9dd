from __future__ import annotations

import re
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from services.recall.artifacts.models import MAX_TARGETS, NOT_BLANK, Target, Timestamp, rfc3339
from shared.tenant_paths import CONVERSATION_ID

MemoryType = Literal["fact", "observation", "decision", "hypothesis", "historical"]
Reality = Literal["current_state", "target_state", "hypothesis", "decision", "historical_fact"]
RecordStatus = Literal["active", "retired"]
TAG = re.compile(r"[a-z0-9][a-z0-9._:-]{0,39}")
Tag = Annotated[str, Field(pattern=f"^{TAG.pattern}$", description="A lowercase label, e.g. contract-7 or vendor.")]


class Citation(BaseModel):
    """A verbatim passage of the author's own conversation, as `recall_my_conversations` names it
    on its `cite:` line."""

    model_config = ConfigDict(extra="forbid")
    session_id: str = Field(pattern=f"^{CONVERSATION_ID.pattern}$", description="The conversation (session) id.")
    turn_uuid: str = Field(min_length=1, max_length=200, description="The turn's id within that conversation.")


class RecordFields(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memory_type: MemoryType | None = Field(None, description="fact, observation, decision, hypothesis or historical.")
    title: str | None = Field(None, min_length=1, max_length=200, pattern=NOT_BLANK)
    summary: str | None = Field(None, min_length=1, max_length=1000, pattern=NOT_BLANK)
    # No character cap: RECALL_REALM_MAX_TEXT_BYTES bounds it in bytes of UTF-8 (a 413 naming it).
    content: str | None = Field(None, min_length=1, pattern=NOT_BLANK)
    reality: Reality | None = Field(None, description="current_state, target_state, hypothesis, decision or historical_fact.")
    targets: list[Target] | None = Field(None, min_length=1, max_length=MAX_TARGETS)
    tags: list[Tag] | None = Field(None, max_length=20)
    valid_from: AwareDatetime | None = Field(None, description="RFC 3339 with an offset; from when it holds.")
    valid_until: AwareDatetime | None = Field(None, description="RFC 3339 with an offset; after this it is hidden from default searches.")
    citations: list[Citation] | None = Field(None, max_length=20)
    # Seed 004: every record has a source reference and a free-form context of where it came from.
    source_ref: str | None = Field(None, min_length=1, max_length=500, pattern=NOT_BLANK,
                                   description="Where it comes from: a meeting, ticket, document or session id.")
    source_context: dict[str, Any] | None = Field(None, description="Free-form provenance (who, which call, which version).")

    @field_validator("memory_type", "title", "summary", "content", "reality", "targets", "tags", "citations",
                     "source_ref", "source_context", mode="before")
    @classmethod
    def _not_null(cls, v: Any) -> Any:
        # Only the validity period can be cleared with null; the rest would be a NULL the table
        # refuses (it was a 500). An empty list clears tags and citations.
        if v is None:
            raise ValueError("must not be null (only valid_from and valid_until can be cleared with null)")
        return v

    @field_validator("valid_from", "valid_until")
    @classmethod
    def _in_range(cls, v: datetime | None) -> datetime | None:
        # 9999-12-31T23:59:59-23:59 is a valid time whose UTC lies in year 10000: stored, it could
        # never be shown (rfc3339 raised), and the write answered a bare 500.
        if v is not None:
            try:
                v.astimezone(timezone.utc)
            except OverflowError:
                raise ValueError("must stay within years 1-9999 once converted to UTC") from None
        return v

    @model_validator(mode="after")
    def _period(self) -> "RecordFields":
        if self.valid_from and self.valid_until and self.valid_until <= self.valid_from:
            # Named where it belongs: a ValueError here was the body's (`error: "body"`).
            raise ValidationError.from_exception_data(type(self).__name__, [InitErrorDetails(
                type=PydanticCustomError("period", "valid_until must be after valid_from"), loc=("valid_until",),
                input=self.valid_until.isoformat())])
        return self


class RecordInput(RecordFields):
    """A new record: everything but the period, the tags and the citations is required."""

    @model_validator(mode="after")
    def _required(self) -> "RecordInput":
        missing = [f for f in ("memory_type", "title", "summary", "content", "reality", "targets") if getattr(self, f) is None]
        if missing:  # each named where it belongs (a ValueError here is the body's: `error: "body"`)
            raise ValidationError.from_exception_data(
                type(self).__name__, [InitErrorDetails(type="missing", loc=(f,), input=None) for f in missing])
        return self


class MemoryRecord(BaseModel):
    record_id: str
    realm_id: str
    memory_type: MemoryType
    title: str
    summary: str
    content: str
    reality: Reality
    tags: list[str]
    valid_from: Timestamp | None = None
    valid_until: Timestamp | None = None
    author: str
    created_at: Timestamp
    updated_at: Timestamp
    status: RecordStatus
    targets: list[Target]
    citations: list[Citation] = []
    source_ref: str | None = None  # None: a record written before records carried their source
    source_context: dict[str, Any] = {}

    def valid_at(self, now: float) -> bool:
        return (self.valid_from is None or self.valid_from <= now) and (self.valid_until is None or now < self.valid_until)

    def compact(self, now: float) -> dict[str, Any]:
        """What search returns: enough to choose, no content."""
        return {"record_id": self.record_id, "memory_type": self.memory_type, "reality": self.reality, "title": self.title,
                "summary": self.summary, "tags": self.tags, "author": self.author, "source_ref": self.source_ref,
                "updated_at": rfc3339(self.updated_at), "valid_from": rfc3339(self.valid_from) if self.valid_from else None,
                "valid_until": rfc3339(self.valid_until) if self.valid_until else None, "valid_now": self.valid_at(now),
                "targets": [t.model_dump(mode="json") for t in self.targets]}


def epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value else None


class RetireInput(BaseModel):
    """The optional JSON body of a retirement (DELETE …/memory/{id}): the reason, as `?reason=`."""

    model_config = ConfigDict(extra="forbid")
    reason: str | None = Field(None, max_length=1000, description="Why the record is retired (kept in the audit).")
