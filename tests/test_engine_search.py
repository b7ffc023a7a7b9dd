"""Recall quality rules and the CLI's handling of awkward queries."""

from __future__ import annotations

from shared.engine.agent_format import parse_recall
from shared.engine.api import Engine
from shared.engine.hybrid_search import RecallParams, bm25_query_text
from shared.engine.identifiers import query_identifiers
from shared.engine.index_run import index_tree, memory_dir
from tests.conftest import write_conversation

# Planted once each, among template-alike decoys (other units, digit look-alikes).
PROBES = {
    "t-mt4471": "Ticket MT-4471 was opened for the K-2 machine spindle noise.",
    "t-n11": "Line N-11 upgrade approved; load will be 91 percent.",
    "t-k047": "Compressor K-047 vibration alarm; work order raised.",
}
DECOYS = [
    "Ticket MT-4417 was opened for the K-2 machine spindle noise.",
    "Ticket P-4471 was opened for the K-7 machine spindle noise.",
    "We counted 4471 items on the MT line for the K-2 machine.",
    "Line N-12 upgrade approved; load will be 91 percent.",
    "Line N-111 upgrade approved; load will be 93 percent.",
    "We need 11 trucks for line N upgrade.",
    "Compressor K-470 vibration alarm; work order raised.",
    "Compressor K-049 vibration alarm; work order raised.",
]


def _memory(tmp_path, embedder):
    src = tmp_path / "src"
    for cid, text in PROBES.items():
        write_conversation(src, cid, ["status check please", text, "thanks"])
    for i, text in enumerate(DECOYS):
        write_conversation(src, f"decoy{i}", ["status check please", text, "thanks"])
    index_tree(tmp_path / "home", src, embedder)
    return memory_dir(tmp_path / "home")


def test_identifiers_rank_their_document_first(tmp_path, embedder):
    memory = _memory(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    for query, cid in [("MT-4471", "t-mt4471"), ("N-11", "t-n11"), ("K-047", "t-k047"),
                       ("status of MT-4471", "t-mt4471"), ("what did we decide about the N-11 upgrade load", "t-n11"),
                       ("K-047 compressor ticket", "t-k047")]:
        hits = parse_recall(engine.recall(memory, query, RecallParams(k=3, neighbors=0)))
        assert hits and hits[0].text == PROBES[cid], f"{query!r} ranked {hits[0].text!r} first"


def test_identifier_extraction_keeps_whole_codes():
    assert query_identifiers("what about MT-4471 and n-11, K-047? INV-80239 2024") == ["MT-4471", "N-11", "K-047", "INV-80239"]
    assert query_identifiers("plain words only") == []


def test_any_user_text_parses_as_a_bm25_query(tmp_path, embedder):
    memory = _memory(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    for q in ['Caroline\'s "plan" (v2): AND OR NOT?', "\\", "-- -k 100", "*:*", "field:value", ")))((("]:
        assert bm25_query_text(q) is not None
        engine.recall(memory, q, RecallParams())  # must not raise
    assert bm25_query_text("MT-4471?") == '"MT-4471?"'


def test_flag_like_queries_are_searched_as_text(tmp_path, embedder, run_engine):
    memory = _memory(tmp_path, embedder)
    out = run_engine("recall", "--memory", str(memory), "-k", "1", "--", "-k", "100")
    assert out.returncode == 0, out.stderr
    assert len(parse_recall(out.stdout)) == 1, "`-k 100` after -- is the query, not a flag"
    out = run_engine("recall", "--memory", str(memory), "--", "--candidates", "MT-4471")
    assert out.returncode == 0 and PROBES["t-mt4471"] in out.stdout


def test_empty_memory_and_empty_query_say_no_results(tmp_path, embedder, run_engine):
    memory = _memory(tmp_path, embedder)
    assert Engine(embedder=embedder).recall(memory, "   ", RecallParams()) == "no results"
    out = run_engine("recall", "--memory", str(tmp_path / "nowhere"), "anything")
    assert out.returncode == 1 and out.stderr.startswith("Error: no index yet")


def test_hits_carry_neighbouring_turns_and_dates(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "c", ["Which feed broke the reconciliation?", "Feed F-204 had a gap; escalate to Priya.", "ok"], day="2026-09-26")
    index_tree(tmp_path / "home", src, embedder)
    out = Engine(embedder=embedder).recall(memory_dir(tmp_path / "home"), "F-204 gap", RecallParams(k=1))
    hit = parse_recall(out)[0]
    assert hit.ts.startswith("2026-09-26") and "F-204" in hit.text
    assert [(role, seq) for role, seq, _ in hit.neighbours] == [("user", 0), ("user", 2)]


def test_filters_by_block_type_and_harness(tmp_path, embedder):
    memory = _memory(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    assert engine.recall(memory, "MT-4471", RecallParams(block_type="thinking")) == "no results"
    assert engine.recall(memory, "MT-4471", RecallParams(harness="codex")) == "no results"
    assert "MT-4471" in engine.recall(memory, "MT-4471", RecallParams(harness="copilot"))


def test_rerank_runs_only_when_pool_is_four_times_k(tmp_path, embedder):
    memory = _memory(tmp_path, embedder)

    class ReverseAlphabet:  # a stand-in cross-encoder: it only has to be observable
        name = "probe"
        calls = 0

        def scores(self, query, texts):
            import numpy as np

            ReverseAlphabet.calls += 1
            return np.array([1.0 if "K-049" in t else 0.1 for t in texts])

    engine = Engine(embedder=embedder, reranker=ReverseAlphabet())
    engine.recall(memory, "compressor alarm", RecallParams(k=8, candidates=30))  # pool of 30 < 4 x 8
    assert ReverseAlphabet.calls == 0
    out = engine.recall(memory, "compressor alarm", RecallParams(k=2, candidates=30, neighbors=0))
    assert ReverseAlphabet.calls == 1
    assert "K-049" in parse_recall(out)[0].text


def test_version_and_usage_errors_follow_funes_exit_codes(run_engine):
    version = run_engine("--version")
    assert version.returncode == 0 and version.stdout.startswith("recall-engine ")
    assert run_engine("recall").returncode == 2, "a usage error (no query) exits 2"
    assert run_engine("nonsense-command").returncode == 2
