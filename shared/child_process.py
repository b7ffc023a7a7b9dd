"""Small helpers for the child processes the stack, the tests and the benchmarks start."""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request


def free_port() -> int:
    """A port free on loopback now (a small race remains until the child binds it)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


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
