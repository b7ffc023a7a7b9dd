"""Funes mode with more tenants searching at once than `funes mcp` children may run: every child
busy (or still starting) is load, not a failure, so the agent hears "busy, try again", never
"unavailable" (which counts as a soft failure and pages: RecallSoftFailureRateHigh). Real
service, real MCP clients, the stand-in funes binary as the engine children."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

from shared.recall_answer_format import BUSY, UNAVAILABLE
from shared.tenant_paths import TenantPaths
from tests.conftest import call_recall, mint, write_conversation

TENANTS = 8


async def test_more_tenants_at_once_than_engine_children_hear_busy_never_unavailable(services, service_env, fake_funes):
    data = Path(service_env["RECALL_DATA_DIR"])
    users = [f"pool-{i}" for i in range(TENANTS)]
    for i, user in enumerate(users):
        paths = TenantPaths.for_user(data, user)
        write_conversation(paths.src, "c", [f"{user} owns ticket MT-{4400 + i} for the gland leak.", "noted"])
        done = subprocess.run([fake_funes, "index", "--yes", str(paths.src)], capture_output=True, text=True, timeout=60,
                              env={"FUNES_HOME": str(paths.root)})
        assert done.returncode == 0, done.stderr
    services("serve", RECALL_ENGINE="funes", RECALL_FUNES_BIN=fake_funes, RECALL_POOL_MAX_PROCESSES="2",
             RECALL_MAX_CONCURRENCY=str(TENANTS), RECALL_QUEUE_MAX="100", RECALL_QUEUE_WAIT_S="60")
    answers = await asyncio.gather(*[call_recall(service_env, mint(u), "ticket owner gland leak")
                                     for u in users for _ in range(3)])
    assert UNAVAILABLE not in answers, f"{answers.count(UNAVAILABLE)} of {len(answers)} answers were 'unavailable'"
    assert all(a == BUSY or "owns ticket" in a for a in answers), answers
    # Once the burst is over every tenant is answered.
    for i, user in enumerate(users):
        assert f"MT-{4400 + i}" in await call_recall(service_env, mint(user), "ticket owner gland leak")
