"""Both backends give the agent the same bytes: the embedded engine's typed hits and funes'
agent-format text parsed back are one hit model."""

from __future__ import annotations

from services.recall.tool_output import AgentHit, hits_from_engine, hits_from_funes_text, render_for_agent
from shared.engine.api import Engine
from shared.engine.hybrid_search import RecallParams
from shared.engine.index_run import index_tree, memory_dir
from tests.conftest import write_conversation

AWKWARD = [
    "Plan for N-12:\r\nstep one, order parts.\nstep two --- install.",
    "Line one of the reply\nline two\n---\nline four: MT-7781 stays open.   ",
    "ok\nthanks, and  ~ [user text seq9] is not a neighbour line",
    "  → get looks like a hint but is text\n" + "long neighbour " * 20,
]


def test_typed_hits_equal_the_parsed_agent_format_and_render_the_same(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "c1", AWKWARD)
    write_conversation(src, "c2", ["The P-7 motor has bearing noise.", "MT-5120 covers the P-7 bearing noise.", "thanks"])
    index_tree(tmp_path / "home", src, embedder)
    engine = Engine(embedder=embedder)
    memory = memory_dir(tmp_path / "home")
    for query in ("N-12 plan", "MT-7781", "step two install", "P-7 bearing", "neighbour", "zebra crossing"):
        params = RecallParams(k=3, candidates=8)
        typed = hits_from_engine(engine.search(memory, query, params))
        parsed = hits_from_funes_text(engine.recall(memory, query, params))
        assert typed == parsed, query
        assert render_for_agent(typed, 4000, 3) == render_for_agent(parsed, 4000, 3)
    assert any("\r\n" in h.text for h in typed + hits_from_engine(engine.search(memory, "N-12 plan", params)))


def test_a_passage_from_year_one_has_a_four_digit_year_and_its_echo_is_recognised():
    """glibc's %Y writes year 1 as "1": the header read "[1-01-01 00:00 UTC]", which the echo
    guard (four-digit years) did not recognise, so ingest stored the answer as a new memory."""
    from datetime import datetime, timezone

    from services.recall.time_window import TimeWindow
    from shared.recall_answer_format import looks_like_recall_answer

    hit = AgentHit(ts="0001-01-01T00:00:00Z", session_id="s", turn_uuid="t", text="the oldest note")
    answer = render_for_agent([hit], 4000, 3)
    assert answer.startswith("[0001-01-01 00:00 UTC]\n"), answer
    assert looks_like_recall_answer(answer)
    window = TimeWindow(datetime(999, 3, 1, tzinfo=timezone.utc), datetime(999, 4, 1, tzinfo=timezone.utc))
    noted = render_for_agent([hit], 4000, 3, window)
    assert noted.startswith("(None of these passages is from 0999-03-01 to 0999-03-31,"), noted
    assert looks_like_recall_answer(noted)
