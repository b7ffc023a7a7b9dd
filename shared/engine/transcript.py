"""The `.funes.jsonl` input format: one JSON line per message.

A line is `{session_id, turn_uuid, seq, ts, role, harness, blocks: [{block_type, text}]}`.
Lines that do not parse or do not fit the model are skipped and counted, never fatal:
a half-written trailing line from a crashed writer must not stop an index run.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

TRANSCRIPT_SUFFIX = ".funes.jsonl"


class Block(BaseModel):
    model_config = ConfigDict(extra="ignore")
    block_type: str = "text"
    text: str


class TranscriptTurn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    session_id: str = Field(min_length=1)
    turn_uuid: str = Field(min_length=1)
    seq: int
    ts: str = ""
    role: str = "user"
    harness: str = ""
    workdir: str = ""
    # Blank blocks are kept so block indexes (and so chunk ids) stay stable; chunking skips them.
    blocks: list[Block]

    @property
    def has_text(self) -> bool:
        return any(b.text.strip() for b in self.blocks)


@dataclass(frozen=True)
class ParsedTranscript:
    turns: list[TranscriptTurn]
    malformed_lines: int


def parse_ts(ts: str) -> float | None:
    """RFC 3339 → epoch seconds; None when absent or unparseable (funes: weight 1.0)."""
    if not ts:
        return None
    try:
        dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def read_transcript(path: Path) -> ParsedTranscript:
    turns: list[TranscriptTurn] = []
    malformed = 0
    with open(path, "rb") as fh:
        for raw in fh:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            try:
                turn = TranscriptTurn.model_validate(json.loads(line))
            except (ValueError, ValidationError):
                malformed += 1
                continue
            if turn.has_text:
                turns.append(turn)
    return ParsedTranscript(turns, malformed)


def transcript_signatures(root: Path) -> dict[str, str]:
    """Every `*.funes.jsonl` below root (or root itself): its path → `size:mtime_ns`, in the order
    a sorted walk meets them (a directory's files, then its subdirectories).

    Symlinks are not followed and only regular files count: a tenant's tree must not reach
    outside itself. One `scandir` pass: every index run lists the whole tree (a warm indexer's
    one-conversation run at 10k conversations spent 130 ms in `os.walk`, `Path` and two stats
    per file; this is ~30 ms, docs/benchmarks.md "Round 10")."""
    found: dict[str, str] = {}
    if root.is_file():
        with contextlib.suppress(FileNotFoundError):  # removed since: treated as deleted
            found[str(root)] = _signature(root.stat())
        return found

    def walk(directory: str) -> None:
        try:
            with os.scandir(directory) as entries:
                listed = sorted(entries, key=lambda e: e.name)
        except FileNotFoundError:
            return  # a directory removed during the walk: its files count as deleted, as os.walk had it
        for entry in listed:
            if entry.name.endswith(TRANSCRIPT_SUFFIX) and not entry.name.startswith(".") and entry.is_file(follow_symlinks=False):
                try:
                    found[entry.path] = _signature(entry.stat(follow_symlinks=False))
                except FileNotFoundError:
                    continue  # removed since it was listed: treated as deleted
        for entry in listed:
            if entry.is_dir(follow_symlinks=False):
                walk(entry.path)

    walk(str(root))
    return found


def _signature(st: os.stat_result) -> str:
    return f"{st.st_size}:{st.st_mtime_ns}"


def dump_transcript(turns: list[TranscriptTurn]) -> str:
    """The file body for a conversation: one line per turn, newline-terminated."""
    return "".join(t.model_dump_json() + "\n" for t in turns)
