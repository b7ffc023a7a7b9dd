"""Write a conversation snapshot as its `.funes.jsonl` file, atomically and never backwards.

The version of a snapshot is its stream entry id (ingest order). Under the conversation's
Redis lock, a snapshot older than the one on disk is dropped; otherwise it is written to a
temp file, fsynced and renamed over the old one, then the version sidecar is updated. An
equal version is rewritten, so a redelivery after a crash between the two steps heals.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

from shared.engine.transcript import Block, TranscriptTurn, dump_transcript
from shared.stream_schema import TurnsEvent
from shared.tenant_paths import TenantPaths

HARNESS = "copilot"


class WriteResult(Enum):
    WRITTEN = "written"
    STALE = "stale"  # a newer snapshot of the conversation is already on disk


def parse_version(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def transcript_body(event: TurnsEvent) -> str:
    turns = [
        TranscriptTurn(session_id=event.conversation_id, turn_uuid=t.id, seq=seq,
                       ts=t.ts.strftime("%Y-%m-%dT%H:%M:%SZ"), role=t.role, harness=HARNESS,
                       blocks=[Block(block_type="text", text=t.text)])
        for seq, t in enumerate(event.turns)
    ]
    return dump_transcript(turns)


def _atomic_write(path: Path, data: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def version_file(paths: TenantPaths, conversation_id: str) -> Path:
    return paths.src / f".{conversation_id}.version"


def user_tombstone(data_dir: Path, uhash: str) -> Path:
    """Written when a user is forgotten (the tenant directory itself is removed): snapshots
    accepted before the deletion must not bring the user back. It holds no user data."""
    return data_dir / ".tombstones" / uhash


def _read_version(path: Path) -> tuple[int, int] | None:
    try:
        return parse_version(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _older_than_user_deletion(paths: TenantPaths, mine: tuple[int, int]) -> bool:
    forgotten = _read_version(user_tombstone(paths.root.parent, paths.uhash))
    return forgotten is not None and forgotten > mine


def write_snapshot(paths: TenantPaths, event: TurnsEvent, entry_id: str) -> WriteResult:
    """Call with the conversation lock held. Durable (fsynced) when it returns WRITTEN."""
    target = paths.transcript(event.conversation_id)
    mine = parse_version(entry_id)
    vfile = version_file(paths, event.conversation_id)
    current = _read_version(vfile)
    if (current is not None and current > mine) or _older_than_user_deletion(paths, mine):
        return WriteResult.STALE
    paths.src.mkdir(parents=True, exist_ok=True)
    _atomic_write(target, transcript_body(event))
    _atomic_write(vfile, entry_id)
    _fsync_dir(paths.src)
    # A user deletion does not take conversation locks; if one landed while we wrote, undo.
    if _older_than_user_deletion(paths, mine):
        target.unlink(missing_ok=True)
        return WriteResult.STALE
    return WriteResult.WRITTEN


def tombstone_conversation(paths: TenantPaths, conversation_id: str, entry_id: str) -> int:
    """Call with the conversation lock held: remove the transcript and record the deletion's
    version, so a snapshot accepted before it is dropped and one accepted after it starts anew.
    Returns the number of files removed."""
    target = paths.transcript(conversation_id)
    removed = 0
    if target.exists():
        target.unlink()
        removed = 1
    current = _read_version(version_file(paths, conversation_id))
    if current is None or current < parse_version(entry_id):
        paths.src.mkdir(parents=True, exist_ok=True)
        _atomic_write(version_file(paths, conversation_id), entry_id)
    _fsync_dir(paths.src)
    return removed


def tombstone_user(data_dir: Path, uhash: str, entry_id: str) -> None:
    path = user_tombstone(data_dir, uhash)
    path.parent.mkdir(parents=True, exist_ok=True)
    current = _read_version(path)
    if current is None or current < parse_version(entry_id):
        _atomic_write(path, entry_id)
