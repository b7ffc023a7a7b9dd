"""Admission to the engine: at most `slots` searches run at once, at most `queue_max` callers
wait for one, each for at most `wait_s`. A caller turned away gets the soft "busy" answer
instead of piling more work onto a saturated replica.

A slot belongs to the search, not to the caller: it is released when the search itself ends,
so a caller that stopped waiting (timeout, disconnect) never lets more searches run than slots.
"""

from __future__ import annotations

import asyncio
from collections import deque

from services.recall.metrics import RECALL_QUEUED


class Busy(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason  # queue_full | queue_timeout


class Admission:
    def __init__(self, slots: int, queue_max: int, wait_s: float) -> None:
        self.queue_max = queue_max
        self.wait_s = wait_s
        self._free = slots
        self._waiters: deque[asyncio.Future] = deque()

    async def acquire(self) -> None:
        """Take a slot (FIFO); Busy when the queue is full or no slot frees within wait_s."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        if len(self._waiters) >= self.queue_max:
            raise Busy("queue_full")
        granted = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        RECALL_QUEUED.set(len(self._waiters))
        try:
            async with asyncio.timeout(self.wait_s):
                await granted
        except TimeoutError:
            if not _holds_slot(granted):
                raise Busy("queue_timeout") from None
        except BaseException:  # the caller went away: hand back a slot granted meanwhile
            if _holds_slot(granted):
                self.release()
            raise
        finally:
            if not granted.done():
                granted.cancel()
            if granted in self._waiters:
                self._waiters.remove(granted)
            RECALL_QUEUED.set(len(self._waiters))

    def release(self) -> None:
        """Hand the slot straight to the oldest waiter still waiting, else free it."""
        while self._waiters:
            granted = self._waiters.popleft()
            if not granted.done():
                granted.set_result(None)
                RECALL_QUEUED.set(len(self._waiters))
                return
        self._free += 1


def _holds_slot(granted: asyncio.Future) -> bool:
    """release() granted this waiter a slot (possibly just as its deadline passed)."""
    return granted.done() and not granted.cancelled()
