"""A memory whose files were damaged or lost (a fault trial, round 16): the derived files are
rebuilt from the tenant's sources, a forget reaches the text they held, a snapshot changed in
place under a live reader is let go instead of read past its end (SIGBUS would kill every
tenant's searches), and a tenant with conversations but no memory is never told it has none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.engine.api import Engine, chunk_count
from shared.engine.hybrid_search import RecallParams
from shared.engine.index_run import index_tree
from shared.engine.reembed import remove_deleted_sources
from shared.engine.store import DB_NAME, FTS_DIR, MemoryDamaged, MemoryStore, MemoryUnusable
from shared.engine.vector_file import VECTOR_FILE
from shared.index_requests import DUE
from shared.recall_answer_format import NO_MEMORY, UNAVAILABLE
from shared.tenant_paths import TenantPaths
from tests.conftest import call_recall, mint, write_conversation

USER = "damaged@example.com"
GASKET = ["The GSK-4471 gasket on pump P-12 leaks at the flange.", "Replace GSK-4471 with the PTFE version on Friday."]
VALVE = ["Valve V-808 sticks when the line is cold.", "Heat-trace V-808 before the morning start."]


@pytest.fixture
def tenant(tmp_path, embedder) -> TenantPaths:
    paths = TenantPaths.for_user(tmp_path, USER)
    write_conversation(paths.src, "gasket", GASKET)
    write_conversation(paths.src, "valve", VALVE)
    index_tree(paths.root, paths.src, embedder)
    return paths


def garble_bm25_index(memory: Path) -> None:
    (memory / FTS_DIR / "meta.json").write_text("{")


def cut_bm25_index(memory: Path) -> None:
    meta = memory / FTS_DIR / "meta.json"
    meta.write_bytes(meta.read_bytes()[: meta.stat().st_size // 2])  # its content quotes "docstore_blocksize"


def cut_bm25_segment(memory: Path) -> None:
    biggest = max((p for p in (memory / FTS_DIR).iterdir() if p.suffix not in (".json", ".lock")), key=lambda p: p.stat().st_size)
    os.truncate(biggest, biggest.stat().st_size // 2)  # tantivy: "Footer magic byte mismatch. File corrupted"


def lose_bm25_index(memory: Path) -> None:
    (memory / FTS_DIR / "meta.json").unlink()  # tantivy would start an empty index in its place


def cut_database(memory: Path) -> None:
    os.truncate(memory / DB_NAME, 100)


def texts_on_disk(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file())


@pytest.mark.parametrize("damage", [garble_bm25_index, cut_bm25_index, cut_bm25_segment, lose_bm25_index, cut_database])
def test_the_next_index_run_rebuilds_a_damaged_memory_from_its_sources(tenant, embedder, damage):
    before = chunk_count(tenant.memory)
    damage(tenant.memory)
    with pytest.raises(MemoryDamaged):
        MemoryStore.open(tenant.memory)
    index_tree(tenant.root, tenant.src, embedder)
    assert chunk_count(tenant.memory) == before
    hits = Engine(embedder=embedder).search(tenant.memory, "GSK-4471 gasket", RecallParams(k=1))
    assert "GSK-4471" in hits[0].row.text


@pytest.mark.parametrize("damage", [garble_bm25_index, cut_database])
def test_forgetting_a_conversation_of_a_damaged_memory_leaves_none_of_its_text(tenant, embedder, damage):
    tenant.transcript("gasket").unlink()  # a forget deletes the source first, then the rows
    damage(tenant.memory)
    remove_deleted_sources(tenant.root, tenant.src, embedder)
    assert b"GSK-4471" not in texts_on_disk(tenant.root)
    hits = Engine(embedder=embedder).search(tenant.memory, "valve V-808", RecallParams(k=1))
    assert "V-808" in hits[0].row.text  # the rest of the memory came back


SEARCH_AFTER_TRUNCATION = r"""
import os, sys
from pathlib import Path
from shared.engine.api import Engine
from shared.engine.hybrid_search import RecallParams
memory = Path(sys.argv[1])
engine = Engine()
params = RecallParams(k=1)
for _ in range(20):  # hot: the snapshot's own packed session, and the mapped rows before it
    engine.search(memory, "GSK-4471 gasket", params)
os.truncate(memory / "vectors.i8", 200)  # a copy or restore over the live file
print(engine.search(memory, "GSK-4471 gasket", params)[0].row.text)
"""


def test_a_snapshot_truncated_in_place_under_a_live_reader_is_let_go_not_read(tenant):
    assert (tenant.memory / VECTOR_FILE).stat().st_size > 200
    done = subprocess.run([sys.executable, "-c", SEARCH_AFTER_TRUNCATION, str(tenant.memory)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -7 (SIGBUS) before
    assert "GSK-4471" in done.stdout  # answered from SQLite's vectors
    assert "changed in place" in done.stderr


async def test_a_tenant_with_conversations_but_no_memory_hears_unavailable_and_the_indexers_are_asked(services, service_env, r):
    services("serve")
    paths = TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), USER)
    r.delete(DUE)
    assert await call_recall(service_env, mint(USER), "gasket") == NO_MEMORY
    assert r.zscore(DUE, paths.uhash) is None  # nothing stored: nothing to build
    write_conversation(paths.src, "gasket", GASKET)  # stored; its memory lost (or not built yet)
    assert await call_recall(service_env, mint(USER), "gasket") == UNAVAILABLE
    assert r.zscore(DUE, paths.uhash) is not None  # an idle tenant heals without waiting for a restart


async def test_a_damaged_memory_answers_unavailable_and_the_indexers_are_asked_to_rebuild_it(services, service_env, r, embedder):
    paths = TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), USER)
    write_conversation(paths.src, "gasket", GASKET)
    index_tree(paths.root, paths.src, embedder)
    garble_bm25_index(paths.memory)
    services("serve")
    r.delete(DUE)
    assert await call_recall(service_env, mint(USER), "gasket") == UNAVAILABLE
    assert r.zscore(DUE, paths.uhash) is not None


async def test_the_indexer_puts_a_tenant_with_conversations_but_no_usable_memory_on_the_due_list(tenant, redis_url, embedder):
    import redis.asyncio as aioredis

    from services.indexer import redis_keys as keys
    from services.indexer.reembed_job import schedule_stale_tenants

    garble_bm25_index(tenant.memory)
    lost = TenantPaths.for_user(tenant.root.parent, "lost@example.com")
    write_conversation(lost.src, "valve", VALVE)
    client = aioredis.Redis.from_url(redis_url)
    try:
        await client.delete(keys.DUE, keys.REEMBED_PENDING)
        assert await schedule_stale_tenants(client, tenant.root.parent, embedder) == 2
        assert await client.zscore(keys.DUE, tenant.uhash) is not None and await client.zscore(keys.DUE, lost.uhash) is not None
        assert not await client.smembers(keys.REEMBED_PENDING)  # rebuilt, not re-embedded
    finally:
        await client.delete(keys.DUE, keys.REEMBED_PENDING)
        await client.aclose()


def test_a_memory_that_cannot_be_opened_for_a_passing_reason_is_never_taken_for_damaged(tenant, embedder, monkeypatch):
    import tantivy

    def out_of_files(*args, **kwargs):  # as tantivy-py words it (os error 24, EMFILE)
        raise ValueError("Failed to open file for read: 'IoError { io_error: Os { code: 24, kind: Uncategorized, "
                         "message: \"Too many open files\" }, filepath: \"meta.json\" }'")

    with monkeypatch.context() as m:
        m.setattr(tantivy, "Index", out_of_files)
        with pytest.raises(MemoryUnusable) as caught:
            MemoryStore.open(tenant.memory)
        assert not isinstance(caught.value, MemoryDamaged)
        with pytest.raises(MemoryUnusable):
            index_tree(tenant.root, tenant.src, embedder)  # refused, not rebuilt
    with monkeypatch.context() as m:
        m.setenv("RECALL_SQLITE_JOURNAL_MODE", "bogus")
        with pytest.raises(ValueError, match="RECALL_SQLITE_JOURNAL_MODE"):
            index_tree(tenant.root, tenant.src, embedder)
    assert chunk_count(tenant.memory) == 4  # nothing was thrown away
