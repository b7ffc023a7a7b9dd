"""The funes-mode pool under a child's faults (fault trial, round 16): a crash is counted once
however many calls were queued on the child, and evicting a hung idle child holds up no other
tenant's calls while it is given its grace period."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

import pytest
from prometheus_client import REGISTRY

from services.recall.backend import BackendUnavailable
from services.recall.process_pool import ProcessPool
from shared.engine.index_run import index_tree
from shared.tenant_paths import TenantPaths
from tests.conftest import engine_cli, write_conversation


@pytest.fixture
def tenants(tmp_path, embedder) -> list[TenantPaths]:
    made = []
    for user in ("ada", "bea", "cai"):
        paths = TenantPaths.for_user(tmp_path, user)
        write_conversation(paths.src, f"{user}-1", [f"Unit P-{len(made)} has a gland leak.", "Work order MT-4401 is open."])
        index_tree(paths.root, paths.src, embedder)
        made.append(paths)
    return made


def crashes() -> float:
    return REGISTRY.get_sample_value("recall_pool_crash_restarts_total", {"reason": "crash"}) or 0.0


async def test_a_child_killed_under_queued_calls_is_one_crash(tenants):
    pool = ProcessPool(engine_cli(), 3, 60, 30, 60)
    try:
        await pool.recall(tenants[0], "gland leak", 3, 8)
        pid = pool._slots[tenants[0].uhash].child.pid
        os.kill(pid, signal.SIGSTOP)  # both calls wait on it: one in it, one queued behind
        calls = [asyncio.create_task(pool.recall(tenants[0], "gland leak", 3, 8)) for _ in range(2)]
        await asyncio.sleep(0.3)
        before = crashes()
        os.kill(pid, signal.SIGKILL)
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, BackendUnavailable) or isinstance(r, list) for r in results), results
        assert crashes() == before + 1
    finally:
        await pool.close()


async def test_evicting_a_hung_idle_child_holds_up_no_other_tenants_call(tenants):
    pool = ProcessPool(engine_cli(), 2, 60, 30, 60)
    try:
        await pool.recall(tenants[0], "gland leak", 3, 8)
        await pool.recall(tenants[1], "gland leak", 3, 8)  # ada's child is now the least recently used
        hung = pool._slots[tenants[0].uhash].child.pid
        os.kill(hung, signal.SIGSTOP)  # it would take its whole grace period to close
        third = asyncio.create_task(pool.recall(tenants[2], "gland leak", 3, 8))  # evicts ada's child
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await pool.recall(tenants[1], "gland leak", 3, 8)
        assert time.monotonic() - started < 1.0  # 1.84 s before: the pool's lock was held for the grace
        await third
    finally:
        if _alive(hung):
            os.kill(hung, signal.SIGCONT)
        await pool.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# A funes stand-in whose first recall loads its models (2 s), as funes does: it relays the MCP
# engine's stdio line by line and holds the first tools/call recall back.
SLOW_FIRST_RECALL = """#!{python}
import subprocess, sys, threading, time
child = subprocess.Popen(["{engine}", *sys.argv[1:]], stdin=subprocess.PIPE, stdout=sys.stdout)
loaded = False
for line in sys.stdin:
    if not loaded and '"tools/call"' in line and '"recall"' in line:
        time.sleep(2.0)
        loaded = True
    child.stdin.write(line.encode()); child.stdin.flush()
child.stdin.close(); child.wait()
"""


async def test_a_new_childs_model_load_is_not_charged_to_its_first_callers_timeout(tenants, tmp_path):
    """funes loads its models on a child's first recall: within the call timeout that first call
    timed out and its child was replaced by another cold one, for ever on a slow host. The pool
    makes the first recall itself, under the start timeout."""
    funes = tmp_path / "funes"
    funes.write_text(SLOW_FIRST_RECALL.format(python=sys.executable, engine=engine_cli()))
    funes.chmod(0o755)
    pool = ProcessPool(str(funes), 3, 60, 1.0, 60)  # 1 s: a warm call, never a model load
    try:
        hits = await pool.recall(tenants[0], "gland leak", 3, 8)
        assert hits and "gland leak" in hits[0].text
    finally:
        await pool.close()
