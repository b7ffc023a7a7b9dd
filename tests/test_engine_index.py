"""Index runs: incremental equals from scratch, deletes and edits take effect, bad input is survived."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import tantivy

from shared.engine.api import Engine
from shared.engine.hybrid_search import RecallParams
from shared.engine.index_run import index_tree, memory_dir
from shared.engine.store import FTS_DIR, MemoryStore, ModelMismatch
from tests.conftest import VECTOR_DIM, CountingEmbedder, clustered_vectors, new_rows, write_conversation

CONVS = {
    "plant": ["Let's review the N-11 upgrade. Load at 91% is acceptable but tight.",
              "Decision: proceed with the N-11 upgrade once ticket MT-4471 for the K-2 machine is closed."],
    "pump": ["The K-047 compressor vibration alarm fires again.", "I opened work order MT-1040 for the gland leak on pump P-003."],
    "budget": ["Budget scenario: hyperbolic, q0 1500 units/day, Di 0.25/yr, b 0.6.", "That gives 1069.5 units/day at 18 months."],
}


def index_all_conversations(tmp_path: Path, embedder) -> tuple[Path, Path]:
    src = tmp_path / "src"
    for cid, msgs in CONVS.items():
        write_conversation(src, cid, msgs)
    home = tmp_path / "home"
    index_tree(home, src, embedder)
    return src, home


def rows_of(home: Path) -> set[tuple[str, str, str]]:
    conn = sqlite3.connect(memory_dir(home) / "chunks.sqlite3")
    try:
        return set(conn.execute("SELECT session_id, turn_uuid, text FROM chunks").fetchall())
    finally:
        conn.close()


def top_sessions(home: Path, embedder, query: str) -> list[str]:
    engine = Engine(embedder=embedder)
    reader = engine.reader(memory_dir(home))
    from shared.engine.hybrid_search import recall

    return [h.row.session_id for h in recall(reader, embedder, query, RecallParams(k=3, neighbors=0))]


def test_incremental_index_equals_from_scratch(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "plant", CONVS["plant"][:1])
    inc = tmp_path / "inc"
    first = index_tree(inc, src, embedder)
    assert (first.sessions, first.chunks) == (1, 1)
    write_conversation(src, "plant", CONVS["plant"])  # the gateway resends the whole conversation
    write_conversation(src, "pump", CONVS["pump"])
    second = index_tree(inc, src, embedder)
    assert second.chunks == 3, "only the new turns are embedded"
    write_conversation(src, "budget", CONVS["budget"])
    index_tree(inc, src, embedder)

    scratch = index_tree(tmp_path / "scratch", src, embedder)
    assert scratch.chunks == 6
    assert rows_of(inc) == rows_of(tmp_path / "scratch")
    for q in ("N-11 decision", "gland leak work order", "18 month forecast"):
        assert top_sessions(inc, embedder, q) == top_sessions(tmp_path / "scratch", embedder, q)


def test_index_runs_leave_their_bm25_segments_merged(tmp_path):
    """tantivy merges the segments commits leave only while the writer waits for it; dropped at
    once, it killed merges still running, and every query term is looked up in every segment."""
    store = MemoryStore.create(tmp_path / "memory", "test-model", VECTOR_DIM)
    vectors = clustered_vectors(200, seed=1)
    counts = []
    for run in range(24):
        store.commit_changes(new_rows(vectors, 1 + 200 * run), [], {}, [])
        counts.append(len(json.loads((tmp_path / "memory" / FTS_DIR / "meta.json").read_text())["segments"]))
    ids, _ = store.bm25(tantivy.Query.term_query(store.schema, "row_id", 4321), 5)
    store.close()
    assert max(counts) <= 8, f"BM25 segments after each of 24 runs: {counts}"  # tantivy merges 8 of a size
    assert ids == [4321], "the merged segments still hold every run's rows"


def test_unchanged_tree_is_a_no_op(tmp_path, embedder):
    src, home = index_all_conversations(tmp_path, embedder)
    again = index_tree(home, src, embedder)
    assert (again.sessions, again.skipped, again.chunks) == (0, 3, 0)
    assert again.summary_line() == "indexed sessions=0 skipped=3 chunks=0"


def test_deleted_conversation_disappears_from_results(tmp_path, embedder):
    src, home = index_all_conversations(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    assert "MT-1040" in engine.recall(memory_dir(home), "MT-1040", RecallParams())
    (src / "pump.funes.jsonl").unlink()
    report = index_tree(home, src, embedder)
    assert report.removed == 2
    out = engine.recall(memory_dir(home), "MT-1040 gland leak pump", RecallParams())
    assert "MT-1040" not in out and "gland" not in out
    assert not any(s == "pump" for s, _, _ in rows_of(home))


def test_shrunk_and_edited_conversations_are_reindexed(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "plant", CONVS["plant"] + ["Also the budget for N-11 is 40k."])
    home = tmp_path / "home"
    index_tree(home, src, embedder)
    # The conversation is rewritten shorter and its second turn is edited in place.
    write_conversation(src, "plant", [CONVS["plant"][0], "Decision: postpone the N-11 upgrade to Q3."])
    report = index_tree(home, src, embedder)
    assert report.chunks == 1 and report.removed == 2
    texts = {t for _, _, t in rows_of(home)}
    assert texts == {CONVS["plant"][0], "Decision: postpone the N-11 upgrade to Q3."}
    out = Engine(embedder=embedder).recall(memory_dir(home), "N-11 decision", RecallParams())
    assert "postpone" in out and "proceed" not in out and "40k" not in out


def test_malformed_lines_are_skipped_and_counted(tmp_path, embedder):
    src = tmp_path / "src"
    path = write_conversation(src, "plant", CONVS["plant"])
    with open(path, "a") as fh:
        fh.write("{not json\n")
        fh.write('{"session_id": "plant", "seq": 9, "blocks": []}\n')  # no turn_uuid
        fh.write('{"session_id": "plant", "turn_uuid": "t", "seq": "x", "blocks": [{"text": "a"}]}\n')
        fh.write('{"session_id": "plant", "turn_uuid": "half", "seq": 3, "blocks": [{"text": "half-wri')
    report = index_tree(tmp_path / "home", src, embedder)
    assert report.malformed_lines == 4
    assert report.chunks == 2


def test_a_memory_built_with_another_model_is_refused(tmp_path, embedder, monkeypatch):
    src = tmp_path / "src"
    write_conversation(src, "plant", CONVS["plant"])
    home = tmp_path / "home"
    index_tree(home, src, embedder)
    conn = sqlite3.connect(memory_dir(home) / "chunks.sqlite3")
    conn.execute("UPDATE meta SET value='BAAI/bge-small-en-v1.5' WHERE key='model_id'")
    conn.commit()
    conn.close()
    write_conversation(src, "pump", CONVS["pump"])
    with pytest.raises(ModelMismatch, match="rebuild it"):
        index_tree(home, src, embedder)
    with pytest.raises(ModelMismatch, match="refusing to mix"):
        Engine(embedder=embedder).recall(memory_dir(home), "N-11", RecallParams())


def test_forget_removes_a_session_at_once(tmp_path, embedder, run_engine):
    src, home = index_all_conversations(tmp_path, embedder)
    engine = Engine(embedder=embedder)
    assert "1069.5" in engine.recall(memory_dir(home), "forecast 18 months", RecallParams(k=2))
    done = run_engine("forget", "budget", home=home)
    assert done.returncode == 0 and "2 chunks removed" in done.stdout
    assert "1069.5" not in engine.recall(memory_dir(home), "forecast 18 months hyperbolic", RecallParams())


def test_a_purging_index_run_scrubs_deleted_terms_from_the_bm25_files(tmp_path, embedder):
    from shared.engine.store import MemoryStore

    src = tmp_path / "src"
    write_conversation(src, "secret", ["The BLUEHERON codename is confidential.", "noted"])
    write_conversation(src, "keep", ["keep me"])
    for purge in (False, True):
        home = tmp_path / f"home-{purge}"
        index_tree(home, src, embedder)
        hidden = src / "secret.funes.jsonl"
        body = hidden.read_text()
        hidden.unlink()
        index_tree(home, src, embedder, purge=purge)
        hidden.write_text(body)
        store = MemoryStore.open(memory_dir(home))
        terms = store.fts.searcher().terms_with_prefix("text", "bluehe")
        store.close()
        # A plain run only hides the deleted rows; a purge (what forgetting uses) removes the terms.
        assert bool(terms) is (not purge), terms


def test_a_local_model_dir_is_used_stamped_and_never_mixed(tmp_path, run_engine, monkeypatch):
    import json
    import shutil

    from shared.engine.embedder import EmbedderSettings, minilm_spec

    spec = minilm_spec(EmbedderSettings(), int8_compute=False)
    model_dir = tmp_path / "my-minilm-copy"
    (model_dir / "1_Pooling").mkdir(parents=True)
    shutil.copy(spec.onnx_path, model_dir / "model.onnx")
    shutil.copy(spec.tokenizer_path, model_dir / "vocab.txt")
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": False}))
    src = tmp_path / "src"
    write_conversation(src, "plant", CONVS["plant"])
    home = tmp_path / "home"
    monkeypatch.setenv("RECALL_EMBED_MODEL_DIR", str(model_dir))
    assert run_engine("index", "--yes", str(src), home=home).returncode == 0
    status = run_engine("status", str(memory_dir(home)), home=home).stdout
    assert "embedding model: my-minilm-copy (dim 384)" in status
    assert "MT-4471" in run_engine("recall", "MT-4471", home=home).stdout
    monkeypatch.delenv("RECALL_EMBED_MODEL_DIR")
    refused = run_engine("recall", "MT-4471", home=home)  # the default model now
    assert refused.returncode == 1 and "refusing to mix" in refused.stderr and "rebuild it" in refused.stderr


@pytest.mark.parametrize("vanishes", ["after_listing", "before_reading"])
def test_a_source_removed_mid_run_counts_as_deleted(tmp_path, embedder, monkeypatch, vanishes):
    """A snapshot undo, retention or forget may delete a file between the listing and the read."""
    import shared.engine.index_run as index_run

    src, home = index_all_conversations(tmp_path, embedder)
    write_conversation(src, "doomed", ["The Q-731 plan that is being deleted right now."])
    victim = src / "doomed.funes.jsonl"
    if vanishes == "after_listing":
        real_listing = index_run.transcript_signatures

        def list_then_delete(root):
            found = real_listing(root)
            victim.unlink()
            return found

        monkeypatch.setattr(index_run, "transcript_signatures", list_then_delete)
    else:
        real_read = index_run.read_transcript

        def delete_then_read(path):
            if path == victim:
                victim.unlink()
            return real_read(path)

        monkeypatch.setattr(index_run, "read_transcript", delete_then_read)
    report = index_tree(home, src, embedder)
    assert report.chunks == 0 and {r[0] for r in rows_of(home)} == set(CONVS)
    monkeypatch.undo()
    write_conversation(src, "doomed", ["The Q-731 plan, written again."])
    assert index_tree(home, src, embedder).chunks == 1, "a file that comes back is indexed from scratch"


def test_a_checkpoint_that_raises_aborts_the_run_with_nothing_committed(tmp_path, embedder):
    src, home = index_all_conversations(tmp_path, embedder)
    write_conversation(src, "late", ["The Z-9 valve was replaced."])
    seen: list[str] = []

    class Abort(Exception):
        pass

    def stop_before_commit(point: str) -> None:
        seen.append(point)
        if point == "before_commit":
            raise Abort()

    with pytest.raises(Abort):
        index_tree(home, src, embedder, checkpoint=stop_before_commit)
    assert seen == ["after_listing", "mid_embedding", "before_commit"]
    assert "late" not in {r[0] for r in rows_of(home)}
    assert index_tree(home, src, embedder).chunks == 1, "the next run does the work"


def test_a_long_run_stopped_after_a_slice_keeps_it_and_the_next_run_goes_on(tmp_path, embedder, monkeypatch):
    import shared.engine.index_run as index_run

    monkeypatch.setattr(index_run, "COMMIT_SLICE", 2)  # each conversation of CONVS is a slice of its own
    src = tmp_path / "src"
    for cid, msgs in CONVS.items():
        write_conversation(src, cid, msgs)
    home = tmp_path / "home"
    commits = []

    class Stopped(Exception):
        pass

    def stop_at_the_second_commit(point: str) -> None:
        commits.extend([point] if point == "before_commit" else [])
        if len(commits) == 2:
            raise Stopped()

    with pytest.raises(Stopped):
        index_tree(home, src, embedder, checkpoint=stop_at_the_second_commit)
    kept = {r[0] for r in rows_of(home)}
    assert len(kept) == 1 and len(rows_of(home)) == 2, "the first slice is committed, whole"
    (kept_id,) = kept
    passage = CONVS[kept_id][1]
    assert passage[:40] in Engine(embedder=embedder).recall(memory_dir(home), passage, RecallParams(k=1))

    report = index_tree(home, src, embedder)
    assert (report.sessions, report.skipped, report.chunks) == (2, 1, 4), "only what was left is embedded"
    assert {r[0] for r in rows_of(home)} == set(CONVS)


def test_a_run_winding_down_commits_the_whole_conversations_it_embedded_and_the_next_run_goes_on(tmp_path, embedder,
                                                                                               monkeypatch):
    import shared.engine.index_run as index_run
    from shared.engine.index_run import WindDown

    monkeypatch.setattr(index_run, "EMBED_BATCH", 1)  # a checkpoint after every chunk
    src, home = index_all_conversations(tmp_path, embedder)
    (src / "budget.funes.jsonl").unlink()
    for cid in ("plant", "pump"):
        write_conversation(src, f"{cid}-2", CONVS[cid])
    embedded: list[str] = []

    class Stopped(Exception):
        pass

    def stop_after_three_chunks(point: str) -> None:
        if point == "mid_embedding":
            embedded.append(point)
            if len(embedded) == 3:
                raise WindDown(Stopped())

    with pytest.raises(Stopped):
        index_tree(home, src, embedder, checkpoint=stop_after_three_chunks)
    kept = {r[0] for r in rows_of(home)}
    assert kept == {"plant", "pump", "plant-2"}, "the first new conversation whole, not half the second"
    assert len(rows_of(home)) == 6, "and the deleted conversation's rows went with it"

    report = index_tree(home, src, embedder)
    assert (report.sessions, report.chunks) == (1, 2), "only the conversation left is embedded"
    assert {r[0] for r in rows_of(home)} == {"plant", "pump", "plant-2", "pump-2"}


def test_the_listing_walks_sorted_and_keeps_only_regular_transcripts_inside_the_tree(tmp_path):
    """One scandir pass replaced os.walk + two stats per file; what counts as a source must not move."""
    import os

    from shared.engine.transcript import transcript_signatures

    outside = tmp_path / "outside"
    (outside / "dir").mkdir(parents=True)
    (outside / "leak.funes.jsonl").write_text("{}\n")
    src = tmp_path / "src"
    (src / "sub" / "deeper").mkdir(parents=True)
    for rel in ("b.funes.jsonl", "a.funes.jsonl", "sub/c.funes.jsonl", "sub/deeper/d.funes.jsonl", "z.funes.jsonl.tmp",
                ".hidden.funes.jsonl", "sub/notes.txt"):
        (src / rel).write_text("{}\n" * len(rel))
    (src / "linked.funes.jsonl").symlink_to(outside / "leak.funes.jsonl")
    (src / "linked-dir").symlink_to(outside / "dir")
    (src / "dir.funes.jsonl").mkdir()
    os.mkfifo(src / "pipe.funes.jsonl")

    found = transcript_signatures(src)

    assert list(found) == [str(src / rel) for rel in ("a.funes.jsonl", "b.funes.jsonl", "sub/c.funes.jsonl", "sub/deeper/d.funes.jsonl")]
    st = (src / "a.funes.jsonl").stat()
    assert found[str(src / "a.funes.jsonl")] == f"{st.st_size}:{st.st_mtime_ns}"
    assert transcript_signatures(src / "a.funes.jsonl") == {str(src / "a.funes.jsonl"): f"{st.st_size}:{st.st_mtime_ns}"}


def test_a_forget_removes_only_what_the_tree_no_longer_holds_and_embeds_nothing(tmp_path, embedder):
    """A forget's run must not wait for a backlog (a large first import): it removes the rows
    whose text is gone — a deleted conversation's, and the turns a rewritten one no longer holds —
    and leaves adding to the next full run."""
    src, home = index_all_conversations(tmp_path, embedder)
    write_conversation(src, "late", ["A backlog conversation about the Q-17 pallets."])
    write_conversation(src, "pump", [CONVS["pump"][0], "Work order closed; nothing else to report."])
    (src / "budget.funes.jsonl").unlink()
    counting = CountingEmbedder(embedder)

    report = index_tree(home, src, counting, purge=True, only_removals=True)

    assert counting.embedded == 0 and report.chunks == 0 and report.removed == 3
    assert {(r[0], r[2]) for r in rows_of(home)} == {("plant", t) for t in CONVS["plant"]} | {("pump", CONVS["pump"][0])}
    on_disk = [f for f in home.rglob("*") if f.is_file() and (b"1069.5" in f.read_bytes() or b"P-003" in f.read_bytes())]
    assert on_disk == [], "the removed text is scrubbed from every file"
    after = index_tree(home, src, counting)
    assert (after.sessions, after.chunks) == (2, 2), "the next run adds the backlog and the rewritten turn"
    assert {r[0] for r in rows_of(home)} == {"plant", "pump", "late"}


def test_a_long_turns_later_passages_start_at_a_line_or_a_word_and_stitch_back_whole():
    """A newcomer's log turn came back as passages starting "ffset 1721": funes starts each
    window exactly 150 characters back, inside a word; an integrator's log, as "in 36 ms", the
    end of a line."""
    import random

    from shared.engine.agent_format import _stitch
    from shared.engine.chunking import split_text

    rnd = random.Random(7)
    vocabulary = ["offset", "consumer", "lag", "partition", "1721", "rebalance", "ошибка", "commit", "x" * 40]
    for n in range(100):
        text = " ".join(rnd.choice(vocabulary) for _ in range(rnd.randint(300, 700)))
        text = text.replace(" ", "\n", rnd.randint(0, 40) if n % 2 else 0)
        pieces = split_text(text)
        assert len(pieces) > 1 and _stitch(pieces) == text
        for piece in pieces[1:]:
            at = text.index(piece)
            assert text[at - 1].isspace(), piece[:20]  # every word is shorter than the overlap
    log = "\n".join(f"2026-11-29T03:{i // 60:02d}:{i % 60:02d}.123Z INFO worker-{i % 7} processed batch {1000 + i} in "
                    f"{i % 97} ms" for i in range(180))
    pieces = split_text(log)
    assert len(pieces) > 10 and _stitch(pieces) == log
    assert all(piece.startswith("2026-11-29T03:") for piece in pieces), [p[:20] for p in pieces if not p.startswith("2026")]
    unbroken = "a" * 3000  # no space in the overlap: the hard start stays, and stitching still works
    assert _stitch(split_text(unbroken)) == unbroken


INDEX_PEAK_PROBE = """
import resource, sys
from pathlib import Path
from shared.engine.embedder import shared_embedder
from shared.engine.index_run import index_tree
embedder = shared_embedder()
embedder.embed(["warm up"])  # the model loaded and run once: what indexing adds is measured alone
loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
index_tree(Path(sys.argv[1]) / "home", Path(sys.argv[1]) / "src", embedder)
print(loaded, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
"""


def test_a_pasted_log_of_colour_codes_is_indexed_within_a_bounded_memory(tmp_path):
    """150,000 characters of ANSI colour codes (terminal output, a token per character: 143
    chunks of 512 tokens) took an index run to 2.2 GB in 32-row runs (a security review's trial;
    an indexer's limit is 2 GiB); attention's rows x width² per run is now bounded."""
    import subprocess
    import sys

    write_conversation(tmp_path / "src", "log", ["\x1b[31m" * 30000, "That is only colour codes."])
    out = subprocess.run([sys.executable, "-c", INDEX_PEAK_PROBE, str(tmp_path)], capture_output=True, text=True,
                         timeout=600, check=True)
    loaded_mib, peak_mib = map(int, out.stdout.split()[-2:])
    assert peak_mib - loaded_mib < 500, f"peak RSS {peak_mib} MiB while indexing one pasted log, {loaded_mib} before"
