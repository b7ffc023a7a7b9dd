"""How blocks become chunks: funes' 1,200-character windows with a 150-character overlap, each
window after the first starting at a line or a word (funes starts it exactly 150 characters back)."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from shared.engine.transcript import TranscriptTurn, parse_ts

CHUNK_CHARS = 1200
OVERLAP_CHARS = 150
_SPACE = re.compile(r"\s")


@dataclass(frozen=True)
class Chunk:
    chunk_key: str
    session_id: str
    turn_uuid: str
    seq: int
    ts: str
    ts_epoch: float | None
    role: str
    harness: str
    workdir: str
    block_type: str
    block_idx: int
    split_idx: int
    text: str

    @property
    def text_hash(self) -> str:
        return hashlib.sha1(self.text.encode("utf-8")).hexdigest()[:16]


def chunk_key(session_id: str, turn_uuid: str, block_idx: int, split_idx: int) -> str:
    """funes' chunk id: depends on coordinates only, never on the text."""
    raw = f"{session_id}:{turn_uuid}:{block_idx}:{split_idx}"
    return hashlib.sha1(raw.encode("utf-8")).hexdigest()[:16]


def split_text(text: str, size: int = CHUNK_CHARS, overlap: int = OVERLAP_CHARS) -> list[str]:
    """Cut at the last newline past the window's middle, else the last space, else hard."""
    text = text.strip()
    if len(text) <= size:
        return [text] if text else []
    pieces: list[str] = []
    start = 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            window = text[start:end]
            half = size // 2
            cut = window.rfind("\n")
            if cut <= half:
                cut = window.rfind(" ")
            if cut > half:
                end = start + cut
        piece = text[start:end].strip()
        if piece:
            pieces.append(piece)
        if end >= len(text):
            break
        start = _word_start(text, max(end - overlap, start + 1), end)
    return pieces


def _word_start(text: str, start: int, end: int) -> int:
    """`start`, moved to the next line when the overlap holds a line break, else to the next word
    when it falls inside one: passages began "ffset 1721" (a log line's "offset") and "in 36 ms"
    (the end of a log line). The overlap only shrinks, so `get` still stitches the splits (it
    removes an overlap of up to 150 characters); one without a space keeps the hard start."""
    line = text.find("\n", start - 1, end)
    if line != -1:
        return line + 1
    if text[start - 1].isspace() or text[start].isspace():
        return start
    space = _SPACE.search(text, start, end)
    return space.end() if space else start


def chunk_turn(turn: TranscriptTurn) -> list[Chunk]:
    epoch = parse_ts(turn.ts)
    chunks: list[Chunk] = []
    for block_idx, block in enumerate(turn.blocks):
        for split_idx, piece in enumerate(split_text(block.text)):
            chunks.append(
                Chunk(
                    chunk_key=chunk_key(turn.session_id, turn.turn_uuid, block_idx, split_idx),
                    session_id=turn.session_id,
                    turn_uuid=turn.turn_uuid,
                    seq=turn.seq,
                    ts=turn.ts,
                    ts_epoch=epoch,
                    role=turn.role,
                    harness=turn.harness,
                    workdir=turn.workdir,
                    block_type=block.block_type,
                    block_idx=block_idx,
                    split_idx=split_idx,
                    text=piece,
                )
            )
    return chunks
