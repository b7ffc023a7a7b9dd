"""Accepted artifacts, searchable with the project's engine: one memory per realm.

Each accepted artifact is a transcript `<artifact_id>.funes.jsonl` (summary and body as turns;
its kind as the harness facet) and its appended entries, ENTRIES_PER_FILE to a transcript
`<artifact_id>.e<k>.funes.jsonl`, under `DATA_DIR/.artifacts/<sha256(realm)[:24]>/`.
It is rewritten when an artifact is accepted, appended to, superseded or revoked, and the
realm's memory re-indexed, right after the change has answered (index_queue.py), so search sees
exactly the accepted set. These memories
live apart from every user's conversation memory: neither search can return the other's data.
"""

from __future__ import annotations

import fcntl
import hashlib
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from services.recall.artifacts.models import Artifact, Entry, Status
from shared.engine.api import Engine, NoIndex
from shared.engine.hybrid_search import Hit, RecallParams
from shared.engine.relevance_floor import RelevanceFloor, floor_for
from shared.engine.index_run import index_tree
from shared.engine.reembed import needs_reembed, reembed_memory
from shared.engine.transcript import Block, TranscriptTurn, dump_transcript

# Search reads the beginning of a long body or entry: embedding costs CPU in proportion to the
# text (a 200,000-character body took ~55 s of CPU to accept, under the lock every acceptance
# of the process waits on; an MCP request carries up to 1 MiB). Reading an artifact still gives it whole.
INDEXED_CHARS = 20_000
# Entries never change once appended: an append rewrites (and the index run re-reads) the head and
# the journal's last file of entries, never the ones before it, however long the journal grows.
ENTRIES_PER_FILE = 50


EntryReader = Callable[[str, int, int], list[Entry]]  # (artifact_id, offset, limit) -> those entries, in order


def _ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _holds_a_word(hit: Hit) -> bool:
    """The lexical leg (BM25 over the query's words) or an identifier of the query found it."""
    return hit.explain is None or hit.explain.bm25_rank is not None or hit.explain.identifier_boost > 0


def about_the_query(hits: list[Hit], floor: RelevanceFloor) -> list[Hit]:
    """The passages the floor let through that are about the query. When some hold a query word,
    only those: the rest were there to fill places (an English query was padded with 16 unrelated
    artifacts). When none does (a question in another script, or off topic), only those as close
    as the floor's bar for a query sharing no word. Conversation recall also shows any passage
    written in none of the query's scripts, since a Russian question over English chats cannot
    share a word with them; a realm mixes scripts in one memory, and that let an off-topic
    Russian query show most of the realm (16 of 20 found 274 artifacts). e5 puts short journal
    entries within 0.86 of anything, so a cosine alone never keeps an artifact a query word
    would have found."""
    worded = [h for h in hits if _holds_a_word(h)]
    if worded:
        return worded
    return [h for h in hits if h.explain is not None and (h.explain.dense_score or -1.0) >= floor.without_words]


class ArtifactSearch:
    def __init__(self, data_dir: Path, engine: Engine) -> None:
        self.root = data_dir / ".artifacts"
        self.engine = engine
        # One refresh at a time per process: an index run must not list a file another refresh removes.
        self._refreshing = threading.Lock()

    def home(self, realm_id: str) -> Path:
        return self.root / hashlib.sha256(realm_id.encode()).hexdigest()[:24]

    def refresh(self, realm_id: str, current: Callable[[bool], Iterable[Artifact]], entries: EntryReader,
                wait: bool = True) -> bool:
        """Write (accepted) or remove (anything else) the transcripts of `current(False)` — the
        changed artifacts as the database has them *now*, read under the realm's lock, so a
        refresh that runs late never writes an older state over a newer one (two appends at
        once) — then index. `entries(artifact_id, offset, limit)` reads a window of an artifact's
        entries. A realm whose last refresh did not finish (the marker file stays) is brought up
        to `current(True)`, every accepted artifact, every file checked. With `wait=False` it
        returns False at once, doing nothing, when another refresh holds a lock."""
        if not self._refreshing.acquire(blocking=wait):
            return False
        try:
            with self._realm_lock(realm_id, wait) as locked:
                if locked:
                    self._refresh_locked(realm_id, current, entries)
                return locked
        finally:
            self._refreshing.release()

    def _refresh_locked(self, realm_id: str, current: Callable[[bool], Iterable[Artifact]], entries: EntryReader) -> None:
        home = self.home(realm_id)
        unfinished = home / "refresh.unfinished"
        whole = unfinished.exists()
        unfinished.touch()
        src = home / "src"
        src.mkdir(exist_ok=True)
        keep: set[str] = set()  # a whole refresh: the names of every accepted artifact's transcripts
        for a in current(whole):  # artifacts stream in pages; only their names are kept
            if a.status is Status.ACCEPTED:
                keep.update(self._write(src, a, entries, whole))
            else:
                for path in [src / f"{a.artifact_id}.funes.jsonl", *src.glob(f"{a.artifact_id}.e*.funes.jsonl")]:
                    path.unlink(missing_ok=True)
        if whole:
            for stale in src.iterdir():
                if stale.name not in keep:
                    stale.unlink(missing_ok=True)
        if needs_reembed(home, self.engine.embedder):  # after a model change
            reembed_memory(home, src, self.engine.embedder, lock_wait_s=60)
        index_tree(home, src, self.engine.embedder, lock_wait_s=60)
        unfinished.unlink()

    @contextmanager
    def _realm_lock(self, realm_id: str, wait: bool = True) -> Iterator[bool]:
        """The realm's refreshes one at a time across the processes sharing DATA_DIR; yields
        False when `wait` is False and another process holds it."""
        home = self.home(realm_id)
        home.mkdir(parents=True, exist_ok=True)
        with open(home / "refresh.lock", "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def search(self, realm_id: str, query: str, pool: int, kind: str | None = None) -> tuple[list[str], bool]:
        """Artifact ids (of `kind` only, when given), best first, from the realm's best `pool`
        passages; and whether those were all the passages there are (a larger pool finds no more)."""
        try:
            # The relevance floor of conversation recall: a query nothing in the realm is close to
            # ("xyzzy plugh", "🦓🦓") finds nothing, not the realm's artifacts in some order.
            hits = self.engine.search(self.home(realm_id) / "memory", query,
                                      RecallParams(k=pool, candidates=pool, neighbors=0, harness=kind, floor=True,
                                                   explain=True))
        except NoIndex:
            return [], True
        ordered: dict[str, None] = {}
        for hit in about_the_query(hits, floor_for(self.engine.embedder.spec.model_id)):
            ordered.setdefault(hit.row.session_id, None)
        return list(ordered), len(hits) < pool

    def _write(self, src: Path, a: Artifact, entries: EntryReader, whole: bool) -> list[str]:
        """The artifact's transcripts as the database has it; returns their names. File k of its
        entries is taken as it is when file k+1 exists: a refresh writes them in order, each whole
        once the next is begun, and entries never change (a whole refresh checks them all)."""
        head = f"{a.artifact_id}.funes.jsonl"
        names = [head] + [f"{a.artifact_id}.e{k}.funes.jsonl" for k in range(-(-a.entries_total // ENTRIES_PER_FILE))]
        self._put(src / head, self._transcript(a, [("summary", a.summary, a.updated_at, 0),
                                                   ("body", f"{a.artifact_path}\n{a.body[:INDEXED_CHARS]}", a.created_at, 1)]))
        for k, name in enumerate(names[1:]):
            if not whole and k + 2 < len(names) and (src / name).is_file() and (src / names[k + 2]).is_file():
                continue
            window = entries(a.artifact_id, k * ENTRIES_PER_FILE, ENTRIES_PER_FILE)
            self._put(src / name, self._transcript(a, [(f"entry-{e.seq}", e.body[:INDEXED_CHARS], e.created_at, 1 + e.seq)
                                                       for e in window]))
        return names

    @staticmethod
    def _put(path: Path, text: str) -> None:
        if path.is_file() and path.read_text() == text:
            return  # unchanged: the index run need not read it again
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex}.tmp"  # replicas sharing DATA_DIR never share one
        tmp.write_text(text)
        tmp.replace(path)

    @staticmethod
    def _transcript(a: Artifact, turns: list[tuple[str, str, float, int]]) -> str:
        """Turns (id, text, time, position in the artifact: summary 0, body 1, entry n at 1 + n)."""
        return dump_transcript([
            TranscriptTurn(session_id=a.artifact_id, turn_uuid=turn, seq=seq, ts=_ts(at), role="artifact",
                           harness=a.artifact_kind, blocks=[Block(text=text)])
            for turn, text, at, seq in turns
        ])
