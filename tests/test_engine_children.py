"""A `funes mcp` child never outlives the recall replica that started it, even when it hangs."""

from __future__ import annotations

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
    assert process_state(child) == "T"
    replica.kill()
    replica.wait()
    deadline = time.monotonic() + 10
    while process_state(child) not in (None, "Z") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process_state(child) in (None, "Z"), "the engine child outlived its replica"
