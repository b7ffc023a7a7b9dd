"""A model change re-embeds a memory beside the live one and switches at once, never mixed."""

from __future__ import annotations

import pytest

from shared.engine.api import Engine
from shared.engine.embedder import (E5_MODEL_ID, E5_Q4_MODEL_ID, MINILM_MODEL_ID, EmbedderSettings, OnnxEmbedder, embedder_for_stamp,
                                    minilm_spec)
from shared.engine.hybrid_search import RecallParams
from shared.engine.index_run import index_tree, memory_dir
from shared.engine.reembed import STAGING, reembed_memory, stamp_of
from shared.engine.store import MemoryStore
from shared.tenant_paths import TenantPaths
from tests.conftest import CountingEmbedder, write_conversation

CONVERSATIONS = {
    "pump": ["Morning, anything on the pump?", "The pump P-301 at the North site leaks at the gland.",
             "Who fixes it?", "Marina replaces the seal on Thursday."],
    "boiler": ["Boiler news?", "Котёл на Южном складе перегревается после обеда, датчик показывает 95 градусов.",
               "Кто смотрит?", "Олег проверит в пятницу."],
}


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> OnnxEmbedder:
    return OnnxEmbedder(minilm_spec(EmbedderSettings(embed_cache_dir=tmp_path_factory.mktemp("models"))))


@pytest.fixture()
def old_memory(tmp_path, minilm) -> TenantPaths:
    paths = TenantPaths(tmp_path / "0123456789abcdef01234567")
    for cid, messages in CONVERSATIONS.items():
        write_conversation(paths.src, cid, messages)
    index_tree(paths.root, paths.src, minilm)
    return paths


def test_the_old_memory_answers_with_its_own_model_until_the_new_one_is_live(old_memory, embedder):
    assert embedder.spec.model_id == E5_MODEL_ID  # the configured default
    engine = Engine(embedder=embedder)
    seen_during_build: list[tuple[str, str]] = []
    progress: list[tuple[int, int]] = []

    def on_progress(done: int, total: int) -> None:
        progress.append((done, total))
        if done == 0:  # mid-build: the live memory is untouched, a write and a deletion land
            reader = engine.reader(memory_dir(old_memory.root))
            seen_during_build.append((reader.model_id, engine.recall(memory_dir(old_memory.root), "P-301 gland leak", RecallParams(k=1))))
            write_conversation(old_memory.src, "press", ["The press M-207 belt slips; Anna orders a new belt."])
            (old_memory.src / "boiler.funes.jsonl").unlink()

    chunks = reembed_memory(old_memory.root, old_memory.src, embedder, progress=on_progress)

    assert seen_during_build[0][0] == MINILM_MODEL_ID and "P-301" in seen_during_build[0][1]
    assert progress[-1][0] == progress[-1][1] > 0
    assert stamp_of(old_memory.root) == (E5_MODEL_ID, embedder.dim)
    assert not (old_memory.root / STAGING).exists()
    memory = memory_dir(old_memory.root)
    assert "M-207" in engine.recall(memory, "press belt slipping", RecallParams(k=1))  # written during the build
    assert "Котёл" not in engine.recall(memory, "перегрев котла", RecallParams(k=3))  # deleted during the build
    assert engine.reader(memory).model_id == E5_MODEL_ID and chunks == 4 + 1


def test_a_memory_of_the_earlier_4bit_e5_stamp_answers_with_it_and_then_re_embeds_in_integers(tmp_path, embedder):
    """The upgrade users make: memories built before e5 computed in integers."""
    paths = TenantPaths(tmp_path / "0123456789abcdef01234567")
    for cid, messages in CONVERSATIONS.items():
        write_conversation(paths.src, cid, messages)
    index_tree(paths.root, paths.src, embedder_for_stamp(E5_Q4_MODEL_ID))
    engine = Engine(embedder=embedder)
    assert engine.reader(memory_dir(paths.root)).model_id == E5_Q4_MODEL_ID
    assert "Олег" in engine.recall(memory_dir(paths.root), "кто проверит перегрев котла", RecallParams(k=2))

    reembed_memory(paths.root, paths.src, embedder)
    assert stamp_of(paths.root) == (E5_MODEL_ID, embedder.dim)
    assert "Олег" in engine.recall(memory_dir(paths.root), "кто проверит перегрев котла", RecallParams(k=2))


def test_a_re_embed_aborted_at_the_switch_leaves_the_live_memory_as_it_was(old_memory, embedder):
    commits = []

    def lose_the_lock_at_the_switch(point: str) -> None:
        commits.extend([point] if point == "before_commit" else [])
        if len(commits) == 2:  # the build's commit passed; the switch is the next one
            raise RuntimeError("index lock lost")

    with pytest.raises(RuntimeError, match="lock lost"):
        reembed_memory(old_memory.root, old_memory.src, embedder, checkpoint=lose_the_lock_at_the_switch)
    assert stamp_of(old_memory.root)[0] == MINILM_MODEL_ID
    assert "P-301" in Engine(embedder=embedder).recall(memory_dir(old_memory.root), "P-301 leak", RecallParams(k=1))
    reembed_memory(old_memory.root, old_memory.src, embedder)  # the next attempt starts over and switches
    assert stamp_of(old_memory.root)[0] == E5_MODEL_ID and not (old_memory.root / STAGING).exists()


def test_a_memory_is_refused_by_the_cli_indexer_until_re_embedded(old_memory, embedder):
    from shared.engine.store import ModelMismatch

    with pytest.raises(ModelMismatch):
        index_tree(old_memory.root, old_memory.src, embedder)
    reembed_memory(old_memory.root, old_memory.src, embedder)
    index_tree(old_memory.root, old_memory.src, embedder)  # now a plain incremental run


async def test_the_indexer_re_embeds_a_stale_tenant_and_its_pending_count_falls_when_it_is_done(old_memory, redis_url):
    import redis.asyncio as aioredis
    from prometheus_client import REGISTRY

    from services.indexer import redis_keys as keys
    from services.indexer.index_job import EmbeddedIndexJob
    from services.indexer.index_scheduler import IndexScheduler
    from services.indexer.reembed_job import schedule_stale_tenants
    from shared.redis_lock import RedisLock

    job = EmbeddedIndexJob(timeout_s=900)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.delete(keys.DUE, keys.REEMBED_PENDING)
        assert await schedule_stale_tenants(client, old_memory.root.parent, job.embedder) == 1
        assert await client.zscore(keys.DUE, old_memory.uhash) is not None
        assert REGISTRY.get_sample_value("recall_reembed_pending_memories") == 1
        before = REGISTRY.get_sample_value("recall_reembeds_total", {"outcome": "ok"})
        scheduler = IndexScheduler(client, job, old_memory.root.parent, debounce_s=0, lock_ttl_s=30, concurrency=1)
        lock = RedisLock(client, keys.index_lock(old_memory.uhash), 30)
        assert await lock.acquire()
        await scheduler._run(old_memory.uhash, lock)  # the due tenant's run, as a worker takes it
        assert stamp_of(old_memory.root) == (E5_MODEL_ID, job.embedder.dim)
        assert REGISTRY.get_sample_value("recall_reembeds_total", {"outcome": "ok"}) == before + 1
        assert REGISTRY.get_sample_value("recall_reembed_progress_ratio", {"user_hash": old_memory.uhash}) is None
        # Shared by every worker: the run that re-embedded removed it, whichever worker swept it.
        assert not await client.sismember(keys.REEMBED_PENDING, old_memory.uhash)
        assert await schedule_stale_tenants(client, old_memory.root.parent, job.embedder) == 0
        assert REGISTRY.get_sample_value("recall_reembed_pending_memories") == 0
    finally:
        await client.delete(keys.DUE, keys.REEMBED_PENDING)
        await client.aclose()


def _stop_at_the_second_commit():
    commits = []

    def checkpoint(point: str) -> None:
        commits.extend([point] if point == "before_commit" else [])
        if len(commits) == 2:
            raise RuntimeError("index lock yielded to a forget")

    return checkpoint


@pytest.fixture()
def half_re_embedded(old_memory, embedder, monkeypatch) -> TenantPaths:
    """A stale memory whose re-embed was stopped after committing one conversation (of two)."""
    import shared.engine.index_run as index_run

    monkeypatch.setattr(index_run, "COMMIT_SLICE", 4)  # each conversation is a slice of its own
    with pytest.raises(RuntimeError, match="yielded"):
        reembed_memory(old_memory.root, old_memory.src, embedder, checkpoint=_stop_at_the_second_commit())
    assert stamp_of(old_memory.root)[0] == MINILM_MODEL_ID
    assert stamp_of(old_memory.root / STAGING)[0] == E5_MODEL_ID
    return old_memory


def test_a_stopped_re_embed_goes_on_from_its_committed_slices(half_re_embedded, embedder):
    counting = CountingEmbedder(embedder)
    chunks = reembed_memory(half_re_embedded.root, half_re_embedded.src, counting)
    assert chunks == 8 and counting.embedded == 4, "the second attempt embeds only the other conversation"
    assert stamp_of(half_re_embedded.root)[0] == E5_MODEL_ID and not (half_re_embedded.root / STAGING).exists()
    memory = memory_dir(half_re_embedded.root)
    assert "P-301" in Engine(embedder=embedder).recall(memory, "P-301 gland leak", RecallParams(k=1))
    assert "Котёл" in Engine(embedder=embedder).recall(memory, "перегрев котла", RecallParams(k=1))


def test_a_forget_during_a_re_embed_reaches_both_memories_without_waiting_for_it(half_re_embedded, embedder):
    from shared.engine.reembed import remove_deleted_sources

    for word in (b"gland", "Котёл".encode()):  # on disk in the live memory and, for one, in the staging one
        assert any(word in f.read_bytes() for f in half_re_embedded.root.rglob("*") if f.is_file())
    (half_re_embedded.src / "pump.funes.jsonl").unlink()
    (half_re_embedded.src / "boiler.funes.jsonl").unlink()
    counting = CountingEmbedder(embedder)
    remove_deleted_sources(half_re_embedded.root, half_re_embedded.src, counting)

    assert counting.embedded == 0 and stamp_of(half_re_embedded.root)[0] == MINILM_MODEL_ID, "no re-embed first"
    for home in (half_re_embedded.root, half_re_embedded.root / STAGING):
        assert MemoryStore.open(memory_dir(home)).counts()[0] == 0
    leftovers = [f for f in half_re_embedded.root.rglob("*") if f.is_file()
                 and (b"gland" in f.read_bytes() or "Котёл".encode() in f.read_bytes())]
    assert leftovers == [], "the forgotten text is on no file of either memory"


async def test_the_indexer_forgets_in_a_stale_memory_without_re_embedding_it(old_memory):
    from services.indexer.index_job import EmbeddedIndexJob

    job = EmbeddedIndexJob(timeout_s=900)
    (old_memory.src / "pump.funes.jsonl").unlink()
    await job.remove_deleted(old_memory)
    assert stamp_of(old_memory.root)[0] == MINILM_MODEL_ID, "the re-embed is left to the next index run"
    assert "P-301" not in Engine(embedder=job.embedder).recall(memory_dir(old_memory.root), "P-301 gland leak",
                                                              RecallParams(k=3))


def test_a_forget_during_a_re_embed_scrubs_a_conversation_rewritten_since_from_the_staging_memory(half_re_embedded, embedder):
    from shared.engine.reembed import remove_deleted_sources

    # The forgotten conversation was started anew (a snapshot accepted after the forget) before
    # the forget's index run: its path is there, its old text is not.
    write_conversation(half_re_embedded.src, "boiler", ["The boiler was replaced last week; all fine now."])
    remove_deleted_sources(half_re_embedded.root, half_re_embedded.src, embedder)

    leftovers = [f for f in half_re_embedded.root.rglob("*") if f.is_file() and "Котёл".encode() in f.read_bytes()]
    assert leftovers == [], "the forgotten text is on no file of either memory"
    chunks = reembed_memory(half_re_embedded.root, half_re_embedded.src, embedder)
    assert chunks == 5 and "replaced last week" in Engine(embedder=embedder).recall(
        memory_dir(half_re_embedded.root), "boiler replaced", RecallParams(k=1))


def test_a_forget_removes_what_a_staging_memory_killed_mid_removal_left(half_re_embedded, embedder):
    from shared.engine.reembed import remove_deleted_sources

    # kill -9 while `.reembed/` was being deleted (after a switch, or a stale attempt's): its
    # database went first; its snapshot still holds the conversation's stems.
    staging = memory_dir(half_re_embedded.root / STAGING)
    (staging / "chunks.sqlite3").unlink()
    stem = "перегрев".encode()  # of "перегревается", in the snapshot's stem vocabulary
    assert stem in (staging / "vectors.i8").read_bytes()
    (half_re_embedded.src / "boiler.funes.jsonl").unlink()
    remove_deleted_sources(half_re_embedded.root, half_re_embedded.src, embedder)

    leftovers = [f for f in half_re_embedded.root.rglob("*") if f.is_file() and stem in f.read_bytes()]
    assert leftovers == [], "the forgotten text is on no file of either memory"
