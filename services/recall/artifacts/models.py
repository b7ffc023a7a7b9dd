from __future__ import annotations

import re
from datetime import datetime, timezone
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, field_validator

ARTIFACT_PATH = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}(/[a-z0-9][a-z0-9._-]{0,63}){0,7}")
ARTIFACT_PATH_RULE = ("a logical address like agents/integration-researcher/worklog (lowercase segments of "
                      "[a-z0-9._-], at most 8)")
REALM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
# Each target is checked in the write's transaction (SQLite's write lock held): a megabyte of targets
# held every writer of the database for as long as their checks took.
MAX_TARGETS = 20
ARTIFACT_ID_MAX = 64  # ids are 32 hex digits; a longer one is refused before any query, and never echoed
RECORD_ID_MAX = ARTIFACT_ID_MAX  # an AgentMemory record's id: 32 hex digits as well
REALM_ID_MAX = 128  # as REALM_ID
PRINCIPAL_MAX = 128  # as kind_schemas.PRINCIPAL
ENTITY_ID_MAX = 200  # as a target's id
ARTIFACT_PATH_MAX = 8 * 64 + 7  # as ARTIFACT_PATH: 8 segments of 64 and their slashes
NOT_BLANK = r"\S"  # a required text holds more than whitespace (pydantic's pattern searches the string)
ArtifactKind = Literal["worklog", "handoff", "decision", "strategy", "review_protocol", "dossier",
                       "constitution", "agent_registry", "charter"]
WriteMode = Literal["append", "replace"]


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# Stored as epoch seconds; shown to agents as RFC 3339 UTC.
Timestamp = Annotated[float, PlainSerializer(rfc3339, return_type=str, when_used="json")]


class Status(str, Enum):
    DRAFT = "draft"
    PROPOSED = "proposed"
    ACCEPTED = "accepted"
    SUPERSEDED = "superseded"
    REVOKED = "revoked"


class Role(str, Enum):
    OWNER = "owner"
    MEMBER = "member"
    READER = "reader"


class TargetKind(str, Enum):
    REALM = "realm"
    ENTITY = "entity"
    # Seed 004's other anchors, a template and a diagram: objects registered with that entity_kind.
    TEMPLATE = "template"
    DIAGRAM = "diagram"
    CONVERSATION = "conversation"


class TargetRole(str, Enum):
    PRIMARY = "primary"
    RELATED = "related"
    EVIDENCE = "evidence"
    HANDOFF_TARGET = "handoff_target"


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt key is refused, not dropped
    target_kind: TargetKind = Field(description="realm: the realm itself; entity: an object registered with "
                                                "register_realm_entity; template, diagram: one registered with that "
                                                "entity_kind; conversation: one of your own recorded conversations.")
    target_id: str = Field(min_length=1, max_length=200, description="The realm id, entity id or conversation id.")
    role: TargetRole = Field(TargetRole.PRIMARY, description="primary: what the memory is about; related; evidence: "
                             "grounds for it; handoff_target: the object whose work is handed over.")


def target_set(targets: list[Target]) -> frozenset[tuple[str, str, str]]:
    """Targets as what they say, order and repeats aside: an update naming the same ones changes nothing."""
    return frozenset((t.target_kind, t.target_id, t.role) for t in targets)


class Entry(BaseModel):
    seq: int
    body: str
    author: str
    created_at: Timestamp
    source_ref: str
    source_context: dict[str, Any]


class Artifact(BaseModel):
    artifact_id: str
    realm_id: str
    artifact_path: str
    artifact_kind: str
    write_mode: str
    status: Status
    body: str
    summary: str
    source_ref: str
    source_context: dict[str, Any]
    author: str
    created_at: Timestamp
    updated_at: Timestamp
    supersedes_artifact_id: str | None = None
    superseded_by_artifact_id: str | None = None
    revoked_reason: str | None = None
    targets: list[Target]
    # A journal's entries come a page at a time (a worklog grows for as long as it is kept):
    # `entries` is the page, `entries_total` how many there are, `entries_next_offset` the
    # `entries_offset` of the next page (None after the last).
    entries: list[Entry] = []
    entries_total: int = 0
    entries_next_offset: int | None = None

    def compact(self) -> dict[str, Any]:
        """What search returns: enough to choose, no body."""
        return {"artifact_id": self.artifact_id, "artifact_path": self.artifact_path, "artifact_kind": self.artifact_kind,
                "status": self.status.value, "summary": self.summary, "author": self.author, "updated_at": rfc3339(self.updated_at),
                "entries": self.entries_total, "targets": [t.model_dump(mode="json") for t in self.targets]}


class AuditEvent(BaseModel):
    artifact_id: str
    event: str  # created, updated, appended, submitted, accepted, revoked, superseded
    actor: str
    at: Timestamp
    detail: dict[str, Any] = {}


class DraftInput(BaseModel):
    """What create_memory_artifact_draft takes (besides the realm and the caller)."""

    artifact_path: str
    artifact_kind: ArtifactKind
    write_mode: WriteMode
    body: str = Field(min_length=1, pattern=NOT_BLANK)
    summary: str = Field(min_length=1, max_length=1000, pattern=NOT_BLANK)
    source_ref: str = Field(min_length=1, max_length=500, pattern=NOT_BLANK)
    source_context: dict[str, Any]
    targets: list[Target] = Field(min_length=1, max_length=MAX_TARGETS)
    supersedes_artifact_id: str | None = Field(None, max_length=ARTIFACT_ID_MAX)

    @field_validator("artifact_path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not ARTIFACT_PATH.fullmatch(v):
            raise ValueError(f"artifact_path must be {ARTIFACT_PATH_RULE}")
        return v
