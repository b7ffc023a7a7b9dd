"""The dense leg's int8 snapshot: exact top-k after re-scoring, published only whole and never
ahead of SQLite, caught up from SQLite when behind, and free of forgotten rows; a large one's
4-bit first pass returns the same top-k, packed once however many calls race."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from shared.engine import vector_file
from shared.engine.memory_reader import SAMPLE_STRIDE, MemoryReader, largest_positions
from shared.engine.store import MemoryStore
from shared.engine.vector_file import VECTOR_FILE, open_vector_file
from tests.conftest import VECTOR_DIM, clustered_vectors, new_rows


def exact_top(vecs_by_id: dict[int, np.ndarray], q: np.ndarray, k: int) -> list[int]:
    ids = np.array(sorted(vecs_by_id))
    sims = np.stack([vecs_by_id[i] for i in ids]) @ q
    return ids[np.argsort(-sims, kind="stable")[:k]].tolist()


def test_int8_scan_with_rescore_returns_the_exact_top_k(tmp_path):
    memory = tmp_path / "memory"
    store = MemoryStore.create(memory, "test-model", VECTOR_DIM)
    vecs = clustered_vectors(6000, seed=1)
    store.commit_changes(new_rows(vecs, 1), [], {}, [])
    store.publish_vectors()
    reader = MemoryReader(memory)
    reader.refresh()
    assert reader.view.n_base == 6000, "the reader scans the snapshot, not SQLite rows"
    by_id = {i + 1: v for i, v in enumerate(vecs)}
    queries = clustered_vectors(120, seed=2)
    mask = reader.filter_mask(None, None)
    for k in (8, 30, 60):
        for q in queries:
            assert reader.nearest(q, k, mask) == exact_top(by_id, q, k)
    reader.close()
    store.close()


def test_the_sampled_selection_finds_exactly_the_largest_scores_and_the_first_of_ties_whatever_their_order():
    rng = np.random.default_rng(7)
    n = 60000
    scores = rng.standard_normal(n).astype(np.float32)
    stacked = scores.copy()  # every sampled position holds one of the largest: the threshold lands too high
    stacked[::SAMPLE_STRIDE] = np.sort(scores)[-len(stacked[::SAMPLE_STRIDE]):]
    masked = scores.copy()  # a time window: most rows left out
    masked[rng.random(n) < 0.97] = -np.inf
    few = scores[:40]  # fewer rows than the sample needs
    tied = np.round(scores, 1)  # ~60 distinct values: the k-th is shared by hundreds of positions
    for values in (scores, stacked, masked, few, tied, np.sort(scores), np.sort(scores)[::-1]):
        finite = int(np.isfinite(values).sum())
        for k in (1, 64, 120, 500, min(finite, 2000)):
            k = min(k, finite)
            exact = np.sort(np.argsort(-values, kind="stable")[:k])  # of equal values, the first positions
            assert largest_positions(values, k).tolist() == exact.tolist()


def test_reader_catches_up_from_sqlite_and_switches_to_a_newer_snapshot(tmp_path):
    memory = tmp_path / "memory"
    store = MemoryStore.create(memory, "test-model", VECTOR_DIM)
    vecs = clustered_vectors(900, seed=3)
    store.commit_changes(new_rows(vecs[:600], 1), [], {}, [])
    store.publish_vectors(force=True)
    reader = MemoryReader(memory)
    reader.refresh()
    first_snapshot = reader.view.base
    assert first_snapshot.generation == store.generation() and first_snapshot.n == 600

    # Committed but not yet in a snapshot: 300 new rows, 50 removed, some of another harness.
    store.commit_changes(new_rows(vecs[600:], 601, harness="codex"), list(range(1, 51)), {}, [])
    assert open_vector_file(memory, VECTOR_DIM).generation == first_snapshot.generation, "lag below the rewrite threshold"
    reader.refresh()
    assert reader.view.base is first_snapshot and reader.view.n == 900
    alive = {i + 1: v for i, v in enumerate(vecs) if i + 1 > 50}
    q = vecs[10]
    mask = reader.filter_mask(None, None)
    assert reader.nearest(q, 20, mask) == exact_top(alive, q, 20)
    assert not any(reader.passes(r, mask) for r in range(1, 51)), "removed rows never return"
    codex = reader.filter_mask(None, "codex")
    assert set(reader.nearest(q, 400, codex)) == set(range(601, 901))

    held = reader.filter_mask(None, None)  # a search in flight keeps its view
    store.publish_vectors(force=True)
    assert not (memory / f".{VECTOR_FILE}.writing").exists(), "published whole, by rename"
    reader.refresh()
    assert reader.view.base is not first_snapshot and reader.view.n_base == 850
    assert reader.nearest(q, 20, held) == reader.nearest(q, 20, reader.filter_mask(None, None))
    reader.close()
    store.close()


def test_forgetting_rewrites_the_snapshot_without_the_forgotten_rows(tmp_path):
    memory = tmp_path / "memory"
    store = MemoryStore.create(memory, "test-model", VECTOR_DIM)
    store.commit_changes(new_rows(clustered_vectors(120, seed=4), 1), [], {}, [])
    store.publish_vectors()
    store.commit_changes([], list(range(1, 7)), {}, [])
    store.purge_deleted_text()
    snapshot = open_vector_file(memory, VECTOR_DIM)
    assert snapshot.generation == store.generation()
    assert not set(range(1, 7)) & set(snapshot.ids.tolist())
    store.close()


def test_a_snapshot_of_another_memory_is_never_used(tmp_path):
    """A directory swap (re-embedding) can put another memory's snapshot beside the SQLite file
    a reader still holds: the reader keeps to its own memory's rows."""
    stores = {}
    for name, seed in (("a", 5), ("b", 6)):
        stores[name] = MemoryStore.create(tmp_path / name, "test-model", VECTOR_DIM)
        stores[name].commit_changes(new_rows(clustered_vectors(300, seed=seed), 1), [], {}, [])
        stores[name].publish_vectors()
    reader = MemoryReader(tmp_path / "a")
    reader.refresh()
    q = clustered_vectors(1, seed=5)[0]
    before = reader.nearest(q, 10, reader.filter_mask(None, None))
    (tmp_path / "a" / VECTOR_FILE).unlink()
    (tmp_path / "b" / VECTOR_FILE).rename(tmp_path / "a" / VECTOR_FILE)
    stores["a"].commit_changes([], [before[-1]], {}, [])  # a new generation makes the reader look again
    reader.refresh()
    assert reader.view.base is None or reader.view.base.memory_id == stores["a"].meta()["memory_id"]
    assert reader.nearest(q, 9, reader.filter_mask(None, None)) == before[:9]
    reader.close()
    for store in stores.values():
        store.close()


def _large_snapshot(tmp_path, monkeypatch, n: int = 20000) -> tuple[MemoryStore, dict[int, np.ndarray]]:
    """A memory whose snapshot passes the 4-bit copy's size bar (lowered to its n rows), the
    first half of its rows from one harness and the second from another; each row shares a
    common part, as e5's embeddings do (their mutual cosine is ~0.7). At 20,000 rows the 4-bit
    pass does choose, with its real depth, even for one harness's half (prefilter_depth)."""
    monkeypatch.setattr(vector_file, "PREFILTER_MIN_BYTES", n * VECTOR_DIM)
    monkeypatch.setattr(vector_file, "PACK_AFTER_SCANS", 1)
    common = np.random.default_rng(11).standard_normal(VECTOR_DIM).astype(np.float32)
    vecs = clustered_vectors(n, seed=12) + 1.5 * common / np.linalg.norm(common)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    store = MemoryStore.create(tmp_path / "memory", "test-model", VECTOR_DIM)
    half = n // 2
    store.commit_changes(new_rows(vecs[:half], 1) + new_rows(vecs[half:], half + 1, harness="cli"), [], {}, [])
    store.publish_vectors()
    return store, {i + 1: v for i, v in enumerate(vecs)}


def test_a_large_snapshot_is_scanned_in_four_bits_first_and_still_returns_the_exact_top_k(tmp_path, monkeypatch):
    store, by_id = _large_snapshot(tmp_path, monkeypatch)
    reader = MemoryReader(store.path)
    reader.refresh()
    base = reader.view.base
    assert base.has_prefilter and base.scanner.prefilter is None
    queries = clustered_vectors(100, seed=13) + 1.5 * (base.centre / np.linalg.norm(base.centre))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    mask = reader.filter_mask(None, None)
    before = reader.resident_bytes()
    reader.nearest(queries[0], 8, mask)  # the snapshot's first scans are int8 ones; then it packs
    assert base.scanner.prefilter is not None and base.scanner.packed is None, "the 4-bit copy packed, not the columns"
    assert reader.resident_bytes() > before, "the packed copy counts against the reader cache"
    for k in (8, 30, 60):  # pools of 64, 120 and 240 rows: the 4-bit pass keeps 2048, 2048 and 3840
        assert vector_file.prefilter_depth(max(64, 4 * k), len(by_id)) is not None
        for q in queries:
            assert reader.nearest(q, k, mask) == exact_top(by_id, q, k)
    cli = reader.filter_mask(None, "cli")
    cli_rows = {i: v for i, v in by_id.items() if i > len(by_id) // 2}
    assert vector_file.prefilter_depth(120, len(cli_rows)) is not None
    for q in queries[:30]:
        assert reader.nearest(q, 30, cli) == exact_top(cli_rows, q, 30), "a filter applies before the prefilter chooses"
    reader.close()
    store.close()


def test_a_pool_too_large_for_the_four_bit_pass_is_chosen_by_the_int8_scan_and_stays_exact(tmp_path, monkeypatch):
    store, by_id = _large_snapshot(tmp_path, monkeypatch)
    reader = MemoryReader(store.path)
    reader.refresh()
    mask = reader.filter_mask(None, None)
    queries = clustered_vectors(12, seed=17)
    reader.nearest(queries[0], 8, mask)
    assert reader.view.base.scanner.prefilter is not None
    assert vector_file.prefilter_depth(4 * 600, len(by_id)) is None, "2400 pool rows would need 38400 of 20000"
    for q in queries:
        assert reader.nearest(q, 600, mask) == exact_top(by_id, q, 600)
    reader.close()
    store.close()


def test_equal_vectors_come_back_lowest_row_id_first_before_and_after_the_snapshot(tmp_path):
    vecs = clustered_vectors(2000, seed=1)
    vecs[1000:1300] = vecs[0]  # one text repeated: ids 1 and 1001..1300 hold the same vector
    store = MemoryStore.create(tmp_path / "memory", "test-model", VECTOR_DIM)
    store.commit_changes(new_rows(vecs, 1), [], {}, [])
    reader = MemoryReader(store.path)
    reader.refresh()
    exact = [1, *range(1001, 1010)]
    assert reader.nearest(vecs[0], 10, reader.filter_mask(None, None)) == exact, "rows after any snapshot"
    store.publish_vectors(force=True)
    reader.refresh()
    assert reader.view.n_base == 2000
    assert reader.nearest(vecs[0], 10, reader.filter_mask(None, None)) == exact, "the snapshot's int8 scan"
    reader.close()
    store.close()


def test_the_int8_scores_of_the_prefilters_rows_are_the_full_scans(tmp_path, monkeypatch):
    store, _ = _large_snapshot(tmp_path, monkeypatch, n=3000)
    vf = open_vector_file(store.path, VECTOR_DIM)
    rng = np.random.default_rng(14)
    for _ in range(10):
        q = rng.standard_normal(VECTOR_DIM).astype(np.float32)
        positions = rng.choice(vf.n, 500, replace=False)
        assert np.array_equal(vector_file.approximate_scores_at(vf, q, positions),
                              vector_file.approximate_scores(vf, q)[positions])
    store.close()


def test_the_four_bit_copy_is_each_row_minus_the_mean_row_within_half_a_step(tmp_path, monkeypatch):
    store, _ = _large_snapshot(tmp_path, monkeypatch, n=3000)
    vf = open_vector_file(store.path, VECTOR_DIM)
    rows = (vf.rows.astype(np.float32) - vector_file.ROW_OFFSET) * vf.scale[:, None]
    assert np.allclose(vf.centre, rows.mean(axis=0), atol=1e-6)
    low, high = vf.nibbles & 0xF, vf.nibbles >> 4
    values = np.empty(rows.shape, np.float32)
    values[:, 0::2], values[:, 1::2] = low, high
    step = np.repeat(vf.nibble_scale, vector_file.NIBBLE_BLOCK, axis=1)
    error = np.abs((values - 8) * step + vf.centre - rows)
    assert (error <= step / 2 + 1e-6).all()
    store.close()


def test_a_snapshot_under_the_bar_or_written_without_the_copy_scans_in_int8(tmp_path, monkeypatch):
    store, by_id = _large_snapshot(tmp_path, monkeypatch, n=3000)
    monkeypatch.setattr(vector_file, "PREFILTER_MIN_BYTES", 3001 * VECTOR_DIM)
    store.publish_vectors(force=True)
    reader = MemoryReader(store.path)
    reader.refresh()
    assert not reader.view.base.has_prefilter
    q = clustered_vectors(1, seed=15)[0]
    assert reader.nearest(q, 30, reader.filter_mask(None, None)) == exact_top(by_id, q, 30)
    assert reader.view.base.scanner.packed is not None and reader.view.base.scanner.prefilter is None
    reader.close()
    store.close()


def test_concurrent_first_calls_on_a_large_snapshot_all_get_the_exact_top_k_while_one_packs(tmp_path, monkeypatch):
    store, by_id = _large_snapshot(tmp_path, monkeypatch)
    reader = MemoryReader(store.path)
    reader.refresh()
    packs = []
    real_pack = vector_file.Scanner._pack_prefilter

    def slow_pack(self, vf):  # a pack that takes a while, so that other calls arrive meanwhile
        packs.append(vf.n)
        time.sleep(0.3)
        return real_pack(self, vf)

    monkeypatch.setattr(vector_file.Scanner, "_pack_prefilter", slow_pack)
    queries = clustered_vectors(64, seed=16)
    mask = reader.filter_mask(None, None)
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda q: reader.nearest(q, 30, mask), queries))
    assert got == [exact_top(by_id, q, 30) for q in queries]
    assert packs == [len(by_id)], "one caller packs; the others scan meanwhile"
    assert reader.view.base.scanner.prefilter is not None
    reader.close()
    store.close()
