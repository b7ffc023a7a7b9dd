"""`recall up` supervises its services: kill -9 of a child used to stop the whole stack."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import BIN, free_port, wait_until


@dataclass
class Stack:
    proc: subprocess.Popen
    cwd: Path
    ports: dict[str, str]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def child(self, command: str) -> psutil.Process:
        [found] = [p for p in psutil.Process(self.proc.pid).children() if p.cmdline()[-1:] == [command]]
        return found

    def post(self, cid: str, text: str) -> int:
        key = json.loads((self.cwd / "data" / "dev-secrets.json").read_text())["RECALL_INGEST_KEY"]
        return httpx.post(f"http://127.0.0.1:{self.ports['RECALL_INGEST_PORT']}/turns", headers={"x-ingest-key": key},
                          timeout=10, json={"user": "alice", "conversation_id": cid,
                                            "turns": [{"role": "user", "text": text, "ts": "2026-10-08T10:00:00Z"}]}).status_code

    def leftovers(self) -> list[psutil.Process]:
        alive = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) == self.proc.pid:
                    alive.append(p)
            except (ProcessLookupError, PermissionError, psutil.Error):
                pass
        return alive


def _env(ports: dict[str, str], **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RECALL_")}
    return {**clean, **ports, **extra}


@pytest.fixture
def start_stack(tmp_path) -> Iterator:
    started: list[Stack] = []

    def start(**extra: str) -> Stack:
        ports = {v: str(free_port()) for v in ("RECALL_INGEST_PORT", "RECALL_INDEXER_PORT", "RECALL_RECALL_PORT",
                                               "RECALL_EMBEDDED_REDIS_PORT")}
        log_path = tmp_path / "up.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([str(BIN / "recall"), "up"], cwd=tmp_path, env=_env(ports, **extra), stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        stack = Stack(proc, tmp_path, ports, log_path)
        started.append(stack)
        assert wait_until(lambda: "Ctrl-C stops everything." in stack.output() or proc.poll() is not None, 240, 0.2)
        assert proc.poll() is None, stack.output()[-3000:]
        return stack

    yield start
    for stack in started:
        if stack.proc.poll() is None:
            os.killpg(stack.proc.pid, signal.SIGKILL)
            stack.proc.wait(30)


async def _search(stack: Stack, query: str) -> str:
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    token = subprocess.run([str(BIN / "recall"), "token", "--user", "alice"], cwd=stack.cwd, env=_env({}),
                           capture_output=True, text=True, check=True).stdout.strip()
    async with Client(f"http://127.0.0.1:{stack.ports['RECALL_RECALL_PORT']}/mcp", auth=BearerAuth(token)) as client:
        result = await client.call_tool("recall_my_conversations", {"query": query})
        return result.content[0].text


async def test_a_killed_indexer_is_started_again_and_what_was_posted_meanwhile_becomes_searchable(start_stack):
    stack = start_stack()
    indexer = stack.child("indexer")
    indexer.kill()
    assert wait_until(lambda: "indexer exited with -9 (SIGKILL); starting it again in 1 s" in stack.output(), 30, 0.1), \
        stack.output()[-3000:]
    # Ingest keeps accepting while the indexer is down: the stream holds the entry for the new one.
    assert stack.post("while-down", "The kiln at plant 7 runs at 1250 degrees since the ZK-88 retrofit") == 202
    assert wait_until(lambda: "recall up: indexer is ready again" in stack.output(), 120, 0.2), stack.output()[-3000:]
    again = stack.child("indexer")
    assert again.pid != indexer.pid and not psutil.pid_exists(indexer.pid)
    assert stack.post("after", "Ticket QX-512 moves the dryer audit to Thursday") == 202

    deadline = time.monotonic() + 90
    for query, expected in (("ZK-88 kiln retrofit", "ZK-88"), ("QX-512 dryer audit", "QX-512")):
        while expected not in (text := await _search(stack, query)):
            assert time.monotonic() < deadline, f"{expected} never became searchable: {text}\n{stack.output()[-3000:]}"
            time.sleep(0.5)
    assert stack.proc.poll() is None

    parts = psutil.Process(stack.proc.pid).children(recursive=True)
    os.killpg(stack.proc.pid, signal.SIGINT)  # Ctrl-C
    assert stack.proc.wait(90) == 0 and "recall up: stopped" in stack.output()
    _, alive = psutil.wait_procs(parts, timeout=30)
    assert not alive and not stack.leftovers(), [p.cmdline() for p in alive]


def test_a_service_that_keeps_dying_stops_the_stack_with_one_line_naming_it_and_its_exit_code(start_stack):
    stack = start_stack(RECALL_CHILD_RESTART_LIMIT="2")
    ready_again = lambda n: stack.output().count("recall up: ingest is ready again") == n  # noqa: E731
    stack.child("ingest").send_signal(signal.SIGTERM)
    assert wait_until(lambda: ready_again(1), 120, 0.2), stack.output()[-3000:]
    stack.child("ingest").kill()
    assert wait_until(lambda: ready_again(2), 120, 0.2), stack.output()[-3000:]
    restarts = [ln for ln in stack.output().splitlines() if "starting it again" in ln]
    assert restarts == ["recall up: ingest exited with 0; starting it again in 1 s (restart 1 of 2 within 120 s)",
                        "recall up: ingest exited with -9 (SIGKILL); starting it again in 2 s (restart 2 of 2 within 120 s)"]
    stack.child("ingest").kill()

    assert stack.proc.wait(90) == 1, stack.output()[-3000:]
    given_up = [ln for ln in stack.output().splitlines() if "stopping everything" in ln]
    assert given_up == ["recall up: ingest exited with -9 (SIGKILL) after 2 restarts within 120 s; stopping everything"]
    assert re.search(r"recall up: stopped\s*$", stack.output())
    assert wait_until(lambda: not stack.leftovers(), 30), [p.cmdline() for p in stack.leftovers()]


def test_with_no_restarts_allowed_a_dead_service_stops_the_stack_as_before(start_stack):
    stack = start_stack(RECALL_CHILD_RESTART_LIMIT="0", RECALL_CHILD_RESTART_LIMT="3")
    assert stack.output().count("RECALL_CHILD_RESTART_LIMT is not a setting") == 1, "said by recall up, not by each child"
    stack.child("serve").kill()
    assert stack.proc.wait(90) == 1, stack.output()[-3000:]
    assert "recall up: recall exited with -9 (SIGKILL) after 0 restarts within 120 s; stopping everything" in stack.output()
    assert "starting it again" not in stack.output()
    assert wait_until(lambda: not stack.leftovers(), 30), [p.cmdline() for p in stack.leftovers()]


def test_ctrl_c_kills_a_part_that_does_not_stop_within_the_grace_and_names_it(start_stack):
    stack = start_stack(RECALL_STOP_GRACE_S="3")
    stuck = stack.child("serve")
    stuck.suspend()  # SIGSTOP: its SIGTERM stays pending, as in a process that hangs while stopping
    parts = psutil.Process(stack.proc.pid).children(recursive=True)
    started = time.monotonic()
    os.killpg(stack.proc.pid, signal.SIGINT)
    assert stack.proc.wait(60) == 0, stack.output()[-3000:]
    assert 8 <= time.monotonic() - started < 30, stack.output()[-3000:]  # its grace, then STOP_MARGIN_S
    lines = [ln for ln in stack.output().splitlines() if "did not stop" in ln]
    assert lines == ["recall up: recall did not stop within 8 s of SIGTERM; killing it"]
    _, alive = psutil.wait_procs(parts, timeout=30)
    assert not alive and not stack.leftovers(), [p.cmdline() for p in alive]


def test_ctrl_c_stops_the_indexer_beside_the_recall_service_not_after_it(start_stack):
    """A soak trial's stops ran past 30 s: the indexer got its SIGTERM only once the recall
    service had exited. Ingest stops first (nothing new reaches the indexer), then the recall
    service and the indexer together, so a recall service slow to stop delays the indexer no more."""
    stack = start_stack(RECALL_STOP_GRACE_S="3")
    indexer = stack.child("indexer")
    stack.child("serve").suspend()  # it stops only when killed, 8 s after its SIGTERM
    exited: dict[str, float] = {}
    started = time.monotonic()
    os.killpg(stack.proc.pid, signal.SIGINT)
    psutil.wait_procs([indexer], timeout=30, callback=lambda p: exited.setdefault("indexer", time.monotonic() - started))
    assert exited.get("indexer", 99) < 6, (exited, stack.output()[-3000:])
    assert stack.proc.wait(60) == 0, stack.output()[-3000:]


def _thp_mode() -> str:
    try:
        return re.search(r"\[(\w+)\]", Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text())[1]
    except (OSError, TypeError):
        return "never"


async def test_the_stack_runs_its_services_with_their_large_allocations_on_huge_pages(start_stack):
    import platform

    stack = start_stack()
    assert stack.post("hp", "The kiln at plant 7 runs at 1250 degrees since the ZK-88 retrofit") == 202
    deadline = time.monotonic() + 90
    while "ZK-88" not in await _search(stack, "ZK-88 kiln"):  # the recall service has run its model
        assert time.monotonic() < deadline, stack.output()[-3000:]
        time.sleep(0.5)
    libc, version = platform.libc_ver()
    if _thp_mode() == "never" or libc != "glibc" or tuple(map(int, version.split("."))) < (2, 35):
        pytest.skip(f"no transparent huge pages here (THP {_thp_mode()}, {libc} {version})")
    for command in ("serve", "indexer"):  # the two that load the model
        rollup = Path(f"/proc/{stack.child(command).pid}/smaps_rollup").read_text()
        huge_kib = int(re.search(r"AnonHugePages:\s+(\d+) kB", rollup)[1])
        assert huge_kib >= 16 * 1024, (command, rollup)  # the model's weights, at least
