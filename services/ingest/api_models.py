"""The ingest API's request and response bodies (documented in docs/ingest-api.md)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.tenant_paths import CONVERSATION_ID


class IngestTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str | None = Field(None, min_length=1, max_length=128, description="Stable turn id; defaults to <conversation_id>-<index>.")
    role: Literal["user", "assistant", "system", "tool"]
    text: str
    ts: datetime = Field(description="ISO-8601 time of the turn; without a zone it is taken as UTC.")
    tool_name: str | None = Field(None, max_length=128, description="For tool turns: the tool whose output this is.")

    @field_validator("ts")
    @classmethod
    def _utc(cls, ts: datetime) -> datetime:
        return ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)


class IngestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(min_length=1, max_length=256, description="The end user this conversation belongs to.")
    conversation_id: str = Field(pattern=f"^{CONVERSATION_ID.pattern}$", description="[A-Za-z0-9_-]{1,128}; names a file.")
    turns: list[IngestTurn] = Field(description="The whole conversation so far, oldest first.")

    @model_validator(mode="after")
    def _unique_ids(self) -> "IngestRequest":
        ids = [t.id for t in self.turns if t.id is not None]
        if len(ids) != len(set(ids)):
            raise ValueError("turn ids must be unique within a conversation")
        return self


class Accepted(BaseModel):
    stored: str
    turns: int = Field(description="Turns stored (recall answers echoed back are not).")
    redacted: int = Field(0, description="Secrets (and PII when enabled) replaced by [REDACTED:<kind>].")


class ForgetUser(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(min_length=1, max_length=256)


class RetentionOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")
    days: int | None = Field(None, ge=1, description="Keep this user's conversations this many days; null = the default.")


class FieldError(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    error: str
    fields: list[FieldError] = []
