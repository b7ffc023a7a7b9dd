"""Conversation-level evidence: a question whose words are split over two turns of one
conversation finds that conversation, ahead of a look-alike turn elsewhere that holds more of
the question's words on its own (hybrid_search.CONVERSATION_WEIGHT)."""

from __future__ import annotations

import pytest

from shared.engine import hybrid_search
from shared.engine.agent_format import parse_recall
from shared.engine.api import Engine
from shared.engine.hybrid_search import RecallParams
from shared.engine.index_run import forget_session, index_tree, memory_dir
from shared.engine.memory_reader import MemoryReader
from shared.engine.store import MemoryStore
from shared.engine.text_analysis import _query_clauses, distinct_stems, fts_text, held_stems, index_text, stem, turn_stems
from tests.conftest import write_conversation

# The right conversation names the machine and the site in its request and the person in its
# fact; the look-alike holds machine and person in one short turn, so the turn-level ranking
# prefers it. Sites and the ticket wording recur in other conversations, as in a real history.
RIGHT = ["The boiler at Summit has a gland leak again.", "I opened work order MT-1234 for it; Aiko will pick it up.",
         "Thanks."]
LOOK_ALIKE = ["Any news on the boiler?", "Aiko owns the lubrication round for the boiler, MT-5678, due Tuesday.", "Ok."]
QUESTION = "Which ticket did we raise about the boiler at Summit for Aiko?"


@pytest.fixture(scope="module")
def memory(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("conversation-evidence")
    src = root / "src"
    write_conversation(src, "right", RIGHT)
    write_conversation(src, "look-alike", LOOK_ALIKE)
    for i, (site, person) in enumerate([("Summit", "Priya"), ("Lake", "Omar"), ("Lake", "Greta"), ("Bay", "Sven")]):
        write_conversation(src, f"other{i}", [f"The press at {site} is slow today.",
                                              f"{person} raised ticket MT-90{i}0 for the press; the ticket is raised.",
                                              "Noted."])
    index_tree(root / "home", src, embedder)
    return memory_dir(root / "home")


def _first_hit(engine: Engine, memory) -> str:
    out = engine.recall(memory, QUESTION, RecallParams(k=3, neighbors=1, explain=True))
    hit = parse_recall(out)[0]
    return hit.text + " | " + " | ".join(t for _, _, t in hit.neighbours) + "\n" + out


def test_a_question_split_over_two_turns_finds_that_conversation_first(memory, embedder):
    first = _first_hit(Engine(embedder=embedder), memory)
    assert "MT-1234" in first.split("\n")[0] and "Summit" in first.split("\n")[0], first


def test_without_conversation_evidence_the_look_alike_turn_wins(memory, embedder, monkeypatch):
    # The contrast that shows the lift above is what decides: the turn-level ranking alone
    # prefers the turn holding most of the question's words.
    monkeypatch.setattr(hybrid_search, "CONVERSATION_WEIGHT", 0.0)
    first = _first_hit(Engine(embedder=embedder), memory)
    assert "MT-5678" in first.split("\n")[0], first


def test_explain_shows_the_conversation_lift(memory, embedder):
    out = Engine(embedder=embedder).recall(memory, QUESTION, RecallParams(k=3, explain=True))
    lines = [line for line in out.splitlines() if line.startswith("  ? ")]
    assert lines and all("conversation +" in line for line in lines), out
    assert float(lines[0].split("conversation +")[1].split()[0]) > 0, lines[0]


def test_every_row_knows_its_conversation_in_the_snapshot_and_after_it(tmp_path, embedder):
    """Conversation codes come from SQLite for the int8 snapshot's rows (the file does not hold
    them) and from the catch-up read for rows written after it."""
    src, home = tmp_path / "src", tmp_path / "home"
    for i in range(3):
        write_conversation(src, f"c{i}", [f"turn one of c{i}", f"turn two of c{i}"])
    index_tree(home, src, embedder)
    store = MemoryStore.open(memory_dir(home))
    store.publish_vectors(force=True)
    store.close()
    write_conversation(src, "late", ["written after the snapshot", "second turn"])
    index_tree(home, src, embedder)
    reader = MemoryReader(memory_dir(home))
    reader.refresh()
    view = reader.view
    assert view.base is not None and view.n > view.n_base > 0
    rows = reader.store.rows(view.ids.tolist())
    mask = reader.filter_mask(None, None)
    codes = reader.sessions_of(view.ids.tolist(), mask).tolist()
    code_of: dict[str, set[int]] = {}
    for rid, code in zip(view.ids.tolist(), codes):
        code_of.setdefault(rows[rid].session_id, set()).add(code)
    assert sorted(code_of) == ["c0", "c1", "c2", "late"]
    assert all(len(c) == 1 and 0 not in c for c in code_of.values())
    assert len({c for cs in code_of.values() for c in cs}) == 4
    assert reader.sessions_of([10**9], mask).tolist() == [0]
    reader.close()


def test_a_turn_is_judged_by_the_stems_bm25_indexed_for_it():
    for text in ["The boiler at Summit has a gland leak again, MT-1234.", "Насос Н-012 опять течёт, ёлка",
                 "MT-4471の件で東京に行きます", "mixed 東京 tokyo", ""]:
        assert distinct_stems(text) == set(index_text(text).split()), text


QUESTIONS = [QUESTION, "MT-1234 ticket for the boiler", "ticket MT ticket 1234 MT-1234 Lake", "October 8 boiler",
             "2026-10-08", "nothing held here", "MT-1234/MT-900, raised Noted", "Summit Priya press slow"]


def test_a_turns_clauses_are_every_clause_all_of_whose_stems_it_holds(memory):
    """`covered` looks up the stems a turn holds; it equals testing every clause in turn, for
    one-word clauses, phrases (`mt 1234`) and a stem in both."""
    reader = MemoryReader(memory)
    reader.refresh()
    rows = reader.store.rows(reader.view.ids.tolist())
    for question in QUESTIONS:
        clauses = hybrid_search.QueryClauses.of(reader, question)
        assert clauses.phrases or "MT" not in question, "a phrase clause is tested"
        for r in rows.values():
            held = held_stems(r.text, r.ts, clauses.stems)
            expected = sum(1 << i for i, c in enumerate(clauses.clauses) if held and held.issuperset(c))
            assert clauses.covered(held) == expected, (question, r.text)
    reader.close()


def _held_by_both_paths(memory) -> tuple[MemoryReader, list[tuple[dict, dict]]]:
    """For each question: the held stems the reader gives every row, and those of its text."""
    reader = MemoryReader(memory)
    reader.refresh()
    mask = reader.filter_mask(None, None)
    rows = reader.store.rows(reader.view.ids.tolist())
    out = []
    for question in QUESTIONS:
        stems = hybrid_search.QueryClauses.of(reader, question).stems
        out.append((reader.held_stems(rows, stems, mask), {rid: held_stems(r.text, r.ts, stems) for rid, r in rows.items()}))
    return reader, out


def test_the_snapshot_holds_each_turns_stems_and_a_recall_reads_them_instead_of_stemming(memory, monkeypatch):
    from shared.engine import memory_reader

    reader, both = _held_by_both_paths(memory)
    assert reader.view.base.stem_ids is not None and reader.view.n_base == reader.view.n
    assert all(snapshot == texts for snapshot, texts in both) and any(any(h) for h, _ in both)
    monkeypatch.setattr(memory_reader, "held_stems", lambda *_: pytest.fail("stemmed a turn's text"))
    rows = reader.store.rows(reader.view.ids.tolist())
    reader.held_stems(rows, frozenset({"boiler", "aiko", "octob"}), reader.filter_mask(None, None))
    reader.close()


def test_turns_after_the_snapshot_and_a_snapshot_without_stems_are_stemmed_from_their_text(tmp_path, embedder):
    import json
    import struct

    from shared.engine.vector_file import VECTOR_FILE

    src, memory = _three_conversations(tmp_path, embedder)
    write_conversation(src, "later", ["a boiler turn after the snapshot", "Summit"])
    index_tree(tmp_path / "home", src, embedder)  # too few rows for a new snapshot
    reader, both = _held_by_both_paths(memory)
    assert reader.view.n > reader.view.n_base > 0 and reader.view.base.stem_ids is not None
    assert all(snapshot == texts for snapshot, texts in both)
    reader.close()
    # The file as the previous release wrote it: its header names no stems.
    raw = bytearray((memory / VECTOR_FILE).read_bytes())
    (hlen,) = struct.unpack("<I", raw[8:12])
    header = json.loads(raw[12 : 12 + hlen])
    del header["stems"]
    blob = json.dumps(header).encode()
    raw[8:12], raw[12 : 12 + hlen] = struct.pack("<I", len(blob)), blob.ljust(hlen)
    (memory / VECTOR_FILE).write_bytes(bytes(raw))
    reader, both = _held_by_both_paths(memory)
    assert reader.view.base.stem_ids is None and all(snapshot == texts for snapshot, texts in both)
    reader.close()
    store = MemoryStore.open(memory)
    store.publish_vectors()  # not forced: the missing stems alone make it rewrite
    store.close()
    reader, both = _held_by_both_paths(memory)
    assert reader.view.base.stem_ids is not None and reader.view.n_base == reader.view.n
    assert all(snapshot == texts for snapshot, texts in both)
    reader.close()


def test_a_memory_written_before_stored_stems_gets_them_and_a_forget_removes_them(tmp_path, embedder):
    src, memory = _three_conversations(tmp_path, embedder)
    store = MemoryStore.open(memory)
    store.conn.execute("DROP TABLE chunk_stems")  # as the previous release left a memory
    store.publish_vectors(force=True)  # the snapshot stems the turns and stores what it stemmed
    stored = dict(store.conn.execute("SELECT row_id, stems FROM chunk_stems").fetchall())
    rows = store.rows(list(stored))
    assert len(stored) == 6 and stored == {rid: turn_stems(fts_text(r.text, r.ts)) for rid, r in rows.items()}
    store.close()
    reader, both = _held_by_both_paths(memory)
    assert reader.view.base.stem_ids is not None and all(snapshot == texts for snapshot, texts in both)
    reader.close()
    assert forget_session(tmp_path / "home", "c1") == 2
    store = MemoryStore.open(memory)
    left = store.conn.execute("SELECT stems FROM chunk_stems").fetchall()
    assert len(left) == 4 and not any("c1" in s for (s,) in left), "the forgotten turns' stems are gone"
    store.close()


def test_a_memory_of_an_older_analyzer_keeps_its_snapshot_through_index_runs_that_change_nothing(tmp_path, embedder,
                                                                                                   monkeypatch):
    """Its snapshot cannot carry stems (they would be another analyzer's) until its next write
    re-analyses it: an index run with nothing to do must not rewrite the whole file each time."""
    from shared.engine import store as store_module

    src, memory = _three_conversations(tmp_path, embedder)
    store = MemoryStore.open(memory)
    store.conn.execute("UPDATE meta SET value='snowball-en-ru-2' WHERE key='fts_analyzer'")
    store.publish_vectors(force=True)  # as such a memory's snapshot is: no stems
    store.close()
    written = []
    write = store_module.write_vector_file
    monkeypatch.setattr(store_module, "write_vector_file", lambda *a: written.append(a) or write(*a))
    for _ in range(2):
        index_tree(tmp_path / "home", src, embedder)
    assert not written, "a run that changed nothing rewrote the snapshot"
    write_conversation(src, "c9", ["a new turn", "and its answer"])
    index_tree(tmp_path / "home", src, embedder)  # the write re-analyses it: now the stems come
    reader = MemoryReader(memory)
    reader.refresh()
    assert written and reader.view.base.stem_ids is not None
    reader.close()


def test_a_forget_removes_stems_a_release_without_them_left_behind(tmp_path, embedder):
    """A release that knows no `chunk_stems` (a rollback, an old pod in a rolling upgrade) deletes
    rows and leaves their stems; the next forget by this release leaves none of them on disk."""
    src, memory = _three_conversations(tmp_path, embedder)
    write_conversation(src, "secret", ["the Zanzibarquux plan", "ok"])
    index_tree(tmp_path / "home", src, embedder)
    needle = stem("zanzibarquux").encode()
    store = MemoryStore.open(memory)
    with store.lock:  # as the older release forgets "secret": chunks and their index, not the stems
        store.conn.execute("DELETE FROM chunks WHERE session_id='secret'")
    store.close()
    (src / "secret.funes.jsonl").unlink()
    assert forget_session(tmp_path / "home", "c1") == 2  # this release's next forget
    store = MemoryStore.open(memory)
    orphans = store.conn.execute("SELECT COUNT(*) FROM chunk_stems WHERE row_id NOT IN (SELECT row_id FROM chunks)").fetchone()[0]
    store.close()
    assert orphans == 0
    assert not [p for p in memory.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_stems_of_another_analyzer_are_not_read(tmp_path, embedder, monkeypatch):
    from shared.engine import memory_reader

    _, memory = _three_conversations(tmp_path, embedder)
    stemmed = []
    monkeypatch.setattr(memory_reader, "ANALYZER", "some-later-analyzer")
    monkeypatch.setattr(memory_reader, "held_stems", lambda text, ts, stems: stemmed.append(text) or held_stems(text, ts, stems))
    reader, both = _held_by_both_paths(memory)
    assert reader.view.base.stem_ids is not None and all(snapshot == texts for snapshot, texts in both)
    assert len(stemmed) == 6 * len(QUESTIONS), "every turn stemmed from its text"
    reader.close()


def test_a_judged_turn_forgotten_before_it_is_read_does_not_fail_the_recall(memory, embedder):
    # A forget can delete rows between the search and the SQLite read of its hits: the press
    # turns are judged for their conversations (they hold "ticket" and "raised") and vanish.
    engine = Engine(embedder=embedder)
    store = engine.reader(memory).store
    rows = store.rows
    store.rows = lambda ids: {rid: r for rid, r in rows(ids).items() if "press" not in r.text}
    try:
        first = parse_recall(engine.recall(memory, QUESTION, RecallParams(k=3)))[0]
    finally:
        del store.rows
    assert first.text in RIGHT, first.text


def test_a_forget_leaves_no_turn_text_in_the_search_caches(memory, embedder):
    engine = Engine(embedder=embedder)
    engine.recall(memory, QUESTION, RecallParams(k=3))
    # Turns the snapshot holds are judged by their stored stems; one after it is stemmed from its text.
    held_stems(RIGHT[0], "2026-10-08T10:00:00Z", frozenset({"boiler"}))
    assert distinct_stems.cache_info().currsize > 0
    engine.forget(memory)
    assert distinct_stems.cache_info().currsize == 0 and engine.open_readers == 0
    assert stem.cache_info().currsize == 0  # nor the turns' words
    assert _query_clauses.cache_info().currsize == 0  # nor the question


def _three_conversations(tmp_path, embedder):
    src, home = tmp_path / "src", tmp_path / "home"
    for i in range(3):
        write_conversation(src, f"c{i}", [f"turn one of c{i}", f"turn two of c{i}"])
    index_tree(home, src, embedder)
    return src, memory_dir(home)


def _codes_by_session(reader: MemoryReader) -> dict[str, set[int]]:
    view = reader.view
    rows = reader.store.rows(view.ids.tolist())
    out: dict[str, set[int]] = {}
    for rid, code in zip(view.ids.tolist(), reader.sessions_of(view.ids.tolist(), reader.filter_mask(None, None)).tolist()):
        out.setdefault(rows[rid].session_id, set()).add(code)
    return out


def test_the_snapshot_maps_each_rows_conversation_so_a_first_recall_reads_no_session_ids(tmp_path, embedder, monkeypatch):
    _, memory = _three_conversations(tmp_path, embedder)
    store = MemoryStore.open(memory)
    store.publish_vectors(force=True)
    store.close()
    reader = MemoryReader(memory)
    reader.refresh()
    try:
        # A 40k-conversation memory took ~0.3 s here, holding the reader's SQLite connection.
        monkeypatch.setattr(reader.store, "sessions_upto", lambda *_: pytest.fail("read session ids from SQLite"))
        codes = _codes_by_session(reader)
        assert reader.view.base is not None and reader.view.n_base == reader.view.n
        assert all(len(c) == 1 and 0 not in c for c in codes.values()) and len({*map(min, codes.values())}) == 3
    finally:
        reader.close()


def test_a_snapshot_written_before_conversation_codes_still_reads_and_is_rewritten_with_them(tmp_path, embedder):
    import json
    import struct

    from shared.engine.vector_file import VECTOR_FILE

    _, memory = _three_conversations(tmp_path, embedder)
    store = MemoryStore.open(memory)
    store.publish_vectors(force=True)
    store.close()
    # The file as the previous release wrote it: its header names no conversation section.
    raw = bytearray((memory / VECTOR_FILE).read_bytes())
    (hlen,) = struct.unpack("<I", raw[8:12])
    header = json.loads(raw[12 : 12 + hlen])
    del header["offsets"]["conversation"]
    blob = json.dumps(header).encode()
    raw[8:12], raw[12 : 12 + hlen] = struct.pack("<I", len(blob)), blob.ljust(hlen)
    (memory / VECTOR_FILE).write_bytes(bytes(raw))
    reader = MemoryReader(memory)
    reader.refresh()
    try:
        assert reader.view.base is not None and reader.view.base.conversation is None
        from_sqlite = _codes_by_session(reader)
    finally:
        reader.close()
    store = MemoryStore.open(memory)
    store.publish_vectors()  # not forced: the missing codes alone make it rewrite
    store.close()
    reader = MemoryReader(memory)
    reader.refresh()
    try:
        assert reader.view.base.conversation is not None
        assert _codes_by_session(reader) == from_sqlite
    finally:
        reader.close()
