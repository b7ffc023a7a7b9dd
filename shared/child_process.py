"""Small helpers for the child processes the stack, the tests and the benchmarks start."""

from __future__ import annotations

import ctypes
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


# Listeners we start take ports from here up to the kernel's ephemeral range: below 10000 sit
# the usual servers' defaults (PostgreSQL's 5432, our own 8000-8002).
_FIRST_LISTEN_PORT = 10_000
_pick = random.SystemRandom()  # xdist workers and children must not share a seeded sequence


def _ephemeral_start() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux's setting, else its default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port free on loopback now, from below the kernel's ephemeral range.

    Port 0 would give an ephemeral port, and every outgoing connection on the machine (an HTTP
    client, a Redis connection) draws its local port from that range: one took a test's port
    between this check and the child's bind. Below the range only listeners compete, and a
    random pick among ~22,000 ports makes two of ours meeting unlikely (a small race remains).
    """
    end = _ephemeral_start()
    if end - _FIRST_LISTEN_PORT >= 1000:
        for _ in range(100):
            port = _pick.randrange(_FIRST_LISTEN_PORT, end)
            if _bindable(port):
                return port
    with socket.socket() as s:  # a machine whose ephemeral range starts low: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM, wait, then SIGKILL: graceful when it can be, never left running."""
    stop_together([proc], timeout)
    return proc.returncode


def stop_together(procs: list[subprocess.Popen], timeout: float) -> list[subprocess.Popen]:
    """`stop` for several at once: SIGTERM to each, `timeout` for them all, then SIGKILL to what
    is left; those it had to kill."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout
    killed = []
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            killed.append(proc)
    return killed


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """preexec_fn: the child gets `sig` when the thread that started it dies (Linux)."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def ready(proc: subprocess.Popen, url: str, deadline: float) -> bool:
    """One probe: True when `url` answers 200; RuntimeError if the child exited or `deadline` passed."""
    if proc.poll() is not None:
        raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            if resp.status == 200:
                return True
    except (urllib.error.URLError, OSError):
        pass
    if time.monotonic() > deadline:
        raise RuntimeError(f"{proc.args} did not become ready at {url}")
    return False


def wait_healthy(proc: subprocess.Popen, url: str, timeout: float = 120.0) -> None:
    """Until `url` answers 200; RuntimeError if the child exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while not ready(proc, url, deadline):
        time.sleep(0.1)
