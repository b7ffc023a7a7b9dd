"""The ingest API's request and response bodies (documented in docs/ingest-api.md)."""

from __future__ import annotations

import re
import unicodedata
from datetime import datetime, timedelta, timezone
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from services.ingest.redaction import find_secret
from shared.stream_schema import MAX_RETENTION_DAYS
from shared.tenant_paths import CONVERSATION_ID

ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}[T ]")
MAX_CLOCK_SKEW = timedelta(days=1)  # how far a gateway's clock may run ahead of ingest's


# What a field may hold of the control characters. A NUL cuts C strings and PostgreSQL text
# (agent memory refuses it, `nul_text.py`), so no field takes one. A turn's text takes the rest:
# copilots' tool turns carry terminal output (ESC colour codes, backspaces, form feeds) and a
# refused turn would leave its whole conversation unstorable; the agent gets it as JSON data.
# A name (user, tool, turn id) takes none but tab, newline and carriage return: no person
# writes one there, and ESC in a name rewrites a terminal that prints it (logs, `recall demo`).
NUL = re.compile("\x00")
CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # C0 but tab, LF, CR; DEL; C1 (CSI is U+009B)
NONE = re.compile("(?!)")  # refuses no character
TEXT_PATTERN = r"^[^\u0000]*$"  # the rules, for the OpenAPI document
NAME_PATTERN = r"^[^\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]*$"


def _storable(value: str, refused: re.Pattern[str]) -> str:
    # JSON may carry lone surrogates ("\\ud800"); they cannot be stored as UTF-8 anywhere downstream.
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains a lone surrogate (not valid Unicode text)") from None
    if found := refused.search(value):
        if found[0] == "\x00":
            raise ValueError(f"contains a NUL character (U+0000) at character {found.start()}") from None
        raise ValueError(f"contains the control character U+{ord(found[0]):04X} at character {found.start()}; "
                         "of the control characters only tab, newline and carriage return are allowed") from None
    return value


Text = Annotated[str, AfterValidator(lambda v: _storable(v, NUL)), Field(json_schema_extra={"pattern": TEXT_PATTERN})]
Name = Annotated[str, AfterValidator(lambda v: _storable(v, CONTROL)), Field(json_schema_extra={"pattern": NAME_PATTERN})]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("is blank: the recall service refuses a token whose subject is blank, so no one could read it")
    return value


# The user a conversation is stored for: what a token's `sub` names, so never blank either.
User = Annotated[Name, AfterValidator(_not_blank)]
# The user of a forget or a retention override: only hashed, never stored or printed. Ingest took
# every character in a user id (NUL and ESC too) until names refused control characters, and
# the users stored then must stay forgettable.
KnownUser = Annotated[str, AfterValidator(lambda v: _storable(v, NONE))]


def _one_token(value: str) -> str:
    # A turn id is printed inside the agent's `cite:` line and funes' `→ get <session> <turn>`
    # hint, both split on whitespace: a space, newline or other control character would cut
    # the id there (the agent cites a wrong turn) or start a line of its own in the answer.
    if any(ch.isspace() or unicodedata.category(ch) == "Cc" for ch in value):
        raise ValueError("must not contain whitespace or control characters")
    return value


def _no_secret(value: str) -> str:
    # Ids are stored, logged and shown as written: the conversation id names its file and its
    # forget, the agent cites a turn by its id. Redacting one would change what it names (two
    # turns' ids could become one), so an id holding what a turn's text would lose to redaction
    # is refused, and the message does not repeat it.
    if kind := find_secret(value):
        raise ValueError(f"looks like it holds a secret ({kind}): ids are stored and shown as written, "
                         "so they are never redacted; use an opaque id")
    return value


TurnId = Annotated[Name, AfterValidator(_one_token), AfterValidator(_no_secret)]
TURN_ID_PATTERN = r"^[^\s\x00-\x1f\x7f-\x9f]+$"  # the same rule, for the OpenAPI document


class IngestTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: TurnId | None = Field(None, min_length=1, max_length=128, json_schema_extra={"pattern": TURN_ID_PATTERN},
                              description="Stable turn id, without whitespace or control characters or a secret; defaults to <conversation_id>-<index>.")
    role: Literal["user", "assistant", "system", "tool"]
    text: Text
    ts: datetime = Field(description="ISO-8601 date-time of the turn (a string); without a zone it is taken as UTC.")
    tool_name: Name | None = Field(None, max_length=128, description="For tool turns: the tool whose output this is.")

    @field_validator("ts", mode="before")
    @classmethod
    def _iso_string(cls, ts: Any) -> Any:
        # pydantic would also take a number (unix time); the schema promises a date-time string.
        if not isinstance(ts, str) or not ISO_DATE.match(ts):
            raise ValueError("must be an ISO-8601 date-time string, e.g. 2026-10-08T10:00:00Z")
        return ts

    @field_validator("ts")
    @classmethod
    def _utc(cls, ts: datetime) -> datetime:
        try:
            utc = ts.replace(tzinfo=timezone.utc) if ts.tzinfo is None else ts.astimezone(timezone.utc)
        except OverflowError:
            raise ValueError("is outside years 1-9999 once converted to UTC") from None
        # A completed turn lies in the past. One dated later never ages: retention would keep
        # its conversation for ever and recency would rank it as new for ever.
        if utc > datetime.now(timezone.utc) + MAX_CLOCK_SKEW:
            raise ValueError(f"is more than {MAX_CLOCK_SKEW.days} day ahead of the server's clock (a completed turn lies in the past)")
        return utc


class IngestRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: User = Field(min_length=1, max_length=256, description="The end user this conversation belongs to.")
    conversation_id: Annotated[str, AfterValidator(_no_secret)] = Field(
        pattern=f"^{CONVERSATION_ID.pattern}$", description="[A-Za-z0-9_-]{1,128}; names a file. One holding a secret (a token) is refused.")
    # At least one: the newest snapshot replaces the stored one, so an empty list would erase
    # the conversation (forgetting is DELETE /conversations/{id}, with a receipt).
    turns: list[IngestTurn] = Field(min_length=1, description="The whole conversation so far, oldest first.")

    def turn_id(self, index: int) -> str:
        """The id a turn is stored under: its own, or `<conversation_id>-<index>`."""
        return self.turns[index].id or f"{self.conversation_id}-{index}"

    @model_validator(mode="after")
    def _unique_ids(self) -> "IngestRequest":
        # Over the ids turns are stored under, defaults included: an explicit "c-0" beside a
        # first turn without an id named two turns alike, and the engine kept only one of them.
        first: dict[str, int] = {}
        errors = []
        for i in range(len(self.turns)):
            tid = self.turn_id(i)
            if tid in first:
                errors.append(InitErrorDetails(
                    type=PydanticCustomError("duplicate_turn_id", "turn id {id} is already used by turns[{other}]",
                                             {"id": tid, "other": first[tid]}),
                    loc=("turns", i, "id"), input=tid))
            else:
                first[tid] = i
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self


class Accepted(BaseModel):
    stored: str
    turns: int = Field(description="Turns stored (recall answers echoed back are not).")
    redacted: int = Field(0, description="Secrets (and PII when enabled) replaced by [REDACTED:<kind>].")


class ForgetUser(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: KnownUser = Field(min_length=1, max_length=256)


class RetentionOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")
    days: Annotated[int, Strict()] | None = Field(None, ge=1, le=MAX_RETENTION_DAYS,
                             description="Keep this user's conversations this many days; null = the default.")


class FieldError(BaseModel):
    field: str
    message: str


class ErrorBody(BaseModel):
    error: str
    fields: list[FieldError] = []
