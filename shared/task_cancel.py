"""Cancelling tasks at a stop so that the stop cannot hang on one of them.

Python 3.11's `asyncio.wait_for` drops a cancellation that lands in the loop iteration in which
its inner awaitable finished (fixed in 3.12, gh-86296), and redis-py wraps every command's
socket write in it when the client has a socket timeout. A forget polling for its user's index
lock lost its cancellation this way, polled on, and the indexer's stop waited for it past the
30 s SIGTERM grace (1 stop in ~25 with two running at once). A task that goes on after its
cancellation is cancelled again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

# A cancelled task's own clean-up (a Redis call or two in a `finally`) takes milliseconds; one
# that takes longer (a slow Redis) is cut short by the second cancellation, and what it would have
# released (a lock, a forget's request to yield) expires by itself within a lock TTL.
RECANCEL_EVERY_S = 1.0
CANCEL_WAIT_S = 5.0  # how long a stop waits for the tasks it cancelled


async def cancel_and_wait(tasks: Iterable[asyncio.Task], timeout_s: float = CANCEL_WAIT_S) -> set[asyncio.Task]:
    """Cancel the tasks and wait up to `timeout_s` for them to end, cancelling again every
    RECANCEL_EVERY_S those still running. Returns those still running after it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    tasks = list(tasks)
    pending = {task for task in tasks if not task.done()}
    while pending and (left := deadline - loop.time()) > 0:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(RECANCEL_EVERY_S, left))
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: a task that failed as it stopped is no "never retrieved" warning
    return pending
