"""Small helpers for the child processes the stack, the tests and the benchmarks start."""

from __future__ import annotations

import socket
import subprocess


def free_port() -> int:
    """A port free on loopback now (a small race remains until the child binds it)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM, wait, then SIGKILL: graceful when it can be, never left running."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
