"""The engine's read side as one object: models loaded once, a reader per memory kept warm.

The CLI (one call per process), the stdio MCP server (one process per tenant) and the recall
service's embedded mode (one process, many tenants) all go through `Engine`, so they return
the same bytes for the same memory and query.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from shared.engine import agent_format
from shared.engine.embedder import Embedder, embedder_for_stamp, shared_embedder
from shared.engine.hybrid_search import RecallParams, check_deadline, recall, turn_window
from shared.engine.memory_reader import MemoryReader
from shared.engine.reranker import Reranker, configured_reranker, reranker_status
from shared.engine.store import DB_NAME, MemoryStore

NO_INDEX = "no index yet — run `recall-engine index --yes <src>` (or `funes index`), then recall your own history"


class NoIndex(Exception):
    def __init__(self, path: Path) -> None:
        super().__init__(NO_INDEX)
        self.path = path


class MemoryState(Enum):
    ABSENT = "absent"
    READY = "ready"


def memory_state(path: Path) -> MemoryState:
    return MemoryState.READY if MemoryStore.exists(path) else MemoryState.ABSENT


@dataclass
class _Cached:
    reader: MemoryReader
    inode: int


class Engine:
    def __init__(self, max_readers: int = 256, embedder: Embedder | None = None, reranker: Reranker | None = None) -> None:
        self.embedder = embedder or shared_embedder()
        self.reranker = reranker if reranker is not None else configured_reranker()
        self.max_readers = max_readers
        self._readers: OrderedDict[Path, _Cached] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = 0

    # ---- reader cache ----------------------------------------------------------------------
    def reader(self, memory: Path) -> MemoryReader:
        """The warm reader of a memory; a memory rebuilt under the same path gets a fresh one."""
        memory = memory.resolve()
        try:
            inode = (memory / DB_NAME).stat().st_ino
        except FileNotFoundError:
            self.drop(memory)
            raise NoIndex(memory) from None
        with self._lock:
            cached = self._readers.get(memory)
            if cached is not None and cached.inode == inode:
                self._readers.move_to_end(memory)
                return cached.reader
        reader = MemoryReader(memory)
        with self._lock:
            old = self._readers.pop(memory, None)
            self._readers[memory] = _Cached(reader, inode)
            while len(self._readers) > self.max_readers:
                _, evicted = self._readers.popitem(last=False)
                evicted.reader.close()
                self.evictions += 1
        if old is not None:
            old.reader.close()
        return reader

    def drop(self, memory: Path) -> None:
        with self._lock:
            cached = self._readers.pop(memory.resolve(), None)
        if cached is not None:
            cached.reader.close()

    @property
    def open_readers(self) -> int:
        return len(self._readers)

    # ---- commands ----------------------------------------------------------------------------
    def recall(self, memory: Path, query: str, params: RecallParams, label: str | None = None,
               deadline: float | None = None) -> str:
        """`deadline` (time.monotonic()): past it the search stops between stages, DeadlineExceeded."""
        check_deadline(deadline)
        reader = self.reader(memory)
        hits = recall(reader, self.embedder_of(reader), query, params, self.reranker, deadline=deadline)
        return agent_format.render_recall(hits, label or str(memory))

    def embedder_of(self, reader: MemoryReader) -> Embedder:
        """The model the memory was built with: the configured one, or (until the memory is
        re-embedded) the built-in model of its stamp; any other memory is refused, never mixed."""
        if reader.model_id == self.embedder.spec.model_id and reader.dim == self.embedder.dim:
            return self.embedder
        own = embedder_for_stamp(reader.model_id)
        if own is None or own.dim != reader.dim:
            reader.store.check_model(self.embedder.spec.model_id, self.embedder.dim)  # raises ModelMismatch
        assert own is not None
        return own

    def get(self, memory: Path, session_id: str, turn_uuid: str, window: int = 3) -> str:
        rows = turn_window(self.reader(memory), session_id, turn_uuid, window)
        return agent_format.render_get(rows, session_id, turn_uuid)


def status_text(memory: Path, label: str | None = None) -> str:
    """funes' status block, plus the model stamp and whether a reranker is configured."""
    label = label or str(memory)
    if memory_state(memory) is MemoryState.ABSENT:
        return f"memory: {label}\n{NO_INDEX}\n{reranker_status()}\n"
    store = MemoryStore.open(memory)
    try:
        chunks, sessions = store.counts()
        meta = store.meta()
    finally:
        store.close()
    lines = [f"memory: {label}", f"chunks: {chunks}", f"sessions: {sessions}"]
    if meta.get("last_indexed"):
        lines.append(f"last indexed: {_when(meta['last_indexed'])}")
    lines.append(f"embedding model: {meta.get('model_id')} (dim {meta.get('dim')})")
    lines.append(reranker_status())
    return "\n".join(lines) + "\n"


def _when(stamp: str) -> str:
    t = time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
    age = max(0, int(time.time() - t))
    if age < 60:
        ago = "just now"
    elif age < 3600:
        ago = _plural(age // 60, "minute")
    elif age < 48 * 3600:
        ago = _plural(age // 3600, "hour")
    else:
        ago = _plural(age // 86400, "day")
    return f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(t))} UTC ({ago})"


def _plural(n: int, unit: str) -> str:
    return f"{n} {unit}{'' if n == 1 else 's'} ago"
