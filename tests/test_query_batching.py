"""Concurrent query embeddings share model runs (shared/engine/query_batching.py): the batching
rules with a run the test holds open, then the real e5 model under concurrent callers."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from shared.engine.embedder import EmbedderSettings, OnnxEmbedder, e5_embedder
from shared.engine.query_batching import QueryBatcher
from tests.conftest import wait_until


class HeldRun:
    """A model stand-in whose first run waits until the test lets it end; records every batch."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.batches: list[list[str]] = []
        self.started = threading.Event()
        self.release = threading.Event()
        self.fail_on = fail_on

    def __call__(self, texts: list[str]) -> np.ndarray:
        self.batches.append(list(texts))
        if len(self.batches) == 1:
            self.started.set()
            assert self.release.wait(10)
        if self.fail_on in texts:
            raise RuntimeError("model failed")
        return np.array([[float(len(t))] for t in texts], np.float32)


def start_callers(batcher: QueryBatcher, texts: list[str]) -> list:
    """One caller thread per text, each already asking (the pool ends once they all return)."""
    pool = ThreadPoolExecutor(len(texts))
    futures = [pool.submit(batcher.embed, t) for t in texts]
    pool.shutdown(wait=False)
    return futures


def test_a_lone_query_runs_at_once_in_a_run_of_its_own():
    run = HeldRun()
    run.release.set()
    batcher = QueryBatcher(run, lanes=1)
    assert batcher.embed("abc")[0] == 3.0 and run.batches == [["abc"]]


def test_queries_arriving_while_the_model_runs_share_the_next_run():
    run = HeldRun()
    batcher = QueryBatcher(run, lanes=1)
    first = start_callers(batcher, ["first"])
    assert run.started.wait(10)
    waiting = start_callers(batcher, ["a", "bb", "ccc", "dddd"])
    assert wait_until(lambda: len(batcher._waiting) == 4, 10)
    run.release.set()
    assert [f.result(10)[0] for f in first + waiting] == [5.0, 1.0, 2.0, 3.0, 4.0]
    assert run.batches[0] == ["first"] and sorted(run.batches[1]) == ["a", "bb", "ccc", "dddd"]
    assert (batcher.runs, batcher.queries) == (2, 5)


def test_a_run_takes_at_most_max_batch_queries_and_hands_its_lane_to_the_next_waiting_caller():
    run = HeldRun()
    batcher = QueryBatcher(run, lanes=1, max_batch=3)
    first = start_callers(batcher, ["held"])
    assert run.started.wait(10)
    texts = [f"q{i}" for i in range(7)]
    waiting = start_callers(batcher, texts)
    assert wait_until(lambda: len(batcher._waiting) == 7, 10)
    run.release.set()
    assert [f.result(10)[0] for f in waiting] == [2.0] * 7 and first[0].result(10)[0] == 4.0
    assert [len(b) for b in run.batches] == [1, 3, 3, 1]  # nobody left waiting without a lane


def test_every_lane_runs_at_once_before_anyone_waits():
    lanes = 2
    both_running = threading.Barrier(lanes + 1)

    def run(texts):
        both_running.wait(10)  # breaks (and fails the test) unless two runs are in flight at once
        return np.zeros((len(texts), 1), np.float32)

    batcher = QueryBatcher(run, lanes=lanes)
    calls = start_callers(batcher, ["x", "y"])
    both_running.wait(10)
    assert all(f.result(10).shape == (1,) for f in calls)


def test_a_failed_run_raises_in_every_caller_it_served_and_frees_its_lane():
    run = HeldRun(fail_on="bad")
    batcher = QueryBatcher(run, lanes=1)
    first = start_callers(batcher, ["held"])
    assert run.started.wait(10)
    waiting = start_callers(batcher, ["bad", "fine"])
    assert wait_until(lambda: len(batcher._waiting) == 2, 10)
    run.release.set()
    assert first[0].result(10)[0] == 4.0
    for future in waiting:
        with pytest.raises(RuntimeError, match="model failed"):
            future.result(10)
    assert batcher.embed("later")[0] == 5.0  # the lane came back


@pytest.fixture(scope="module")
def e5_one_lane() -> OnnxEmbedder:
    return e5_embedder(EmbedderSettings(embed_query_lanes=1))


def test_an_e5_query_gets_the_same_vector_alone_and_embedded_beside_concurrent_queries(e5_one_lane):
    queries = ["vault migration codename", "кто отвечает за брак на складе в Твери", "ok",
               "which seal did we order for the pump at the north site and when does it ship"] * 4
    alone = np.stack([e5_one_lane.embed_query(q) for q in queries])
    batcher = e5_one_lane.query_batcher
    runs_before = batcher.runs
    with ThreadPoolExecutor(8) as pool:
        together = np.stack(list(pool.map(e5_one_lane.embed_query, queries)))
    assert np.array_equal(together, alone)
    assert batcher.runs - runs_before < len(queries)  # some of them shared a run


def test_minilm_embeds_each_query_alone_since_its_rows_share_a_scale(tmp_path):
    from shared.engine.embedder import minilm_spec

    assert OnnxEmbedder(minilm_spec(EmbedderSettings(embed_cache_dir=tmp_path))).query_batcher is None


def test_recalls_racing_on_one_memory_find_what_they_find_one_at_a_time(e5_one_lane, tmp_path):
    from shared.engine.api import Engine
    from shared.engine.hybrid_search import RecallParams
    from shared.engine.index_run import index_tree, memory_dir
    from tests.conftest import write_conversation

    facts = ["The pump MT-4471 at the north site leaks again; Igor orders a new seal on Friday.",
             "Отбраковку партии на складе в Твери взял на себя Игорь.",
             "Vault migration codename BLUEHERON, budget 48k, owner Dana.",
             "We picked the 14-inch laptops for the support team, delivery in March.",
             "My sister's wedding is on the 12th of June in Porto."]
    src = tmp_path / "src"
    for i, fact in enumerate(facts):
        write_conversation(src, f"c{i}", [fact, "noted"])
    index_tree(tmp_path, src, e5_one_lane)
    engine = Engine(embedder=e5_one_lane)
    questions = ["which seal does the north pump need", "кто отвечает за брак в Твери", "vault migration budget",
                 "what laptops did we choose", "when is the wedding", "who owns the vault move",
                 "когда закажут уплотнение", "delivery month of the laptops"] * 2
    params = RecallParams(k=3, candidates=8)

    def found(question: str) -> list[int]:
        return [hit.row.row_id for hit in engine.search(memory_dir(tmp_path), question, params)]

    one_at_a_time = [found(q) for q in questions]
    runs_before = e5_one_lane.query_batcher.runs
    with ThreadPoolExecutor(8) as pool:
        racing = list(pool.map(found, questions))
    assert racing == one_at_a_time and all(one_at_a_time)
    assert e5_one_lane.query_batcher.runs - runs_before < len(questions)


class HeldModel:
    """The real e5 behind a one-lane batcher whose first run waits until the test lets it end;
    records the order of model runs and BM25 searches in `events`."""

    def __init__(self, real: OnnxEmbedder, events: list[str]) -> None:
        self.spec, self.dim, self.real, self.events = real.spec, real.dim, real, events
        self.release = threading.Event()
        self.query_batcher = QueryBatcher(self._run, lanes=1)

    def _run(self, texts: list[str]) -> np.ndarray:
        self.events.append("model " + " | ".join(texts))
        if len(self.events) == 1:
            assert self.release.wait(10)
        return np.stack([self.real.embed_query(t) for t in texts])

    def embed_query(self, text: str) -> np.ndarray:
        return self.query_batcher.embed(text)

    def text_log_prob(self, text: str) -> float | None:
        return self.real.text_log_prob(text)


def test_a_search_that_finds_the_query_model_busy_searches_its_words_while_it_waits(e5_one_lane, tmp_path):
    from shared.engine.hybrid_search import RecallParams, recall
    from shared.engine.index_run import index_tree, memory_dir
    from shared.engine.memory_reader import MemoryReader
    from tests.conftest import wait_until, write_conversation

    write_conversation(tmp_path / "src", "c0", ["The pump MT-4471 at the north site leaks again.", "noted"])
    index_tree(tmp_path, tmp_path / "src", e5_one_lane)
    reader = MemoryReader(memory_dir(tmp_path))
    events: list[str] = []
    model = HeldModel(e5_one_lane, events)
    bm25 = reader.store.bm25
    reader.store.bm25 = lambda query, depth: events.append("bm25") or bm25(query, depth)
    try:
        other_call = start_callers(model.query_batcher, ["another call's query"])
        assert wait_until(lambda: events == ["model another call's query"], 10)
        with ThreadPoolExecutor(1) as pool:
            search = pool.submit(recall, reader, model, "which pump leaks", RecallParams(k=1))
            # Its BM25 leg runs while the other call still holds the model's lane.
            assert wait_until(lambda: "bm25" in events, 10), events
            model.release.set()
            hits = search.result(10)
        assert other_call[0].result(10).shape == (e5_one_lane.dim,)
        assert events.index("bm25") < events.index("model which pump leaks")
        assert "MT-4471" in hits[0].row.text
        # With the model free, a search embeds its query first, as it always did.
        events.clear()
        recall(reader, model, "north site", RecallParams(k=1))
        assert events[0] == "model north site"
    finally:
        reader.close()
