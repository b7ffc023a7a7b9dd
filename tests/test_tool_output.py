"""Both backends give the agent the same passages: the embedded engine's typed hits and funes'
agent-format text parsed back are one hit model (funes' text does not say who said a passage)."""

from __future__ import annotations

from services.recall.tool_output import (AgentHit, Neighbour, hits_from_engine, hits_from_funes_text, previews,
                                         render_for_agent)
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
        assert [h.model_copy(update={"role": "", "seq": None}) for h in typed] == parsed, query  # funes says neither
        assert render_for_agent(typed, 4000, 3) == render_for_agent(parsed, 4000, 3).replace(
            " UTC]\n", " UTC] {}\n").format(*[h.role for h in typed])
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


def test_the_header_says_who_said_the_passage_and_the_answer_is_still_recognised_as_an_echo(tmp_path, embedder):
    """A newcomer could not tell the assistant's suggestion ("set the keepalive to 75s") from what
    the user did ("raised the keepalive to 75s"): previews named their role, the passage did not."""
    from shared.recall_answer_format import looks_like_recall_answer

    src = tmp_path / "src"
    write_conversation(src, "c1", ["The 502s come from the load balancer closing idle connections.",
                                   "Set the app keepalive above the balancer's idle timeout, e.g. 75s.",
                                   "Raised the app keepalive to 75s; the 502s stopped."])
    index_tree(tmp_path / "home", src, embedder)
    hits = hits_from_engine(Engine(embedder=embedder).search(memory_dir(tmp_path / "home"), "keepalive 75s",
                                                              RecallParams(k=2, candidates=8)))
    answer = render_for_agent(hits, 4000, 2)
    assert "UTC] user\n  cite: session_id=c1 turn_uuid=c1-2\nRaised the app keepalive" in answer, answer
    assert "UTC] assistant\n  cite: session_id=c1 turn_uuid=c1-1\nSet the app keepalive" in answer, answer
    assert looks_like_recall_answer(answer)
    assert not looks_like_recall_answer(answer.replace("UTC] user", "UTC] the user"))


def test_an_identifier_no_passage_holds_is_named_in_a_note_above_them():
    """A newcomer asked `N-11 upgrade` of a user who never said N-11: three other upgrades came
    back with nothing to say that N-11 was in none of them."""
    from datetime import datetime, timezone

    from services.recall.time_window import TimeWindow
    from shared.recall_answer_format import looks_like_recall_answer

    pg = AgentHit(ts="2026-10-08T10:00:00Z", session_id="s", turn_uuid="t", text="The pg upgrade runs on Friday.",
                  neighbours=(Neighbour(role="user", preview="and K-047 after it"),))
    answer = render_for_agent([pg], 4000, 3, identifiers=["N-11", "K-047", "MT-4471"])
    assert answer.splitlines()[0] == ("(None of these passages mentions N-11 or MT-4471, which the query names; they are "
                                      "the closest matches to the rest of it.)"), answer
    assert looks_like_recall_answer(answer)
    # An echo of round 29's wording is still recognised (gateways post earlier answers back).
    assert looks_like_recall_answer(answer.replace("they are the closest matches to the rest of it", "they match the rest of it"))
    assert render_for_agent([pg], 4000, 3, identifiers=["K-047"]).startswith("[2026-10-08 10:00 UTC]\n")
    window = TimeWindow(datetime(2026, 11, 1, tzinfo=timezone.utc), datetime(2026, 12, 1, tzinfo=timezone.utc))
    both = render_for_agent([pg], 4000, 3, window, identifiers=["N-11"])
    assert both.splitlines()[1].startswith("(None of these passages is from 2026-11-01 to 2026-11-30") and \
        looks_like_recall_answer(both), both


def test_a_neighbour_preview_cut_at_its_length_says_so():
    """A newcomer saw the root cause only as `~ assistant: Root cause: … Mitigation: pool r`,
    cut mid-word with nothing to say that more was said."""
    cut = "Root cause: the payment gateway's connection pool was exhausted by retries " * 3
    hit = AgentHit(ts="2026-11-06T10:00:00Z", session_id="s", turn_uuid="t", text="What was the root cause?",
                   neighbours=previews([(1, "assistant", cut), (2, "user", "thanks")]))
    lines = render_for_agent([hit], 4000, 3).splitlines()
    assert lines[3] == f"  ~ assistant: {cut[:160].rstrip()}…" and lines[4] == "  ~ user: thanks", lines


def test_a_long_neighbouring_turn_is_one_preview_on_one_line():
    """A pasted log's ~15 chunks were each a preview, over several lines each: 3 KB of a 4 KB
    answer, read as the passage's own text."""
    log = [f"INFO worker-{i} processed batch {i}\nWARN retry {i}\n" * 20 for i in range(15)]
    hit = AgentHit(ts="2026-11-06T10:00:00Z", session_id="s", turn_uuid="t", text="Why did the job fail?",
                   neighbours=previews([*((4, "user", piece) for piece in log), (5, "assistant", "It ran out\nof retries.")]))
    lines = render_for_agent([hit], 4000, 3).splitlines()
    assert lines[3:] == [f"  ~ user: {' '.join(log[0][:160].split())}…", "  ~ assistant: It ran out of retries.", "---"], lines


def test_a_turn_next_to_a_shown_passage_that_the_answer_leaves_out_is_its_preview():
    """"wedding last week" over a pool of 9: the engine previews no hit (it shows them whole), the
    window put another time's wedding passage before the same conversation's photographer turn,
    and the answer left that turn out: the wedding came back without it."""
    from datetime import datetime, timezone

    from services.recall.time_window import TimeWindow

    week = TimeWindow(datetime(2026, 11, 23, tzinfo=timezone.utc), datetime(2026, 11, 30, tzinfo=timezone.utc))
    opening = AgentHit(ts="2026-11-25T10:00:00Z", role="user", session_id="wedding-2", turn_uuid="t0", seq=0,
                       text="Wedding planning: which photographer?")
    october = AgentHit(ts="2026-10-10T10:00:00Z", role="user", session_id="wedding-1", turn_uuid="t0", seq=0,
                       text="The wedding venue is booked.")
    photographer = AgentHit(ts="2026-11-25T10:01:00Z", role="assistant", session_id="wedding-2", turn_uuid="t1", seq=1,
                            text="Marta Quinn asks $4,200,\nLightbox $3,600.", filler=True)
    lines = render_for_agent([opening, october, photographer], 4000, 2, week).splitlines()
    assert lines[:4] == ["[2026-11-25 10:00 UTC] user", "  cite: session_id=wedding-2 turn_uuid=t0",
                         "Wedding planning: which photographer?", "  ~ assistant: Marta Quinn asks $4,200, Lightbox $3,600."]
    assert "wedding-1" in "\n".join(lines) and lines.count("---") == 2
