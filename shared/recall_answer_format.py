"""The shape of what `recall_my_conversations` returns, shared by the recall service (which
writes it) and ingest (which must recognise it, so a recall answer echoed back by the
gateway never becomes a future "memory")."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

NO_MEMORY = "No earlier conversations are stored for this user yet."
NOTHING = "Nothing relevant found in earlier conversations."
UNAVAILABLE = "Conversation memory is unavailable right now; continue without it."
EMPTY_QUERY = "The query is empty: describe what to look for, e.g. an identifier and a key noun."
BUSY = "Conversation memory is busy right now; try again in a moment, or continue without it."
# Stored conversations and no memory yet while the user's index run is due or under way (a new
# user's first seconds; a lost memory being rebuilt): "unavailable; continue without it" told the
# agent to give up on memory that would answer a minute later.
INDEXING = "Conversation memory is still indexing this user's conversations; ask again in a minute."
FIXED_ANSWERS = frozenset({NO_MEMORY, NOTHING, UNAVAILABLE, EMPTY_QUERY, BUSY, INDEXING})
# Under an answer of nothing while the user's index run is due or under way: a 25 KB paste took
# 35 s to index, and meanwhile its questions got a confident "Nothing relevant found".
STILL_INDEXING = ("(Conversations stored moments ago are still being indexed and were not searched; "
                  "ask again in a minute.)")

# A passage's header: its date, then who said it when the engine knows (funes' recall does not).
_HEADER_LINE = re.compile(r"^\[\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC(?:[+-]\d{2}:\d{2})?\](?: (?:user|assistant|system|tool))?$")
SEPARATOR = "---"
NEIGHBOUR_PREFIX = "  ~ "
# The passage's conversation and turn, so an agent can cite it (AgentMemory provenance).
CITE_LINE = "  cite: session_id={} turn_uuid={}"
_SPAN = r"\d{4}-\d{2}-\d{2}(?: to \d{4}-\d{2}-\d{2})?"
_NOTE_LINE = re.compile(rf"^\(None of these passages is from {_SPAN}, the time the query names; they are the closest matches from other dates\.\)$")
_UPCOMING_LINE = re.compile(rf"^\(The time the query names, {_SPAN}, has not come yet; these passages are the closest "
                            r"matches to its words, from other dates\.\)$")
# "they match the rest of it" is round 29's wording, still in echoes of answers given then.
_UNNAMED_LINE = re.compile(r"^\(None of these passages mentions [^\n]+, which the query names; they (?:match the rest "
                           r"of it|are the closest matches to the rest of it)\.\)$")
_MORE_THEN_LINE = re.compile(rf"^\(These are (?:\d+ of the \d+ conversations from {_SPAN}, the most recent first|the \d+ "
                             r"most recent of the \d+ conversations); a question with a topic searches them all"
                             r"(?:, and a shorter time \(a week, a day\) shows others)?\.\)$")
_NOTHING_THEN = re.compile(rf"^No earlier conversation is from {_SPAN}, the time the query names\.$")


def date_header(dt: datetime) -> str:
    """`[YYYY-MM-DD HH:MM UTC]` of a UTC time; in another offset, as `[… 01:00 UTC+09:00]`."""
    minutes = round((dt.utcoffset() or timedelta(0)).total_seconds() / 60)
    offset = f"{'+' if minutes > 0 else '-'}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}" if minutes else ""
    return f"[{_day(dt)} {dt:%H:%M} UTC{offset}]"


def _day(dt: datetime) -> str:
    # Not strftime's %Y: glibc writes year 1 as "1", and ingest accepts years from 1.
    return f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}"


def outside_window_note(first: datetime, last: datetime) -> str:
    """Above the passages when the query named a time and none of them is from it, so the agent
    does not present an older passage as what was said then."""
    return (f"(None of these passages is from {_span(first, last)}, the time the query names; they are the "
            "closest matches from other dates.)")


def upcoming_note(first: datetime, last: datetime) -> str:
    """Above the passages when the only time the query names is still to come ("what did we plan
    for this Friday" on a Wednesday): its words were searched as a topic, and no passage can be
    from it, so the agent does not present one as what was said then."""
    return (f"(The time the query names, {_span(first, last)}, has not come yet; these passages are the closest "
            "matches to its words, from other dates.)")


def unnamed_note(identifiers: list[str]) -> str:
    """Above passages none of which holds an identifier the query names ("N-11 upgrade" over
    chats that never said N-11), so the agent does not take another upgrade for N-11's."""
    return (f"(None of these passages mentions {' or '.join(identifiers)}, which the query names; they are the "
            "closest matches to the rest of it.)")


def more_then_note(shown: int, total: int, first: datetime, last: datetime) -> str:
    """Above the conversations of a question naming only a time when the answer shows fewer than
    the time holds, so the agent does not take them for all that was discussed then."""
    shorter = ", and a shorter time (a week, a day) shows others" if _day(first) != _day(last) else ""
    return (f"(These are {shown} of the {total} conversations from {_span(first, last)}, the most recent first; "
            f"a question with a topic searches them all{shorter}.)")


def more_latest_note(shown: int, total: int) -> str:
    """Above the latest conversations ("what did we discuss last time") when the memory holds more."""
    return f"(These are the {shown} most recent of the {total} conversations; a question with a topic searches them all.)"


def _span(first: datetime, last: datetime) -> str:
    """A window's days: one day alone, or from its first to its last."""
    return _day(first) if _day(first) == _day(last) else f"{_day(first)} to {_day(last)}"


def nothing_then(first: datetime, last: datetime) -> str:
    """The answer to a question that names only a time ("what did we discuss last week") when
    no stored conversation is from it: what was said at other times is not what it asks."""
    return f"No earlier conversation is from {_span(first, last)}, the time the query names."


def without_notes(answer: str) -> str:
    """The passages of an answer: its note lines (which repeat what the query named) taken off."""
    lines = answer.split("\n")
    while lines and any(note.match(lines[0]) for note in (_NOTE_LINE, _MORE_THEN_LINE, _UNNAMED_LINE, _UPCOMING_LINE)):
        lines = lines[1:]
    return "\n".join(lines)


def looks_like_recall_answer(text: str) -> bool:
    """True for a fixed answer, or text that is a sequence of recall passages (it starts with a
    date header, after its note lines if any, every later header follows a `---`,
    and it ends with one; a passage may hold `---` lines of its own). Prose that merely quotes
    one is kept."""
    body = text.strip().removesuffix(f"\n{STILL_INDEXING}")
    if body in FIXED_ANSWERS or _NOTHING_THEN.match(body):
        return True
    lines = without_notes(body).splitlines()
    if not lines or not _HEADER_LINE.match(lines[0]) or lines[-1] != SEPARATOR:
        return False
    return all(lines[i - 1] == SEPARATOR for i in range(1, len(lines)) if _HEADER_LINE.match(lines[i]))
