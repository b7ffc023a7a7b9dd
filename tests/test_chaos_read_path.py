"""The recall service's read path under concurrency, through real MCP clients over HTTP with
real tokens: many tenants racing a reader cache smaller than their number while forget
announcements drop readers in use. Every tenant has a memory holding its fact, so any
"unavailable" or "no memory" answer is false."""

from __future__ import annotations

import asyncio
import json
import random
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

import httpx
import pytest
import redis

from shared.child_process import stop, wait_healthy
from shared.engine.index_run import index_tree
from shared.recall_answer_format import BUSY, NO_MEMORY, UNAVAILABLE
from shared.stream_schema import FORGET_CHANNEL
from shared.tenant_paths import TenantPaths, user_hash
from tests.conftest import BIN, call_recall, mint, recall_url, write_conversation

TENANTS = 25
CALLS_PER_TENANT = 6


def metric_value(metrics: str, series: str) -> float:
    for line in metrics.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} is not in /metrics")


@pytest.fixture(scope="module")
def template_home(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("chaos-template")
    for i in range(4):
        write_conversation(root / "src", f"conv-{i}", [
            f"Unit P-{100 + i} at the North plant has a gland leak again.",
            f"I opened work order MT-{4400 + i} for the gland leak on P-{100 + i}; Priya picks it up.",
        ])
    index_tree(root / "home", root / "src", embedder)
    return root / "home"


async def test_tenants_racing_a_small_reader_cache_and_forget_drops_never_get_a_false_unavailable(
        template_home, services, service_env):
    data = Path(service_env["RECALL_DATA_DIR"])
    users = [f"racer-{i:02d}" for i in range(TENANTS)]
    for user in users:
        shutil.copytree(template_home / "memory", TenantPaths.for_user(data, user).memory)
    # Two readers for 25 tenants, and room for every call to wait its turn: no answer may be "busy".
    services("serve", RECALL_ENGINE="embedded", RECALL_READER_CACHE="2", RECALL_MAX_CONCURRENCY="8",
             RECALL_QUEUE_MAX="400", RECALL_QUEUE_WAIT_S="120", RECALL_TIMEOUT_S="60")
    client = redis.Redis.from_url(service_env["RECALL_REDIS_URL"])
    stop = asyncio.Event()

    async def announce_forgets() -> int:
        """What indexers publish after a deletion: the service drops that tenant's reader."""
        rng, sent = random.Random(3), 0
        while not stop.is_set():
            await asyncio.to_thread(client.publish, FORGET_CHANNEL, json.dumps({"user_hash": user_hash(rng.choice(users))}))
            sent += 1
            await asyncio.sleep(0.01)
        return sent

    async def ask(user: str) -> str:
        return await call_recall(service_env, mint(user), "MT-4402 gland leak")

    forgets = asyncio.create_task(announce_forgets())
    try:
        answers = await asyncio.gather(*[ask(u) for u in users for _ in range(CALLS_PER_TENANT)], return_exceptions=True)
    finally:
        stop.set()
    sent = await forgets
    errors = [a for a in answers if isinstance(a, BaseException)]
    assert not errors, f"MCP/HTTP errors: {errors[:3]!r}"
    false = [a for a in answers if a in (UNAVAILABLE, NO_MEMORY)]
    assert not false, f"{len(false)} of {len(answers)} calls answered a false {false[0]!r}"
    assert not [a for a in answers if a == BUSY], "the queue had room for every call"
    assert all("MT-4402" in a for a in answers), "every call found its tenant's fact"
    metrics = httpx.get(f"{recall_url(service_env)}/metrics").text
    assert metric_value(metrics, 'recall_pool_evictions_total{reason="lru"}') > TENANTS, "the cache was contended"
    assert metric_value(metrics, "recall_pool_processes") <= 2
    assert sent > 0


@pytest.mark.parametrize("soft, hard", [(200, 4096), (300, 300)], ids=["soft-limit-below-hard", "low-hard-limit"])
async def test_more_tenants_than_the_open_file_limit_holds_readers_for_never_get_a_false_unavailable(
        template_home, service_env, tmp_path, soft, hard):
    """Each open memory holds 4 file descriptors; the default cache (256) outgrows a 1024 limit.
    Past the limit the next memory could not be opened ("unavailable") and connections were
    refused. The service raises its soft limit to the hard one and keeps the cache within it."""
    data = Path(service_env["RECALL_DATA_DIR"])
    users = [f"many-{i:02d}" for i in range(80)]  # 80 readers need 320 descriptors
    for user in users:
        shutil.copytree(template_home / "memory", TenantPaths.for_user(data, user).memory)
    log = tempfile.NamedTemporaryFile(prefix="recall-serve-", suffix=".log", dir=tmp_path, delete=False)
    proc = subprocess.Popen([str(BIN / "recall"), "serve"], env={**service_env, "RECALL_ENGINE": "embedded"},
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
    try:
        wait_healthy(proc, f"{recall_url(service_env)}/healthz", 60)
        gate = asyncio.Semaphore(8)

        async def ask(user: str) -> str:
            async with gate:
                return await call_recall(service_env, mint(user), "MT-4402 gland leak")

        answers = await asyncio.gather(*[ask(u) for u in users], return_exceptions=True)
        output = Path(log.name).read_text(errors="replace")
        errors = [a for a in answers if isinstance(a, BaseException)]
        assert not errors, f"MCP/HTTP errors: {errors[:3]!r}\n{output[-2000:]}"
        false = [a for a in answers if a in (UNAVAILABLE, NO_MEMORY)]
        assert not false, f"{len(false)} of {len(answers)} calls answered a false {false[0]!r}\n{output[-2000:]}"
        missed = [a for a in answers if "MT-4402" not in a]
        assert not missed, f"{len(missed)} of {len(answers)} calls missed the fact, e.g. {missed[0][:300]!r}"
        assert ("recall.reader_cache_capped" in output) == (hard < 1024), "a cap is logged exactly when the limit forces one"
    finally:
        stop(proc)
