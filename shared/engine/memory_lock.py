"""One writer per memory: an advisory flock on `$FUNES_HOME/store.lock`, as funes does.

The kernel releases the lock when the holder dies, so a kill -9 never leaves a stale lock.
Readers take no lock at all.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

CONTENTION_MESSAGE = "another funes memory operation is in progress; retry in a moment"


class MemoryBusy(Exception):
    def __init__(self) -> None:
        super().__init__(CONTENTION_MESSAGE)


def _keep_waiting() -> None:
    pass


@contextlib.contextmanager
def memory_lock(home: Path, wait_s: float = 0.0, waiting: Callable[[], None] = _keep_waiting) -> Iterator[None]:
    """Hold the writer lock; wait up to `wait_s` seconds for it, then raise MemoryBusy. `waiting()`
    is called between tries: what it raises ends the wait (the caller's own run was stopped)."""
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / "store.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise MemoryBusy() from None
                waiting()
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)
