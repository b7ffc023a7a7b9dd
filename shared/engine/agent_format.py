"""funes' byte-stable agent output format, produced here and parsed back by the recall service.

recall, per hit:
    [<ts>] <harness> <workdir>/<session_id[:8]> <block_type>  score=<%.3f>
      → get <session_id> <turn_uuid> --memory <label>
    <full chunk text>
      ~ [<role> <block_type> seq<N>] <first 160 code points of a neighbouring chunk>
    ---
An empty result is `no results` with no trailing newline. With `explain` (never asked for by
the recall service) each header is followed by `  ? <how the hit was scored>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shared.engine.hybrid_search import NEIGHBOUR_PREVIEW_CHARS, Hit
from shared.engine.store import Row

NO_RESULTS = "no results"
EXPLAIN_MARK = "? "
HEADER = re.compile(r"^\[(?P<ts>[^\]]*)\] (?P<harness>\S*) (?P<where>\S+) (?P<block_type>\S+)  score=(?P<score>[-0-9.]+)$")
HINT_START = "  → get "
HINT = re.compile(r"^  → get (?P<session_id>\S+) (?P<turn_uuid>\S+)( .*)?$")
NEIGHBOUR = re.compile(r"^  ~ \[(?P<role>\S+) (?P<block_type>\S+) seq(?P<seq>-?\d+)\] (?P<text>.*)$")


def _where(row: Row) -> str:
    return f"{row.workdir}/{row.session_id[:8]}" if row.workdir else row.session_id[:8]


def render_recall(hits: list[Hit], memory_label: str) -> str:
    if not hits:
        return NO_RESULTS
    out: list[str] = []
    for hit in hits:
        r = hit.row
        out.append(f"[{r.ts}] {r.harness} {_where(r)} {r.block_type}  score={hit.score:.3f}")
        out.append(f"  → get {r.session_id} {r.turn_uuid} --memory {memory_label}")
        if hit.explain is not None:
            out.append(f"  {EXPLAIN_MARK}{hit.explain.line()}")
        out.append(r.text)
        for n in hit.neighbours:
            out.append(f"  ~ [{n.role} {n.block_type} seq{n.seq}] {n.text[:NEIGHBOUR_PREVIEW_CHARS]}")
        out.append("---")
    return "\n".join(out) + "\n"


def _stitch(pieces: list[str], max_overlap: int = 150) -> str:
    """Join the splits of a block, removing the longest suffix/prefix overlap."""
    text = pieces[0]
    for nxt in pieces[1:]:
        best = 0
        for n in range(min(max_overlap, len(text), len(nxt)), 0, -1):
            if text.endswith(nxt[:n]):
                best = n
                break
        text = text + ("" if best else " ") + nxt[best:]
    return text


def render_get(rows: list[Row] | None, session_id: str, turn_uuid: str) -> str:
    if not rows:
        return f"turn {turn_uuid} not found in session {session_id}\n"
    out: list[str] = []
    turns: dict[tuple[int, str], list[Row]] = {}
    for r in rows:
        turns.setdefault((r.seq, r.turn_uuid), []).append(r)
    for (seq, uuid), parts in sorted(turns.items()):
        blocks: dict[int, list[str]] = {}
        for p in parts:
            blocks.setdefault(p.block_idx, []).append(p.text)
        out.append(f"[{parts[0].ts}] {parts[0].role} seq{seq} turn={uuid}")
        out.append("\n\n".join(_stitch(b) for _, b in sorted(blocks.items())))
        out.append("---")
    return "\n".join(out) + "\n"


@dataclass
class ParsedHit:
    ts: str
    harness: str
    block_type: str
    session_id: str = ""
    turn_uuid: str = ""
    text_lines: list[str] = field(default_factory=list)
    neighbours: list[tuple[str, int, str]] = field(default_factory=list)  # (role, seq, preview)

    @property
    def text(self) -> str:
        return "\n".join(self.text_lines).strip()


def parse_recall(output: str) -> list[ParsedHit]:
    """Split on header lines, never on `---` (chunk text may contain it). Lines are split on
    "\n" only, so text keeps any "\r"; the hint is the line right after a header (an explain
    line may follow it), and only a header line followed by a hint starts a hit: chunk text may
    quote a header line too; lines after a neighbour line continue that neighbour's preview
    (previews are cut at 160 code points, newlines included)."""
    if output.strip() == NO_RESULTS:
        return []
    hits: list[ParsedHit] = []
    lines_of: list[list[str]] = []
    after_hint = False
    lines = output.split("\n")
    for i, line in enumerate(lines):
        m = HEADER.match(line)
        if m and i + 1 < len(lines) and lines[i + 1].startswith(HINT_START):
            hits.append(ParsedHit(m["ts"], m["harness"], m["block_type"]))
            lines_of.append([])
            continue
        if not hits:
            continue
        hint = HINT.match(line) if not lines_of[-1] and not hits[-1].session_id else None
        if hint:
            hits[-1].session_id, hits[-1].turn_uuid = hint["session_id"], hint["turn_uuid"]
            after_hint = True
            continue
        if after_hint and line.startswith("  " + EXPLAIN_MARK):
            after_hint = False
            continue
        after_hint = False
        lines_of[-1].append(line)
    for hit, lines in zip(hits, lines_of):
        _fill(hit, lines)
    return hits


def _fill(hit: ParsedHit, lines: list[str]) -> None:
    """A hit's lines after its hint: the text, then its neighbours, then the closing `---`."""
    while lines and lines[-1] == "":
        lines.pop()
    if lines and lines[-1] == "---":
        lines.pop()
    for line in lines:
        n = NEIGHBOUR.match(line)
        if n:
            hit.neighbours.append((n["role"], int(n["seq"]), n["text"]))
        elif hit.neighbours:
            role, seq, preview = hit.neighbours[-1]
            hit.neighbours[-1] = (role, seq, f"{preview}\n{line}")
        else:
            hit.text_lines.append(line)
