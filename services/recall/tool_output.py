"""What the agent sees: dated verbatim passages, no engine hints, paths or internal ids.

The engine (embedded or funes) answers in funes' agent format; this module parses it by
header lines and re-renders each hit as

    [2026-10-08 10:01 UTC]
    <the passage, verbatim>
      ~ user: <neighbouring turn, preview>
    ---

cut at whole passages to `max_chars`.
"""

from __future__ import annotations

from datetime import datetime, timezone

from shared.engine.agent_format import ParsedHit, parse_recall
from shared.recall_answer_format import DATE_HEADER, NEIGHBOUR_PREFIX, NOTHING, SEPARATOR
TOOL_DESCRIPTION = (
    "Search the current user's own earlier conversations with this assistant. Use it when the user "
    "refers to something discussed before (\"last time\", \"earlier\", \"what did we decide\", \"the numbers "
    "we used\", \"remind me\"). Use short queries built around identifiers and key nouns (\"K-2 machine "
    "ticket\", \"N-11 upgrade decision\"); if the first search misses, search again with other words. "
    "Returns dated passages from past chats, verbatim. Quote them and give their dates; do not invent "
    "details that are not in them, and say so when nothing relevant is found."
)


def _date(ts: str) -> str:
    try:
        dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return f"[{ts or 'undated'}]"
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return DATE_HEADER.format(dt.astimezone(timezone.utc))


def render_hit(hit: ParsedHit) -> str:
    lines = [_date(hit.ts), hit.text]
    lines += [f"{NEIGHBOUR_PREFIX}{role}: {preview}" for role, _, preview in hit.neighbours]
    return "\n".join(lines) + f"\n{SEPARATOR}\n"


def render_for_agent(engine_output: str, max_chars: int) -> str:
    hits = parse_recall(engine_output)
    if not hits:
        return NOTHING
    out = ""
    for hit in hits:
        block = render_hit(hit)
        if len(out) + len(block) > max_chars:
            if not out:  # never return nothing because the first passage is long
                out = block[: max_chars - 2].rstrip() + " …"
            break
        out += block
    return out.rstrip()
