"""Index refreshes off the request path: a write answers once its transaction (with its index
outbox row) has committed, and the realm's search index takes the change in a thread of its own.

Embedding is CPU in proportion to the text (a 20,000-character body is seconds of it): an
acceptance that waited for it answered after those seconds. One thread per process is enough —
ArtifactSearch runs one refresh at a time per process anyway — and a realm asked for again while
its refresh is queued is refreshed once (the outbox carries every change along).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# An idle worker lingers this long for the next write before its thread ends: a thread (and its
# database connection) per write would cost a PostgreSQL connection each.
IDLE_S = 30.0


class IndexQueue:
    def __init__(self, refresh: Callable[[str], object]) -> None:
        self._refresh = refresh  # never raises: ArtifactService.reindex logs a failure itself
        self._cond = threading.Condition()
        self._queued: list[str] = []
        self._asked: dict[str, int] = {}  # per realm: how many times a refresh was asked for
        self._done: dict[str, int] = {}  # per realm: the count a finished (or failed) refresh started from
        self._worker: threading.Thread | None = None

    def soon(self, realm_id: str, awaited: bool = True) -> None:
        """Refresh the realm's index after this, in the queue's thread. A search waits for the
        refreshes its process's writes asked for (`wait`); one not `awaited` (the start-up sweep:
        up to 1,000 realms, a search far down the queue would wait out its whole timeout, holding
        a realm thread) leaves a search to catch up from the outbox itself."""
        with self._cond:
            if awaited:
                self._asked[realm_id] = self._asked.get(realm_id, 0) + 1
            if realm_id not in self._queued:
                self._queued.append(realm_id)
            self._cond.notify_all()  # an idle worker takes it
            if self._worker is None:
                # A daemon: a process stopping mid-refresh leaves its outbox rows, which the next refresh takes.
                self._worker = threading.Thread(target=self._run, name="realm-index", daemon=True)
                self._worker.start()

    def wait(self, realm_id: str, timeout_s: float) -> bool:
        """Until every refresh this process was asked for in the realm so far has run (True), or
        `timeout_s` has passed (False)."""
        with self._cond:
            asked = self._asked.get(realm_id, 0)
            return self._cond.wait_for(lambda: self._done.get(realm_id, 0) >= asked, timeout_s)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    if not self._cond.wait_for(lambda: self._queued, IDLE_S):
                        return
                    realm_id = self._queued.pop(0)
                    asked = self._asked.get(realm_id, 0)
                try:
                    self._refresh(realm_id)
                finally:
                    with self._cond:
                        self._done[realm_id] = asked
                        self._cond.notify_all()
        finally:
            with self._cond:
                self._worker = None  # the next soon() starts another: no thread idles for good
                if self._queued:  # asked for as this one left (or a refresh raised): keep the queue moving
                    self._worker = threading.Thread(target=self._run, name="realm-index", daemon=True)
                    self._worker.start()
