"""Whether any indexer reads the stream ingest writes to.

Ingest creates the indexers' group on its own stream at start, so an ingest whose
`RECALL_STREAM` (or `RECALL_GROUP`) differs from the indexers' accepts every turn with 202 onto
a stream nobody consumes: nothing fails, and nothing is ever indexed. What gives it away is the
group on ingest's stream: no consumer, and entries waiting. `/readyz` says so while it holds; the
log line waits `UNREAD_GRACE_S`, since an indexer joins the group only at its first read (one
starting after ingest, or one quiet for an hour that the reaper removed).
"""

from __future__ import annotations

import time

from services.ingest.metrics import INGEST_STREAM_LENGTH, INGEST_STREAM_READERS
from shared.logging_setup import get_logger

log = get_logger("recall.ingest")

UNREAD_GRACE_S = 60.0
LOG_EVERY_S = 600.0


def group_readers(groups: list[dict], group: str) -> int:
    """Consumers of `group` in an XINFO GROUPS answer; 0 when the group is not there."""
    for g in groups:
        name = g.get("name")
        if (name.decode(errors="replace") if isinstance(name, bytes) else name) == group:
            return int(g.get("consumers", 0))
    return 0


class StreamReaders:
    """Follows the stream's readers from each storage check (every post and probe)."""

    def __init__(self, stream: str, group: str) -> None:
        self.stream, self.group = stream, group
        self._unread_since: float | None = None
        self._logged_at = float("-inf")

    def observe(self, backlog: int, readers: int | None) -> None:
        """`readers` None: unknown (an older ACL without XINFO), nothing is concluded."""
        INGEST_STREAM_LENGTH.set(backlog)
        if readers is None:
            return
        INGEST_STREAM_READERS.set(readers)
        now = time.monotonic()
        if readers or not backlog:
            self._unread_since = None
            return
        if self._unread_since is None:
            self._unread_since = now
        if now - self._unread_since >= UNREAD_GRACE_S and now - self._logged_at >= LOG_EVERY_S:
            self._logged_at = now
            log.warning("ingest.stream_unread", stream=self.stream, group=self.group, entries=backlog,
                        consequence="turns are accepted and wait; no indexer reads this stream")

    def problem(self, backlog: int, readers: int | None) -> str | None:
        """What `/readyz` says of the stream's readers, or None when nothing is wrong or known."""
        if readers != 0 or not backlog:
            return None
        return (f"no indexer reads RECALL_STREAM={self.stream} (group {self.group} has no consumer) and {backlog} "
                "entries wait: the indexers' RECALL_STREAM and RECALL_GROUP must be ingest's")
