"""One bound, per process, on the bytes held in request bodies that have not arrived whole.

Each body the services read before answering (ingest's endpoints, `/mcp`, AgentMemory's HTTP
API) is held until its last byte comes: up to its own limit (4 MiB at ingest, 1 MiB at `/mcp`),
for up to RECALL_REQUEST_READ_TIMEOUT_S. Nothing bounded their sum: 200 callers with a valid key
or token that stalled took a recall replica from 288 to 479 MiB (1 MiB each) and ingest from 70
to 567 MiB (4 MiB each), past its pod's 512 MiB limit (docs/benchmarks.md, round 33). A body
whose next chunk would take the process past RECALL_BODY_BUFFER_BYTES is refused at once instead
(`shared/http_body.py` answers it 503, "busy"); with it, 344 and 140 MiB.

All of it runs on the event loop's thread: a check and the count it guards cannot interleave.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import Gauge

# Each process has one budget (ingest's, a recall replica's). At 0 whenever no body is arriving:
# one that stays up while the process is idle is a leak, and would end in every body refused.
BODY_BYTES_HELD = Gauge("recall_http_body_buffer_bytes",
                        "Bytes the request bodies still arriving hold now, against RECALL_BODY_BUFFER_BYTES.")


class BudgetSpent(Exception):
    """The next chunk would take the bytes held past the budget; nothing of it was counted.
    `held`: what the process held then, this body's part included."""

    def __init__(self, held: int) -> None:
        super().__init__(held)
        self.held = held


class BodyBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0  # bytes of the bodies still arriving, across every request of the process

    @contextlib.contextmanager
    def lease(self) -> Iterator[Lease]:
        """What one body holds while it arrives, given back however reading it ends: whole,
        refused, the caller gone or the request cancelled. A leak would be for good: the process
        would refuse more bodies, and in the end every one."""
        lease = Lease(self)
        try:
            yield lease
        finally:
            self.held -= lease.held
            lease.held = 0
            BODY_BYTES_HELD.set(self.held)


class Lease:
    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.held = 0

    def take(self, size: int) -> None:
        """Count `size` more bytes of this body; BudgetSpent if the process would then hold more
        than its budget."""
        if self.budget.held + size > self.budget.limit:
            raise BudgetSpent(self.budget.held)
        self.budget.held += size
        self.held += size
        BODY_BYTES_HELD.set(self.budget.held)
