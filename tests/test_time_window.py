"""Time words in recall queries: which window they name, and that it only reorders."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from services.recall.time_window import find_time_window
from services.recall.tool_output import hits_from_funes_text, render_for_agent
from shared.recall_answer_format import NOTHING

NOW = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)  # a Sunday


@pytest.mark.parametrize("query, rest, start, end", [
    ("what did we decide last week about N-11", "what did we decide about N-11", "2026-11-16", "2026-11-23"),
    ("N-11 this week", "N-11", "2026-11-23", "2026-11-30"),
    ("N-11 in October", "N-11", "2026-10-01", "2026-11-01"),
    ("N-11 in December", "N-11", "2025-12-01", "2026-01-01"),  # a month not yet come means last year's
    ("N-11 October 2025", "N-11", "2025-10-01", "2025-11-01"),
    ("what happened on 2026-10-08", "what happened on 2026-10-08", "2026-10-08", "2026-10-09"),
    ("past 10 days MT-4471", "MT-4471", "2026-11-19", "2026-11-30"),
    ("yesterday", "yesterday", "2026-11-28", "2026-11-29"),
    ("last month budget", "budget", "2026-10-01", "2026-11-01"),
])
def test_time_words_name_a_window(query, rest, start, end):
    searched, window = find_time_window(query, NOW)
    assert searched == rest
    assert (window.start.date().isoformat(), window.end.date().isoformat()) == (start, end)


@pytest.mark.parametrize("query", ["may we proceed with K-2", "MT-4471 status", "the October report", "2026-02-30"])
def test_no_window_without_a_real_date(query):
    assert find_time_window(query, NOW) == (query, None)


def test_a_window_reorders_and_never_drops():
    engine_output = "".join(
        f"[{ts}] copilot c{i} text  score=0.1\n  → get c{i} t --memory m\npassage {i}\n---\n"
        for i, ts in enumerate(["2026-10-02T10:00:00Z", "2026-11-20T10:00:00Z", "2026-09-01T10:00:00Z"]))
    _, window = find_time_window("last week", NOW)
    out = render_for_agent(hits_from_funes_text(engine_output), 4000, k=3, window=window)
    assert [line for line in out.splitlines() if line.startswith("passage")] == ["passage 1", "passage 0", "passage 2"]
    assert render_for_agent(hits_from_funes_text(engine_output), 4000, k=2).count("passage") == 2
    assert render_for_agent(hits_from_funes_text("no results"), 4000, k=3, window=window) == NOTHING

