"""`recall up`'s supervision of its services: a child that crashes after the stack is up is
started again after a backoff, as `make run` users expect of a supervisor; one that keeps
crashing stops the stack with one line naming it and its exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

RESTART_WINDOW_S = 120.0  # a child's restarts count against its limit for this long
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0)  # wait before the n-th restart within the window


def exit_reason(code: int) -> str:
    """`-9 (SIGKILL)` for a signal, the plain code otherwise."""
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    ready_url: str
    restarts: deque[float] = field(default_factory=deque)  # monotonic times of restarts within the window
    restart_at: float | None = None  # set while it waits out its backoff
    awaiting_ready: bool = False


class Supervisor:
    """Polled by `recall up`'s loop (never blocks it for long: Ctrl-C stays prompt)."""

    def __init__(self, start: Callable[[str], subprocess.Popen], children: list[Child], restart_limit: int) -> None:
        self.start = start
        self.children = children
        self.restart_limit = restart_limit

    def poll(self) -> str | None:
        """Restart what is due; None while the stack goes on, else the line to stop it with."""
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    child.restart_at, child.awaiting_ready = None, True
                    child.proc = self.start(child.name)
                continue
            if child.proc.poll() is None:
                if child.awaiting_ready and _answers(child.ready_url):
                    child.awaiting_ready = False
                    say(f"recall up: {child.name} is ready again")
                continue
            code = child.proc.returncode
            _kill_leftovers(child.proc)
            while child.restarts and now - child.restarts[0] > RESTART_WINDOW_S:
                child.restarts.popleft()
            if len(child.restarts) >= self.restart_limit:
                n = len(child.restarts)
                return (f"recall up: {child.name} exited with {exit_reason(code)} after {n} restart{'' if n == 1 else 's'} "
                        f"within {RESTART_WINDOW_S:.0f} s; stopping everything")
            delay = BACKOFF_S[min(len(child.restarts), len(BACKOFF_S) - 1)]
            child.restarts.append(now)
            child.restart_at = now + delay
            say(f"recall up: {child.name} exited with {exit_reason(code)}; starting it again in {delay:.0f} s "
                f"(restart {len(child.restarts)} of {self.restart_limit} within {RESTART_WINDOW_S:.0f} s)")
        return None


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=0.5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _kill_leftovers(proc: subprocess.Popen) -> None:
    # The child led its own process group: whatever it started there must not outlive it
    # (and hold its port or files) when its replacement starts. Its pid is not reused while
    # the group has members, so this reaches only its own.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
