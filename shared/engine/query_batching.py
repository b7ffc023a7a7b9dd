"""Concurrent query embeddings share model runs, as a database groups concurrent commits.

One query is one short row (10-40 tokens); a model run costs a fixed part (every node
dispatched once, every weight streamed through the cache once) plus a part per token. Two
runs side by side on a 2-core replica each slowed by ~27 % here (they stream the same weights
at once), while one run of 8 queries cost ~15 % less per query than 8 runs of one
(docs/benchmarks.md, round 13). So queries that arrive while the model is busy wait for the
run in progress to end and are then embedded together.

No timer: a caller that finds a lane free runs the model at once, so a lone query never waits;
under load each run takes the queries that queued during the previous one. Only for a model
whose rows do not affect each other (`EmbedModelSpec.rows_independent`: each token quantised
with its own scale), where a query's vector is the same alone or in a batch.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

MAX_BATCH = 16  # queries per run: beyond it a caller who leads waits too long for others' rows


@dataclass
class _Request:
    text: str
    woken: threading.Event = field(default_factory=threading.Event)
    vector: np.ndarray | None = None
    error: BaseException | None = None
    leads: bool = False  # handed a lane by the run before it


class QueryBatcher:
    """Embeds each caller's query through `run` (texts -> one vector per text), at most
    `lanes` runs at once, every run taking its caller's query and the oldest waiting ones."""

    def __init__(self, run: Callable[[list[str]], np.ndarray], lanes: int, max_batch: int = MAX_BATCH) -> None:
        self._run = run
        self._max_batch = max_batch
        self._free_lanes = lanes
        self._waiting: deque[_Request] = deque()
        self._lock = threading.Lock()
        self.runs = 0
        self.queries = 0

    @property
    def busy(self) -> bool:
        """Every lane is running: a query asked now would wait for a run to end."""
        return not self._free_lanes  # read without the lock: a hint for ordering work, not a promise

    def embed(self, text: str) -> np.ndarray:
        request = _Request(text)
        with self._lock:
            if self._free_lanes:
                self._free_lanes -= 1
                request.leads = True
            else:
                self._waiting.append(request)
        if not request.leads:
            request.woken.wait()  # served by another caller's run, or handed its lane
        if request.leads:
            self._lead(request)
        if request.error is not None:
            raise request.error
        assert request.vector is not None
        return request.vector

    def _lead(self, own: _Request) -> None:
        """Runs the model on `own` and the oldest waiting queries, then hands the lane to the
        next waiting caller (its own run then includes it), or frees it."""
        with self._lock:
            batch = [own] + [self._waiting.popleft() for _ in range(min(len(self._waiting), self._max_batch - 1))]
            self.runs += 1
            self.queries += len(batch)
        try:
            vectors = self._run([r.text for r in batch])
            for request, vector in zip(batch, vectors):
                request.vector = vector
        except BaseException as exc:  # every caller of this run gets the error, not a hang
            for request in batch:
                request.error = exc
        with self._lock:
            successor = self._waiting.popleft() if self._waiting else None
            if successor is None:
                self._free_lanes += 1
            else:
                successor.leads = True
        for request in batch[1:]:
            request.woken.set()
        if successor is not None:
            successor.woken.set()
