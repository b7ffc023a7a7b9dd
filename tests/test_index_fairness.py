"""Huge pastes do not hold up everyone else's turns: a worker runs one heavy index run at a time
(index_scheduler.py, "Fairness"), and its other slots keep indexing small users; after a heavy
run the worker gives the memory it used back (memory_return.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from services.indexer import redis_keys as keys
from shared.tenant_paths import user_hash
from tests.conftest import conversation_payload, wait_until
from tests.test_indexer import memory_rows, post

# A token per character: every chunk at e5's 512 tokens, ~35 s of CPU per paste on one core
# (docs/benchmarks.md, "index-memory"); two at once take over a minute on two cores.
PASTE_CHARS = 150_000
SMALL_TURN_BOUND_S = 15.0


def cjk_paste(seed: str) -> str:
    return (seed + " " + "漢字の文章" * (PASTE_CHARS // 5))[:PASTE_CHARS]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_small_users_turn_is_searchable_within_seconds_while_two_huge_pastes_index(services, service_env, r):
    services("ingest")
    indexer = services("indexer", RECALL_INDEX_CONCURRENCY="2")
    loaded = rss_mib(indexer.proc.pid)  # the model is loaded before /healthz answers
    huge = ["paste-a", "paste-b"]
    for user in huge:
        post(service_env, conversation_payload(user, "dump", [cjk_paste(user)]))
    assert wait_until(lambda: any(r.exists(keys.index_lock(user_hash(u))) for u in huge), 30), "a huge run started"
    time.sleep(2.0)  # past the debounce: both huge users are due now, and slots were free for both
    started = time.monotonic()
    post(service_env, conversation_payload("small", "chat", ["The KESTREL rollout moves to Thursday."]))
    assert wait_until(lambda: len(memory_rows(service_env, "small")) == 1, SMALL_TURN_BOUND_S), \
        f"a small turn waited more than {SMALL_TURN_BOUND_S} s behind two huge pastes"
    waited = time.monotonic() - started
    assert any(r.exists(keys.index_lock(user_hash(u))) for u in huge), "a huge run was still going meanwhile"
    # Neither huge user is starved: both finish, one after the other.
    assert wait_until(lambda: all(memory_rows(service_env, u) and r.zscore(keys.DUE, user_hash(u)) is None for u in huge),
                      600, 0.5), "both huge pastes were indexed"
    assert all(r.get(keys.pending_bytes(user_hash(u))) is None for u in huge), "a finished run clears what it covered"
    # Each paste's run grew the process by ~270 MB (onnxruntime's arena, glibc's free pages),
    # which it kept for good; now a heavy run hands it back when it ends. What stays is the model's
    # working set: +60-124 MiB across clean-clone runs (124 under a loaded suite), so the bar sits
    # at +200, still under one paste's kept growth.
    assert wait_until(lambda: rss_mib(indexer.proc.pid) < loaded + 200, 10), (loaded, rss_mib(indexer.proc.pid))
    print(f"small turn searchable after {waited:.1f} s; indexer RSS {loaded:.0f} -> {rss_mib(indexer.proc.pid):.0f} MiB")


def test_returning_free_memory_gives_back_what_a_huge_paste_embedding_took(embedder):
    from services.indexer.memory_return import return_free_memory

    pid = os.getpid()
    return_free_memory()
    before = rss_mib(pid)
    embedder.embed([f"{i} " + "漢字の文章" * 110 for i in range(8)])  # 512-token rows: the attention's buffers
    grown = rss_mib(pid)
    assert grown > before + 50, (before, grown)
    return_free_memory()
    assert rss_mib(pid) < before + (grown - before) / 3, (before, grown, rss_mib(pid))


class BlockingJob:
    """Index runs that record their user and hold their slot until released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = asyncio.Event()

    async def run(self, paths, lock=None) -> None:
        self.started.append(paths.uhash)
        await self.release.wait()


@contextlib.asynccontextmanager
async def blocking_scheduler(redis_url: str, data_dir: Path):
    """A scheduler over the suite's Redis whose runs are a BlockingJob (two slots, heavy from
    10 kB); yields (client, job, scheduler, start), `start()` beginning its polling."""
    import redis.asyncio as aioredis

    from services.indexer.index_scheduler import IndexScheduler

    client = aioredis.Redis.from_url(redis_url)
    job = BlockingJob()
    scheduler = IndexScheduler(client, job, data_dir, 0, 30, concurrency=2, heavy_bytes=10_000)
    tasks: list[asyncio.Task] = []
    try:
        yield client, job, scheduler, lambda: tasks.append(asyncio.create_task(scheduler.run_forever()))
    finally:
        job.release.set()
        await scheduler.stop()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.aclose()


async def test_a_light_user_behind_many_waiting_heavy_users_still_gets_the_free_slot(tmp_path, redis_url, r):
    """40 heavy users due before it (more than one page of the due list), one heavy run going: the
    light user is found and run, and the other heavy users wait for the heavy run's turn."""
    from services.indexer.index_scheduler import mark_dirty

    r.flushdb()
    async with blocking_scheduler(redis_url, tmp_path) as (client, job, scheduler, start):
        heavy = [user_hash(f"heavy-{i}") for i in range(40)]
        light = user_hash("light")
        for uh in heavy:
            await mark_dirty(client, uh, None, 0, grown_bytes=450_000)
        await asyncio.sleep(0.01)
        await mark_dirty(client, light, None, 0, grown_bytes=120)
        start()
        assert await asyncio.to_thread(wait_until, lambda: light in job.started, 5), job.started
        assert sorted(job.started) == sorted([heavy[0], light]), "the first heavy user and the light one; the rest wait"
        assert scheduler.heavy == {heavy[0]}
        job.release.set()  # both end: the next heavy user in line runs next
        assert await asyncio.to_thread(wait_until, lambda: heavy[1] in job.started, 5), job.started
        assert r.get(keys.pending_bytes(heavy[0])) is None and r.get(keys.pending_bytes(light)) is None


async def test_bytes_written_during_a_run_stay_for_the_next_one(tmp_path, redis_url, r):
    """A paste that lands while the user's light run goes makes its next run heavy: a run clears
    only the bytes it saw at its start."""
    from services.indexer.index_scheduler import mark_dirty

    r.flushdb()
    async with blocking_scheduler(redis_url, tmp_path) as (client, job, scheduler, start):
        uh = user_hash("writer")
        await mark_dirty(client, uh, None, 0, grown_bytes=300)
        start()
        assert await asyncio.to_thread(wait_until, lambda: uh in job.started, 5)
        assert not scheduler.heavy
        await mark_dirty(client, uh, None, 0, grown_bytes=450_000)
        first, job.release = job.release, asyncio.Event()
        first.set()  # the first run ends; the second waits on the new event
        assert await asyncio.to_thread(wait_until, lambda: job.started.count(uh) == 2, 5), job.started
        assert scheduler.heavy == {uh}
        assert r.get(keys.pending_bytes(uh)) == "450000"
        job.release.set()
        assert await asyncio.to_thread(wait_until, lambda: not scheduler.running and r.zscore(keys.DUE, uh) is None, 5)
        assert r.get(keys.pending_bytes(uh)) is None
