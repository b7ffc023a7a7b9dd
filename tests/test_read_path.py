"""The cheaper read path answers exactly what the plain one did: the scan of the mapped rows and
the packed scan give the same exact integer scores (also from a snapshot written before the rows), BM25 reads fewer documents for the same hits, neighbours come from one statement,
and a refresh that skips its transaction still sees every commit."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from shared.engine import agent_format, vector_file
from shared.engine.api import Engine
from shared.engine.hybrid_search import (CONVERSATION_DEPTH, MIN_LEG_DEPTH, RecallParams, bm25_leg, bm25_query_text,
                                         conversation_candidates, recall, search_legs)
from shared.engine.identifiers import query_identifiers
from shared.engine.index_run import index_tree, memory_dir
from shared.engine.memory_reader import MemoryReader
from shared.engine.store import MemoryStore
from shared.engine.text_analysis import phrase
from shared.engine.vector_file import open_vector_file, quantise_query
from tests.conftest import write_conversation

UNITS = ["pump P-101", "mixer X-038", "boiler B-011", "press M-016", "compressor K-047", "conveyor C-220"]
SITES = ["Bay", "Lake", "Summit", "Harbor"]
PEOPLE = ["Aiko", "Ravi", "Lena", "Tom"]
QUESTIONS = [
    "Who owns the lubrication round for the press M-016?", "K-047 vibration alarm", "which work order covers the gland leak",
    "what did Lena decide about the boiler at Summit", "thanks", "seal weeping fluid on the mixer",
    "MT-4471", "conveyor C-220 belt slip at Harbor", "Aiko", "decision on the ageing pump",
]
NOW = 1.8e9


@pytest.fixture(scope="module")
def memory(tmp_path_factory, embedder):
    """Template-alike chats (many near-ties) with repeated lines (exact ties), 48 conversations."""
    root = tmp_path_factory.mktemp("read-path")
    src = root / "src"
    for i in range(48):
        unit, site, person = UNITS[i % 6], SITES[i % 4], PEOPLE[(i // 4) % 4]
        write_conversation(src, f"c{i:02d}", [
            f"The {unit} at {site} has a gland leak again.",
            f"I opened work order MT-{4400 + i} for it; {person} will pick it up.",
            "thanks!",
            f"{person} owns the lubrication round for the {unit}, due Tuesday.",
            f"We need a call on the ageing {unit} at {site}.",
            "ok",
        ], day=f"2026-10-{1 + i % 28:02d}")
    index_tree(root / "home", src, embedder)
    return memory_dir(root / "home")


def _answers(reader: MemoryReader, embedder, params: RecallParams) -> list[str]:
    return [agent_format.render_recall(recall(reader, embedder, q, params, now=NOW), "m") for q in QUESTIONS]


def test_both_scans_give_each_row_its_exact_integer_product_with_the_query(memory):
    """The mapped rows (shared session) and the packed columns (a hot snapshot's own session)."""
    vf = open_vector_file(memory, 384)
    assert vf is not None and vf.n > 200 and vf.owned_bytes == 0, "the rows are mapped"
    rows = vf.rows.astype(np.int64) - vector_file.ROW_OFFSET
    assert rows.min() >= -127 and rows.max() <= 127 and np.array_equal(rows.T, vf.matrix_t)
    rng = np.random.default_rng(3)
    for _ in range(20):
        q = quantise_query(rng.standard_normal(384).astype(np.float32))
        assert np.abs(q).max() == vector_file.QUERY_LEVELS
        exact = (rows @ q.astype(np.int64))[:, 0]
        vf.scanner.packed = None
        assert np.array_equal(vf.scanner.integer_scores(vf, q), exact)
        vf.scanner.packed = vf.scanner._pack(vf)
        assert np.array_equal(vf.scanner.integer_scores(vf, q), exact)
    assert vf.scanner.packed_bytes == vf.n * vf.dim


def test_a_hot_memory_packs_its_scan_once_and_answers_the_same(memory, embedder, monkeypatch):
    params = RecallParams(k=3, candidates=8, explain=True)
    monkeypatch.setattr(vector_file, "PACK_AFTER_SCANS", 10**9)
    cold = MemoryReader(memory)
    plain = _answers(cold, embedder, params)
    assert cold.view.base.scanner.packed is None, "below the threshold nothing is packed"
    monkeypatch.setattr(vector_file, "PACK_AFTER_SCANS", 1)
    hot = MemoryReader(memory)
    hot.refresh()
    before = hot.resident_bytes()
    packed = _answers(hot, embedder, params)
    assert hot.view.base.scanner.packed is not None
    assert hot.resident_bytes() > before, "the packed copy counts against the reader cache"
    assert packed == plain
    assert any("MT-44" in a or "M-016" in a for a in plain), "the questions find something"
    cold.close()
    hot.close()


def test_a_scan_that_cannot_be_packed_keeps_answering_the_same_and_stops_trying(memory, embedder, monkeypatch):
    params = RecallParams(k=3, candidates=8)
    plain = _answers(MemoryReader(memory), embedder, params)
    attempts = []

    def no_room(self, vf):
        attempts.append(vf.n)
        raise MemoryError("no room for the packed copy")

    monkeypatch.setattr(vector_file.Scanner, "_pack", no_room)
    monkeypatch.setattr(vector_file, "PACK_AFTER_SCANS", 1)
    reader = MemoryReader(memory)
    assert _answers(reader, embedder, params) == plain
    assert len(attempts) == 1 and reader.view.base.scanner.packed is None
    reader.close()


def _as_written_before_the_rows(memory) -> None:
    """The memory's snapshot as a release before the row-major rows wrote it: no `rows` section
    named in the header (the sections are found by name)."""
    path = memory / vector_file.VECTOR_FILE
    data = bytearray(path.read_bytes())
    (length,) = struct.unpack("<I", data[8:12])
    header = json.loads(data[12: 12 + length])
    del header["offsets"]["rows"]
    blob = json.dumps(header).encode()
    data[8: 12 + length] = struct.pack("<I", len(blob)) + blob + b" " * (length - len(blob))
    path.write_bytes(bytes(data))


def test_a_snapshot_written_before_the_rows_answers_the_same_until_the_next_run_rewrites_it(
        memory, embedder, tmp_path):
    import shutil

    params = RecallParams(k=3, candidates=8, explain=True)
    plain = _answers(MemoryReader(memory), embedder, params)
    older = tmp_path / "memory"
    shutil.copytree(memory, older)
    _as_written_before_the_rows(older)
    reader = MemoryReader(older)
    reader.refresh()
    base = reader.view.base
    assert base.owned_bytes == base.n * 384, "its rows are a copy in RAM"
    assert reader.resident_bytes() >= base.mapped_bytes + base.owned_bytes, "the copy counts against the reader cache"
    assert base.held_bytes == base.mapped_bytes + base.owned_bytes
    assert _answers(reader, embedder, params) == plain
    reader.close()
    store = MemoryStore.open(older)
    store.publish_vectors()  # not forced: an index run with nothing new to publish
    store.close()
    rewritten = open_vector_file(older, 384)
    assert rewritten.owned_bytes == 0 and rewritten.held_bytes == rewritten.mapped_bytes - rewritten.n * 384


def test_a_memory_searched_a_few_times_keeps_no_copy_of_its_vectors(memory, embedder, monkeypatch):
    """Below the packing threshold the scan reads the mapped rows: a tenant making a few calls
    between index runs and evictions (most of them) costs no RAM for its vectors."""
    monkeypatch.setattr(vector_file, "PACK_AFTER_SCANS", 10**9)
    reader = MemoryReader(memory)
    params = RecallParams(k=3, candidates=8)
    _answers(reader, embedder, params)  # the first call reads the stems' vocabulary
    after_one = reader.resident_bytes()
    for _ in range(3):
        _answers(reader, embedder, params)
    assert reader.resident_bytes() == after_one
    base = reader.view.base
    assert base.owned_bytes == 0 and base.scanner.packed is None
    assert base.held_bytes == base.mapped_bytes - base.n * 384, "one of the file's two layouts is read"
    reader.close()


def test_bm25_reads_only_the_documents_it_needs_and_keeps_the_same_hits(memory):
    reader = MemoryReader(memory)
    reader.refresh()
    store = reader.store
    for block_type in (None, "text", "no-such-type"):
        mask = reader.filter_mask(block_type, None)
        for question in QUESTIONS:
            text = bm25_query_text(question, reader.fts_analyzer)
            if not text:
                continue
            query = store.fts.parse_query(text, ["text"])
            for depth, limit in ((70, 30), (26, 8), (5, 8)):
                searcher = store.fts.searcher()
                every = [(int(searcher.doc(a)["row_id"][0]), float(s)) for s, a in searcher.search(query, depth).hits]
                expected = [hit for hit in every if reader.passes(hit[0], mask)][:limit]
                assert reader.bm25(query, depth, limit, mask) == expected
    reader.close()


def test_bm25_reads_a_shallow_top_list_first_and_answers_as_the_full_depth_would(tmp_path, embedder):
    """Several index runs (several tantivy segments) of lines repeated word for word (tied
    scores): tantivy's shorter top lists are prefixes of its longer ones, so reading `limit +
    BM25_SLACK` hits first changes nothing, also when dead rows make it read the full depth."""
    src = tmp_path / "src"
    for run in range(3):
        for i in range(12):
            write_conversation(src, f"r{run}c{i:02d}", [f"The {UNITS[i % 6]} at {SITES[i % 4]} has a gland leak again.",
                                                        "thanks!", f"Lena owns the round for the {UNITS[(i + run) % 6]}."])
        index_tree(tmp_path / "home", src, embedder)
    reader = MemoryReader(memory_dir(tmp_path / "home"))
    reader.refresh()
    store = reader.store
    assert len(list((memory_dir(tmp_path / "home") / "fts").glob("*.idx"))) > 1, "several segments"
    unfiltered = reader.filter_mask(None, None)
    dead = reader.filter_mask(None, None)
    dead.bits[::2] = False  # as if every other row had been forgotten since tantivy's last merge
    assert not dead.filtered
    for question in [*QUESTIONS, "gland leak", "thanks", "Lena round"]:
        text = bm25_query_text(question, reader.fts_analyzer)
        if not text:
            continue
        query = store.fts.parse_query(text, ["text"])
        full_ids, full_scores = store.bm25(query, 500)
        for depth in range(1, 60):
            assert store.bm25(query, depth) == (full_ids[:depth], full_scores[:depth])
        for mask in (unfiltered, dead, reader.filter_mask("text", None)):
            for depth, limit in ((70, 30), (26, 8), (5, 8), (500, 100)):
                ids, scores = store.bm25(query, depth)
                expected = [hit for hit, ok in zip(zip(ids, scores), reader.passing(ids, mask)) if ok][:limit]
                assert reader.bm25(query, depth, limit, mask) == expected, (question, depth, limit)
    reader.close()


def test_passing_agrees_with_passes_for_any_row_id(memory):
    reader = MemoryReader(memory)
    reader.refresh()
    mask = reader.filter_mask("text", None)
    mask.bits[::3] = False  # as if every third row were forgotten
    ids = [-5, 0, *range(1, reader.n + 5), 10**12]
    assert reader.passing(ids, mask) == [reader.passes(i, mask) for i in ids]
    assert reader.passing([], mask) == []
    reader.close()


def test_neighbours_of_all_hits_in_one_statement_equal_each_window_alone(memory):
    store = MemoryStore.open(memory)
    windows = [("c03", 0, 2), ("c03", 4, 9), ("c47", -1, 1), ("nobody", 0, 5), ("c10", 2, 2), ("c03", 0, 2)]
    assert store.sessions_rows(windows) == [store.session_rows(*w) for w in windows]
    assert store.sessions_rows([]) == []
    store.close()


def test_a_warm_recall_asks_sqlite_four_statements_and_still_sees_every_commit(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "a", ["The N-11 upgrade is approved.", "ok"])
    index_tree(tmp_path / "home", src, embedder)
    memory = memory_dir(tmp_path / "home")
    engine = Engine(embedder=embedder)
    params = RecallParams(k=3, candidates=8)
    engine.recall(memory, "N-11 upgrade", params)
    statements: list[str] = []
    with engine.lease(memory) as reader:
        reader.store.conn.set_trace_callback(statements.append)
        engine.recall(memory, "N-11 upgrade", params)
        assert [s.split()[0] for s in statements] == ["PRAGMA", "SELECT", "SELECT", "SELECT"], statements
        statements.clear()
        # A commit that does not move the generation (another connection) is still noticed.
        other = MemoryStore.open(memory)
        other.conn.execute("UPDATE meta SET value='' WHERE key='fts_analyzer'")
        other.close()
        assert reader.refresh() is False and reader.fts_analyzer == ""
        reader.store.conn.set_trace_callback(None)
    write_conversation(src, "b", ["Ticket MT-9001 covers the conveyor belt slip.", "ok"])
    index_tree(tmp_path / "home", src, embedder)
    assert "MT-9001" in engine.recall(memory, "MT-9001 conveyor", params), "a new generation is picked up"


def test_turns_read_only_to_judge_their_conversation_are_not_read_from_sqlite(memory, embedder, monkeypatch):
    """The snapshot holds every turn's stems, so conversation evidence judges its ~3 turns per
    conversation without SQLite; the one read of rows holds the legs' turns and the best turns
    of the best conversations (a first turn), which the pool may show."""
    reader = MemoryReader(memory)
    reader.refresh()
    mask = reader.filter_mask(None, None)
    read: list[int] = []
    original = MemoryStore.rows
    monkeypatch.setattr(MemoryStore, "rows", lambda self, ids: read.extend(ids) or original(self, ids))
    skipped = 0
    for question in QUESTIONS:
        legs = search_legs(reader, embedder.embed_query(question), question, MIN_LEG_DEPTH, mask, CONVERSATION_DEPTH)
        idents = query_identifiers(question)
        ident_leg = bm25_leg(reader, " ".join(f'"{phrase(i)}"' for i in idents), 8, mask) if idents else []
        found = {rid for leg in (legs.dense, legs.bm25, ident_leg) for rid, _ in leg}
        turns = conversation_candidates(reader, legs.bm25_deep, mask).turns.values()
        firsts = {judged[0] for judged in turns}
        judged_only = {rid for judged in turns for rid in judged} - found - firsts
        read.clear()
        recall(reader, embedder, question, RecallParams(k=3, candidates=8), now=NOW)
        assert set(read) <= found | firsts, question
        assert not set(read) & judged_only
        skipped += len(judged_only)
    assert skipped > 20, "the questions judge turns the legs did not find"
    reader.close()
