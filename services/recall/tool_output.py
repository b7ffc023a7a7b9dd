"""What the agent sees: dated verbatim passages with a citation handle, no engine hints or paths.

Both backends hand this module the same typed hits (`AgentHit`): the embedded engine passes
its hits through as data (`hits_from_engine`); funes mode gets funes' agent-format text from
its child and parses it into the same model (`hits_from_funes_text`). Each hit renders as

    [2026-10-08 10:01 UTC] assistant
      cite: session_id=<conversation id> turn_uuid=<turn id>
    <the passage, verbatim>
      ~ user: <neighbouring turn, preview>
    ---

cut at whole passages to `max_chars`, dates in the user's time zone. The header names who said
the passage (`user`, `assistant` …) when the engine gives it: funes' recall output does not, so
funes mode leaves it out. Note lines come first when the passages are not what the query names
(`render_for_agent`): none from its time, only some of a time's conversations, none holding an
identifier it names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone, tzinfo

from pydantic import BaseModel, ConfigDict

from services.recall.time_window import TimeWindow
from shared.engine.agent_format import parse_recall
from shared.engine.hybrid_search import NEIGHBOUR_PREVIEW_CHARS, Hit
from shared.engine.identifiers import IdentifierPattern
from shared.engine.transcript import parse_ts
from shared.recall_answer_format import (CITE_LINE, NEIGHBOUR_PREFIX, NOTHING, SEPARATOR, date_header, more_latest_note,
                                         more_then_note, outside_window_note, unnamed_note,
                                         upcoming_note)


class Neighbour(BaseModel):
    """A neighbouring turn's opening, on one line: a preview that ran over several lines read as
    the passage's own text."""

    model_config = ConfigDict(frozen=True)
    role: str
    preview: str
    cut: bool = False  # as long as previews go (both engines cut there): the turn says more


def previews(neighbours: Iterable[tuple[object, str, str]]) -> tuple[Neighbour, ...]:
    """(turn, role, text) of the neighbouring chunks, in order, as one preview per turn: its first
    chunk's. Each chunk of a long turn was a preview, and a pasted log's ~15 of them filled 3 KB of
    a 4 KB answer."""
    seen: set[object] = set()
    out: list[Neighbour] = []
    for turn, role, text in neighbours:
        if turn not in seen:
            seen.add(turn)
            raw = text[:NEIGHBOUR_PREVIEW_CHARS]
            out.append(Neighbour(role=role, preview=" ".join(raw.split()), cut=len(raw) >= NEIGHBOUR_PREVIEW_CHARS))
    return tuple(out)


class AgentHit(BaseModel):
    """One passage as the agent gets it: when, where to cite it, the verbatim text, the turns
    around it."""

    model_config = ConfigDict(frozen=True)
    ts: str
    role: str = ""  # who said it; "" when the engine does not say (funes' recall output)
    session_id: str = ""
    turn_uuid: str = ""
    seq: int | None = None  # the turn's place in its conversation (the embedded engine says; funes' output does not)
    text: str
    neighbours: tuple[Neighbour, ...] = ()
    # Only a place filler (hybrid_search.Hit.filler): shown when it is from the query's time.
    filler: bool = False


class DatedAnswer(BaseModel):
    """The passages of a time's conversations, and how many conversations that time holds."""

    model_config = ConfigDict(frozen=True)
    hits: list[AgentHit]
    conversations: int


def hits_from_engine(hits: list[Hit]) -> list[AgentHit]:
    return [AgentHit(ts=h.row.ts, role=h.row.role, session_id=h.row.session_id, turn_uuid=h.row.turn_uuid, seq=h.row.seq,
                     text=h.row.text.strip(), filler=h.filler,
                     neighbours=previews(((n.session_id, n.turn_uuid), n.role, n.text) for n in h.neighbours))
            for h in hits]


def hits_from_funes_text(output: str) -> list[AgentHit]:
    """funes' agent format, parsed by the engine's own parser (`agent_format.parse_recall`)."""
    return [AgentHit(ts=h.ts, session_id=h.session_id, turn_uuid=h.turn_uuid, text=h.text,
                     neighbours=previews((seq, role, preview) for role, seq, preview in h.neighbours))
            for h in parse_recall(output)]


RECALL_TOOL = "recall_my_conversations"  # the one tool of conversation recall
TOOL_DESCRIPTION = (
    "Search the current user's own earlier conversations with this assistant. Use it when the user "
    "refers to something discussed before (\"last time\", \"earlier\", \"what did we decide\", \"the numbers "
    "we used\", \"remind me\"). Use short queries built around identifiers and key nouns (\"K-2 machine "
    "ticket\", \"N-11 upgrade decision\"); if the first search misses, search again with other words. "
    "Time words (\"last week\", \"in October\", \"on 9 November\", \"2026-10-08\", \"a week ago\", "
    "\"last Friday\", \"over the weekend\", \"in early October\", or in Russian \"на прошлой неделе\", \"9 ноября\", \"в пятницу\") put passages from then "
    "first; \"what did we discuss last time\" gets the latest conversations. "
    "Returns dated passages from past chats, verbatim. Quote them and give their dates; do not invent "
    "details that are not in them, and say so when nothing relevant is found."
)


def _date(ts: str, zone: tzinfo) -> str:
    dt = _when(ts)
    return date_header(dt.astimezone(zone)) if dt else f"[{ts or 'undated'}]"


def render_hit(hit: AgentHit, zone: tzinfo = timezone.utc) -> str:
    header = f"{_date(hit.ts, zone)} {hit.role}" if hit.role else _date(hit.ts, zone)
    lines = [header] + ([CITE_LINE.format(hit.session_id, hit.turn_uuid)] if hit.session_id else []) + [hit.text]
    # A cut preview says so, or an agent quotes half a sentence as what was said.
    lines += [f"{NEIGHBOUR_PREFIX}{n.role}: {n.preview}{'…' if n.cut else ''}" for n in hit.neighbours]
    return "\n".join(lines) + f"\n{SEPARATOR}\n"


def _when(ts: str) -> datetime | None:
    epoch = parse_ts(ts)
    return None if epoch is None else datetime.fromtimestamp(epoch, timezone.utc)


def _holds(hit: AgentHit, identifier: IdentifierPattern) -> bool:
    return identifier.search(hit.text) or any(identifier.search(n.preview) for n in hit.neighbours)


def _in_window(hit: AgentHit, window: TimeWindow) -> bool:
    return (when := _when(hit.ts)) is not None and window.contains(when)


def _with_left_out_neighbours(shown: list[AgentHit], left_out: list[AgentHit]) -> list[AgentHit]:
    """`shown`, each with the turns next to it that were hits the answer leaves out as previews:
    the engine previews no hit (it shows them whole), so "wedding last week" over a pool of 9
    showed the wedding's opening turn without its photographer turn, cut as a place filler."""
    shown_turns = {(h.session_id, h.turn_uuid) for h in shown}
    out = []
    for hit in shown:
        beside = [h for h in left_out if hit.seq is not None and h.seq is not None and h.session_id == hit.session_id
                  and abs(h.seq - hit.seq) == 1 and (h.session_id, h.turn_uuid) not in shown_turns]
        shown_turns |= {(h.session_id, h.turn_uuid) for h in beside}
        added = previews(((h.session_id, h.turn_uuid), h.role, h.text) for h in sorted(beside, key=lambda h: h.seq))
        out.append(hit.model_copy(update={"neighbours": hit.neighbours + added}) if added else hit)
    return out


def render_for_agent(hits: list[AgentHit], max_chars: int, k: int, window: TimeWindow | None = None,
                     conversations_then: int = 0, identifiers: Sequence[str] = (), zone: tzinfo = timezone.utc,
                     upcoming: TimeWindow | None = None) -> str:
    """At most k passages, whole ones only, within max_chars; passages holding the query's words,
    those from its time window (if it named one) first, then that time's passages let in for their
    date alone, in engine order within each group. Note lines come first
    when the passages are not what the query names: none from its time, fewer than the
    `conversations_then` of a question naming only a time, none holding one of its
    `identifiers` (a passage's previews count: they are read too), or a query whose only time is
    `upcoming` (still to come: none can be from it). Dates are shown in `zone`
    (the one the query's time words were read in)."""
    hits = list(hits)
    if window is not None:
        # Passages that hold no query word were let in for their date: from another time, none;
        # and none beside matches that are all from other times ("sourdough last week" showed
        # three of last week's unrelated passages and left out the sourdough conversation of
        # the 10th, with no note), which the note then says.
        matched_then = any(not h.filler and _in_window(h, window) for h in hits)
        fillers_kept = matched_then or all(h.filler for h in hits)
        hits = [h for h in hits if not h.filler or (fillers_kept and _in_window(h, window))]
        hits.sort(key=lambda h: (h.filler, not _in_window(h, window)))  # the query's words before a date alone
    hits = _with_left_out_neighbours(hits[:k], hits[k:])
    if not hits:
        return NOTHING

    named = [IdentifierPattern(i) for i in identifiers]

    def note_for(shown: list[AgentHit]) -> str:
        notes = []
        if unnamed := [p.ident for p in named if not any(_holds(h, p) for h in shown)]:
            notes.append(unnamed_note(unnamed))
        if upcoming is not None and window is None:
            notes.append(upcoming_note(upcoming.start, upcoming.end - timedelta(microseconds=1)))
        if window is not None:
            last = window.end - timedelta(microseconds=1)
            if not any(_in_window(h, window) for h in shown):
                notes.append(outside_window_note(window.start, last))
            elif conversations_then > (seen := len({h.session_id for h in shown})):
                notes.append(more_latest_note(seen, conversations_then) if window.latest else
                             more_then_note(seen, conversations_then, window.start, last))
        note = "".join(f"{n}\n" for n in notes)
        return note if len(note) <= max_chars // 2 else ""  # a tiny budget goes to the passage

    note, out, shown = note_for(hits), "", []
    for hit in hits:
        block = render_hit(hit, zone)
        if len(note) + len(out) + len(block) > max_chars:
            if not out:  # never return nothing because the first passage is long
                # Still closed by its separator: ingest recognises a recall answer by it.
                end = f" …\n{SEPARATOR}"
                out = block[: max(max_chars - len(note) - len(end), 0)].rstrip() + end
                shown.append(hit)
            break
        out += block
        shown.append(hit)
    if len(shown) < len(hits) and len(fitted := note_for(shown)) <= len(note):  # laid out for the first note's length
        note = fitted
    return (note + out).rstrip()
