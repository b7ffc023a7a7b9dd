"""The engine's read side as one object: models loaded once, a reader per memory kept warm.

The CLI (one call per process), the stdio MCP server (one process per tenant) and the recall
service's embedded mode (one process, many tenants) all go through `Engine`, so they return
the same bytes for the same memory and query.
"""

from __future__ import annotations

import calendar
import contextlib
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from shared.engine import agent_format
from shared.engine.embedder import Embedder, embedder_for_stamp, shared_embedder
from shared.engine.hybrid_search import Dated, Hit, RecallParams, check_deadline, dated, recall, turn_window
from shared.engine.memory_reader import MemoryReader
from shared.engine.reranker import Reranker, configured_reranker, reranker_status
from shared.engine.store import DB_NAME, MemoryStore
from shared.engine.text_analysis import forget_cached_texts
from shared.engine.transcript import transcript_signatures

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
class _Entry:
    reader: MemoryReader
    file: tuple[int, int]  # (device, inode) of its database: a memory rebuilt in place is another file
    bytes: int
    users: int = 0  # searches holding it: it is closed only when this is 0
    retired: bool = False  # out of the cache (evicted, dropped, replaced); closed by its last user
    last_used: float = field(default_factory=time.monotonic)  # when its last search ended


class Engine:
    """Models plus a cache of warm readers, safe for any number of threads.

    One memory gets one reader however many callers race for it (the first opens it, the
    others wait for that). A reader is leased for the length of a search: eviction (past
    `max_readers` readers or `max_bytes` of vectors and indexes) and `drop` only take it out
    of the cache, and its last user closes it.
    """

    def __init__(self, max_readers: int = 256, embedder: Embedder | None = None, reranker: Reranker | None = None,
                 max_bytes: int | None = None) -> None:
        self.embedder = embedder or shared_embedder()
        self.reranker = reranker if reranker is not None else configured_reranker()
        self.max_readers = max_readers
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Path, _Entry] = OrderedDict()
        # What each path a caller named resolved to, for `_reuse` (bounded: _remember_spelling).
        self._spellings: dict[Path, Path] = {}
        self._opening: dict[Path, threading.Event] = {}
        self._lock = threading.Lock()
        self.evictions = 0
        self.readers_opened = 0

    # ---- reader cache ----------------------------------------------------------------------
    @contextlib.contextmanager
    def lease(self, memory: Path) -> Iterator[MemoryReader]:
        """The warm reader of a memory, never closed while the caller holds it; a memory
        rebuilt under the same path gets a fresh one."""
        entry = self._reuse(memory) or self._acquire(memory.resolve(), spelled=memory)
        try:
            yield entry.reader
        finally:
            self._release(entry)

    def reader(self, memory: Path) -> MemoryReader:
        """A reader without a lease, for one-thread use (CLI, tests, benchmarks): another
        thread's eviction or `drop` could close it under the caller."""
        with self.lease(memory) as reader:
            return reader

    def _reuse(self, spelled: Path) -> _Entry | None:
        """The cached reader of the memory this path led to last time, if its database is still
        the same file: a warm search then skips resolving the path (a realpath, a system call per
        component of it: ~90 us of CPU after a search's scan has left the caches cold, ~25 us
        back to back). None sends the caller the long way."""
        try:
            file = _file_of(spelled / DB_NAME)
        except FileNotFoundError:
            return None  # _acquire says what is missing
        with self._lock:
            memory = self._spellings.get(spelled)
            entry = self._entries.get(memory) if memory is not None else None
            if entry is None or entry.file != file:
                return None
            entry.users += 1
            self._entries.move_to_end(memory)
            return entry

    def _acquire(self, memory: Path, spelled: Path) -> _Entry:
        """The reader of the resolved path `memory`, opened if need be; `spelled` is the path the
        caller named, remembered for `_reuse`."""
        while True:
            try:
                file = _file_of(memory / DB_NAME)
            except FileNotFoundError:
                self.drop(memory)
                raise NoIndex(memory) from None
            with self._lock:
                self._remember_spelling(spelled, memory)
                entry = self._entries.get(memory)
                if entry is not None and entry.file == file:
                    entry.users += 1
                    self._entries.move_to_end(memory)
                    return entry
                opening = self._opening.get(memory)
                if opening is None:
                    opening = self._opening[memory] = threading.Event()
                    break
            opening.wait()  # another caller is opening this memory: use its reader
        try:
            reader = MemoryReader(memory)
            try:
                reader.refresh()  # the load happens here, outside the cache lock
            except BaseException:
                reader.close()
                raise
        except BaseException as exc:
            with self._lock:
                del self._opening[memory]
            opening.set()
            if isinstance(exc, Exception) and not MemoryStore.exists(memory):
                raise NoIndex(memory) from None  # deleted while it opened (a forget): no memory, not a fault
            raise
        entry = _Entry(reader, file, reader.resident_bytes(), users=1)
        with self._lock:
            del self._opening[memory]
            self.readers_opened += 1
            old = self._entries.pop(memory, None)
            self._entries[memory] = entry
            to_close = ([old] if old is not None and self._retire(old) else []) + self._evict(keep=memory)
        opening.set()
        for victim in to_close:
            victim.reader.close()
        return entry

    def _remember_spelling(self, spelled: Path, memory: Path) -> None:
        """Called with the lock held. The paths of memories no longer cached are let go when the
        map reaches twice the cache's bound, so it stays that small however many tenants come."""
        if len(self._spellings) >= 2 * self.max_readers:
            self._spellings = {s: m for s, m in self._spellings.items() if m in self._entries}
        self._spellings[spelled] = memory

    def _release(self, entry: _Entry) -> None:
        with self._lock:
            entry.users -= 1
            entry.last_used = time.monotonic()
            entry.bytes = entry.reader.resident_bytes()  # grows as the reader catches up
            to_close = [entry] if entry.retired and entry.users == 0 else self._evict(keep=None)
        for victim in to_close:
            victim.reader.close()

    def _evict(self, keep: Path | None) -> list[_Entry]:
        """Called with the lock held: retire LRU readers until the cache fits its bounds.
        Returns those nobody holds, for the caller to close after releasing the lock."""
        to_close = []
        for memory in list(self._entries):
            if len(self._entries) <= self.max_readers and (self.max_bytes is None or self._bytes_held() <= self.max_bytes):
                break
            if memory == keep:
                continue
            entry = self._entries.pop(memory)
            self.evictions += 1
            if self._retire(entry):
                to_close.append(entry)
        return to_close

    @staticmethod
    def _retire(entry: _Entry) -> bool:
        entry.retired = True
        return entry.users == 0

    def close_idle(self, idle_s: float) -> int:
        """Close the readers no search has used for `idle_s` seconds; how many. An open reader
        is not free while it waits: tantivy keeps a thread per open index that reads its meta
        file twice a second (1,000 open memories: 1,000 threads and ~5 % of a core on an idle
        replica), besides its descriptors and RAM. Reopening one costs milliseconds."""
        cutoff = time.monotonic() - idle_s
        with self._lock:
            idle = [memory for memory, entry in self._entries.items() if entry.users == 0 and entry.last_used < cutoff]
            to_close = [entry for entry in (self._entries.pop(memory) for memory in idle) if self._retire(entry)]
        for entry in to_close:
            entry.reader.close()
        return len(idle)

    def forget(self, memory: Path) -> None:
        """Something was deleted from a memory: drop its reader and every turn text cached from
        searches (the cache is keyed by text, not by memory, so all of it goes)."""
        self.drop(memory)
        forget_cached_texts()

    def forget_all(self) -> None:
        """`forget` for every memory at once, for a caller that may have missed which one
        changed: every reader leaves the cache (closed by its last user) and every cached text goes."""
        with self._lock:
            retired = list(self._entries.values())
            self._entries.clear()
            to_close = [entry for entry in retired if self._retire(entry)]
        for entry in to_close:
            entry.reader.close()
        forget_cached_texts()

    def drop(self, memory: Path) -> None:
        """Forget a memory's reader (its files were changed or removed); a search still
        holding it finishes first."""
        with self._lock:
            entry = self._entries.pop(memory.resolve(), None)
            close = entry is not None and self._retire(entry)
        if close:
            entry.reader.close()

    @property
    def open_readers(self) -> int:
        return len(self._entries)

    @property
    def cached_bytes(self) -> int:
        with self._lock:  # searches in other threads reorder the cache while it is summed
            return self._bytes_held()

    def _bytes_held(self) -> int:
        """Bytes of the cached readers (the lock held)."""
        return sum(e.bytes for e in self._entries.values())

    # ---- commands ----------------------------------------------------------------------------
    def search(self, memory: Path, query: str, params: RecallParams, deadline: float | None = None) -> list[Hit]:
        """`deadline` (time.monotonic()): past it the search stops between stages, DeadlineExceeded."""
        check_deadline(deadline)
        with self.lease(memory) as reader:
            return recall(reader, self.embedder_of(reader), query, params, self.reranker, deadline=deadline)

    def dated(self, memory: Path, start: float, end: float, params: RecallParams) -> Dated:
        """The conversations of a time (hybrid_search.dated): a question that names only a time."""
        with self.lease(memory) as reader:
            return dated(reader, start, end, params)

    def holds_rows(self, memory: Path) -> bool:
        """Whether the memory holds a row: one made by a first index run that has not committed
        yet holds none, and one whose every conversation was forgotten holds none."""
        with self.lease(memory) as reader, reader.fresh() as view:
            return bool(view.alive.any())

    def indexed_every_source(self, memory: Path, src: Path) -> bool:
        """Whether the memory has indexed every conversation under `src` as it is now (file name
        and signature): one without rows that has is empty for good (its conversations hold no
        text), one that has not is waiting for an index run. Names, not paths, since the indexer
        may see the shared volume mounted elsewhere."""
        with self.lease(memory) as reader, reader.store.lock:
            known = {Path(path).name: signature for path, signature in reader.store.sources().items()}
        listed = transcript_signatures(src)
        return bool(listed) and all(known.get(Path(path).name) == signature for path, signature in listed.items())

    def recall(self, memory: Path, query: str, params: RecallParams, label: str | None = None,
               deadline: float | None = None) -> str:
        return agent_format.render_recall(self.search(memory, query, params, deadline), label or str(memory))

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
        with self.lease(memory) as reader:
            rows = turn_window(reader, session_id, turn_uuid, window)
        return agent_format.render_get(rows, session_id, turn_uuid)


def _file_of(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino


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


def chunk_count(memory: Path, session_id: str | None = None) -> int:
    """Chunks the memory holds (of one session when given); 0 when there is no memory."""
    if memory_state(memory) is MemoryState.ABSENT:
        return 0
    store = MemoryStore.open(memory)
    try:
        return store.counts()[0] if session_id is None else store.session_chunks(session_id)
    finally:
        store.close()


def _when(stamp: str) -> str:
    t = calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))  # a UTC stamp, whatever the host's zone
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
