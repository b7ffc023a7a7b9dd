"""Write a conversation snapshot as its `.funes.jsonl` file, atomically and never backwards.

The version of a snapshot is its stream entry id (ingest order). Under the conversation's
Redis lock, a snapshot older than the one on disk is dropped; otherwise it is written to a
temp file, fsynced and renamed over the old one, then the version sidecar is updated. An
equal version is rewritten, so a redelivery after a crash between the two steps heals.
"""

from __future__ import annotations

import os
from datetime import datetime
from enum import Enum
from pathlib import Path

from shared.engine.transcript import Block, TranscriptTurn, dump_transcript
from shared.stream_schema import TurnsEvent
from shared.tenant_paths import CONVERSATION_ID, TenantPaths

HARNESS = "copilot"


class WriteResult(Enum):
    WRITTEN = "written"  # new, or the file on disk plus turns after it
    REWRITTEN = "rewritten"  # lines already on disk changed (an edited turn, a conversation cut back)
    STALE = "stale"  # a newer snapshot of the conversation is already on disk


def parse_version(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def rfc3339(ts: datetime) -> str:
    """`YYYY-MM-DDTHH:MM:SSZ` of a UTC time. Not strftime: glibc's %Y does not pad a year below
    1000 ("999-01-01T…"), which no RFC 3339 parser reads, so such a turn lost its date."""
    return f"{ts.year:04d}-{ts.month:02d}-{ts.day:02d}T{ts.hour:02d}:{ts.minute:02d}:{ts.second:02d}Z"


def transcript_body(event: TurnsEvent) -> str:
    turns = [
        TranscriptTurn(session_id=event.conversation_id, turn_uuid=t.id, seq=seq,
                       ts=rfc3339(t.ts), role=t.role, harness=HARNESS,
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


def _remove_leftover_temps(path: Path) -> int:
    """Temp files of `path` an earlier writer left when it died between its write and its rename
    (the name carries that writer's pid, so nobody overwrites them): a whole copy of the text,
    which a forget must remove. Call with the conversation lock held, so no live writer's temp
    file is among them. It lists the directory, so a forget does it, not every write."""
    removed = 0
    for leftover in path.parent.glob(f".{path.name}.*.tmp"):
        leftover.unlink(missing_ok=True)
        removed += 1
    return removed


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_rebuild(paths: TenantPaths) -> None:
    """Mark the tenant's funes memory for a rebuild (TenantPaths.funes_rebuild), durably."""
    paths.funes_rebuild.touch()
    _fsync_dir(paths.root)


def version_file(paths: TenantPaths, conversation_id: str) -> Path:
    return paths.src / f".{conversation_id}.version"


def rewrite_file(paths: TenantPaths, conversation_id: str) -> Path:
    """The stream id of a snapshot being written over stored lines (funes mode), while it is."""
    return paths.src / f".{conversation_id}.rewriting"


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


class SnapshotMoved(Exception):
    """The tenant's tree was set aside by a user deletion while this snapshot was written (it
    is newer than that deletion): not acked, so its redelivery writes it again."""


def write_snapshot(paths: TenantPaths, event: TurnsEvent, entry_id: str, tell_rewrites: bool = False) -> WriteResult:
    """Call with the conversation lock held. Durable (fsynced) when it returns WRITTEN or
    REWRITTEN; REWRITTEN only with `tell_rewrites` (funes mode needs to know; telling reads the
    file on disk first, so an engine that does not need it does not pay for it)."""
    target = paths.transcript(event.conversation_id)
    mine = parse_version(entry_id)
    vfile = version_file(paths, event.conversation_id)
    current = _read_version(vfile)
    if (current is not None and current > mine) or _older_than_user_deletion(paths, mine):
        return WriteResult.STALE
    paths.src.mkdir(parents=True, exist_ok=True)
    body = transcript_body(event)
    try:
        appended = not tell_rewrites or body.startswith(target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        appended = True
    # funes mode, stored lines changed: the tenant's rebuild is marked before the text changes and
    # again after it (an index run may take the first mark while the old text is still there),
    # and the rewrite is recorded until both are made: a worker killed between the write and the
    # second mark left a redelivery that found the file as sent (an append) and marked nothing,
    # and funes kept the first text.
    rewriting = rewrite_file(paths, event.conversation_id)
    if tell_rewrites and appended and _read_version(rewriting) == mine:
        appended = False  # this very snapshot was being written as a rewrite when its worker died
    if not appended:
        _atomic_write(rewriting, entry_id)
        mark_rebuild(paths)
    _atomic_write(target, body)
    if not appended:
        mark_rebuild(paths)
    _atomic_write(vfile, entry_id)
    if not appended:
        rewriting.unlink(missing_ok=True)
    _fsync_dir(paths.src)
    # A user deletion does not take conversation locks; if one landed while we wrote, undo
    # (in the tree the deletion set aside, or in a new one this write made: then leave none).
    if _older_than_user_deletion(paths, mine):
        target.unlink(missing_ok=True)
        if _read_version(vfile) == mine:
            vfile.unlink(missing_ok=True)
        for empty in (paths.src, paths.root):
            try:
                empty.rmdir()
            except OSError:
                break  # not empty: the user's new history, or a deletion still at work
        return WriteResult.STALE
    # A user deletion older than this snapshot sets the tree aside and moves back only complete
    # snapshots: one renamed away between our two writes may be half there and half gone.
    if not target.exists() or _read_version(vfile) != mine:
        raise SnapshotMoved(f"{event.conversation_id} was moved by a user deletion while written")
    return WriteResult.WRITTEN if appended else WriteResult.REWRITTEN


def tombstone_conversation(paths: TenantPaths, conversation_id: str, version: str) -> int:
    """Call with the conversation lock held: remove the transcript and record the deletion's
    version, so a snapshot accepted before it is dropped and one accepted after it starts anew.
    A snapshot on disk newer than the deletion was accepted after it (written by another worker
    while this forget waited for the user's index lock) and stays. Returns the files removed."""
    target = paths.transcript(conversation_id)
    deletion = parse_version(version)
    current = _read_version(version_file(paths, conversation_id))
    if current is not None and current > deletion:
        return 0
    removed = _remove_leftover_temps(target)
    rewrite_file(paths, conversation_id).unlink(missing_ok=True)  # the rebuild it marked forgets the rest
    if target.exists():
        target.unlink()
        removed += 1
    if current is None or current < deletion:
        paths.src.mkdir(parents=True, exist_ok=True)
        _atomic_write(version_file(paths, conversation_id), version)
    _fsync_dir(paths.src)
    return removed


def snapshot_version(paths: TenantPaths, conversation_id: str) -> str | None:
    """The stream id of the snapshot on disk (None: no version recorded)."""
    try:
        raw = version_file(paths, conversation_id).read_text().strip()
        parse_version(raw)
        return raw
    except (FileNotFoundError, ValueError):
        return None


def snapshots_newer_than(paths: TenantPaths, version: tuple[int, int]) -> list[str]:
    """Conversations whose snapshot on disk is complete and newer than `version`."""
    if not paths.src.is_dir():
        return []
    out = []
    for vfile in paths.src.glob(".*.version"):
        cid = vfile.name[1:-len(".version")]
        found = _read_version(vfile)
        if CONVERSATION_ID.fullmatch(cid) and found is not None and found > version and paths.transcript(cid).exists():
            out.append(cid)
    return sorted(out)


def move_snapshot_back(aside: TenantPaths, paths: TenantPaths, conversation_id: str) -> bool:
    """Call with the conversation lock held: move a snapshot from a tree set aside by a user
    deletion back into the tenant's new tree, unless one as new is there already. The
    transcript goes first: a crash between the two renames leaves it without a version, never
    a version without its text."""
    mine = _read_version(version_file(aside, conversation_id))
    current = _read_version(version_file(paths, conversation_id))
    if mine is None or (current is not None and current >= mine):
        return False
    paths.src.mkdir(parents=True, exist_ok=True)
    os.replace(aside.transcript(conversation_id), paths.transcript(conversation_id))
    os.replace(version_file(aside, conversation_id), version_file(paths, conversation_id))
    _fsync_dir(paths.src)
    return True


def user_deletion_version(data_dir: Path, uhash: str) -> tuple[int, int] | None:
    return _read_version(user_tombstone(data_dir, uhash))


def tombstone_user(data_dir: Path, uhash: str, entry_id: str) -> None:
    path = user_tombstone(data_dir, uhash)
    path.parent.mkdir(parents=True, exist_ok=True)
    current = _read_version(path)
    if current is None or current < parse_version(entry_id):
        _atomic_write(path, entry_id)
