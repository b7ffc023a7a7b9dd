"""The index queue that refreshes realm indexes after a write has answered (index_queue.py)."""

from __future__ import annotations

import threading
import time

from services.recall.artifacts.index_queue import IndexQueue
from tests.conftest import wait_until


def test_refreshes_asked_for_while_one_runs_are_taken_once_after_it_by_the_same_thread():
    """Writes arriving while a realm's refresh runs need one more refresh, not one each (the outbox
    carries every change along); a waiting search returns only once that one has run; and a
    worker that just finished takes the next write itself (one thread, one database connection,
    not one per write)."""
    gate = threading.Event()
    calls: list[tuple[str, threading.Thread]] = []

    def refresh(realm_id: str) -> None:
        calls.append((realm_id, threading.current_thread()))
        if len(calls) == 1:
            gate.wait(10)

    queue = IndexQueue(refresh)
    queue.soon("acme")
    assert wait_until(lambda: len(calls) == 1, 10)
    for realm_id in ("acme", "acme", "billing", "acme"):
        queue.soon(realm_id)
    assert not queue.wait("acme", 0.2), "a refresh begun before the later writes does not cover them"
    gate.set()
    assert queue.wait("acme", 10) and queue.wait("billing", 10)
    assert [realm_id for realm_id, _ in calls] == ["acme", "acme", "billing"]
    time.sleep(0.2)
    queue.soon("billing")
    assert queue.wait("billing", 10)
    assert len(calls) == 4 and all(thread is calls[0][1] for _, thread in calls)


def test_a_search_does_not_wait_for_refreshes_the_start_up_sweep_queued():
    """The sweep queues up to 1,000 realms at start; a search of one far down the queue waited
    its whole 20 s (holding a realm thread), though it catches up from the outbox itself."""
    gate = threading.Event()
    queue = IndexQueue(lambda realm_id: gate.wait(10))
    for realm_id in ("first", "behind"):
        queue.soon(realm_id, awaited=False)
    started = time.monotonic()
    assert queue.wait("behind", 5) and time.monotonic() - started < 1
    queue.soon("behind")  # a write of this process: its search waits for it
    assert not queue.wait("behind", 0.2)
    gate.set()
    assert queue.wait("behind", 10)
