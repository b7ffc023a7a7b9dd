"""A `funes mcp` child never outlives the recall replica that started it, even when it hangs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import engine_cli

PARENT = r'''
import asyncio, os, signal, sys
from shared.mcp_stdio_client import StdioMCPChild

async def main():
    child = await StdioMCPChild([sys.argv[1], "mcp", sys.argv[2]]).start()
    os.kill(child.proc.pid, signal.SIGSTOP)  # hung: it would hold a SIGTERM until continued
    print(child.proc.pid, flush=True)
    await asyncio.sleep(120)

asyncio.run(main())
'''


def process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def test_a_hung_engine_child_dies_when_its_replica_is_killed(tmp_path):
    replica = subprocess.Popen([sys.executable, "-c", PARENT, engine_cli(), str(tmp_path / "memory")],
                               stdout=subprocess.PIPE, text=True)
    child = int(replica.stdout.readline())
    try:
        # kill() returns before the signal is delivered: on a loaded machine the child may still
        # be running for a moment.
        assert wait_for_state(child, {"T"}, 5), "the child is stopped (hung) before its replica dies"
        replica.kill()
        replica.wait()
        assert wait_for_state(child, {None, "Z"}, 10), "the engine child outlived its replica"
    finally:
        replica.kill()
        if process_state(child) not in (None, "Z"):
            os.kill(child, signal.SIGKILL)


def wait_for_state(pid: int, states: set[str | None], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while process_state(pid) not in states and time.monotonic() < deadline:
        time.sleep(0.02)
    return process_state(pid) in states
