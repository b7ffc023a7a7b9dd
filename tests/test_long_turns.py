"""A pasted log or data dump is one turn of many chunks. It counts as one turn: its pieces do not
lift each other over the conversation a question is about, take the answer's places, or come
back as several passages (an integrator's trial: a 15 KB log hid an October conversation that
held every word of "payment-worker memory limit")."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from shared.engine.api import Engine
from shared.engine.hybrid_search import RecallParams
from shared.engine.index_run import index_tree, memory_dir
from tests.conftest import write_conversation

LOG = "\n".join(f"2026-11-29T03:{i // 60:02d}:{i % 60:02d}.123Z INFO worker-{i % 7} processed batch {1000 + i} in {i % 97} ms"
                for i in range(180)) + "\n" + "\n".join(f"2026-11-29T03:04:{i:02d}.500Z WARN worker-{i % 7} retry {i} for "
                                                         f"batch 1181" for i in range(40))
DUMP = json.dumps({"items": [{"sku": f"SKU-{i:05d}", "qty": i % 9, "warehouse": "WH-RIGA-2" if i == 377 else "WH-MAIN"}
                             for i in range(500)]}, separators=(",", ":"))


@pytest.fixture(scope="module")
def memory(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("long-turns")
    src = root / "src"
    write_conversation(src, "crashloop", ["The payment-worker pods are in CrashLoopBackOff again, OOMKilled.",
                                          "Exit code 137: the container exceeded its memory limit. What is the limit?",
                                          "The limit is 512Mi; I set it to 1Gi and the pods are stable."], day="2026-10-10")
    write_conversation(src, "ledger", [f"Nightly reconciliation failed again. Here is the log:\n{LOG}",
                                       "The job dies at batch 1181 because ledger-svc resets the connection."],
                       day="2026-11-29")
    write_conversation(src, "inventory", [f"Which warehouse holds SKU-00377? Inventory dump: {DUMP}",
                                          "SKU-00377 is the only item in WH-RIGA-2."], day="2026-11-12")
    write_conversation(src, "christmas", ["Going to Riga for Christmas to see my sister Anna.",
                                          "Flights to Riga are cheapest on the 22nd."], day="2026-11-21")
    write_conversation(src, "shipping", ["Ship the pallets to WH-RIGA-2 on Monday.", "Booked the truck."], day="2026-11-20")
    index_tree(root / "home", src, embedder)
    return memory_dir(root / "home")


def _search(embedder, memory, query: str, k: int = 3):
    return Engine(embedder=embedder).search(memory, query, RecallParams(k=k, candidates=8, neighbors=1))


def test_a_question_about_a_conversation_finds_it_before_a_long_log_sharing_a_word(memory, embedder):
    hits = _search(embedder, memory, "memory limit for payment-worker")
    assert [h.row.session_id for h in hits[:2]] == ["crashloop", "crashloop"], [(h.row.session_id, h.row.text[:40]) for h in hits]


def test_no_two_passages_of_an_answer_are_pieces_of_one_turn(memory, embedder):
    for query in ("batch 1181 retry", "worker processed batch", "WH-MAIN warehouse SKU"):
        turns = [(h.row.session_id, h.row.turn_uuid) for h in _search(embedder, memory, query, k=5)]
        assert len(turns) == len(set(turns)), (query, turns)


def test_a_one_word_question_gets_each_turn_holding_it_once(memory, embedder):
    sessions = sorted(h.row.session_id for h in _search(embedder, memory, "Riga", k=5))
    assert sessions == ["christmas", "christmas", "inventory", "inventory", "shipping"], sessions


def test_a_days_conversation_is_shown_by_its_turns_not_by_the_pieces_of_its_log(memory, embedder):
    start, end = (datetime(2026, 11, d, tzinfo=timezone.utc).timestamp() for d in (29, 30))
    dated = Engine(embedder=embedder).dated(memory, start, end, RecallParams(k=3, neighbors=0))
    assert [h.row.turn_uuid for h in dated.hits] == ["ledger-0", "ledger-1"], [h.row.text[:40] for h in dated.hits]
    assert dated.hits[0].row.text.startswith("Nightly reconciliation failed again.")
