"""Recall: dense + BM25 (+ identifier) legs, reciprocal rank fusion, identifier-first order,
recency weighting, optional cross-encoder rerank, neighbouring turns attached."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from shared.engine.embedder import Embedder
from shared.engine.identifiers import count_identifiers, identifier_pattern, query_identifiers
from shared.engine.memory_reader import Mask, MemoryReader
from shared.engine.reranker import Reranker
from shared.engine.store import Row

RRF_K = 60
# Without a cross-encoder the fused scores are close together, so a full half-life decay would
# let any recent weak match bury an older exact one. Recency may discount a hit by at most this
# share of its score: it orders near-ties by date, it does not override relevance.
RECENCY_SHARE = 0.25
RERANK_POOL_FACTOR = 4
NEIGHBOUR_PREVIEW_CHARS = 160  # funes shows neighbours as previews of this many code points


class DeadlineExceeded(Exception):
    """The caller stopped waiting: the search gives its worker back at the next stage."""


def check_deadline(deadline: float | None) -> None:
    """`deadline` is a time.monotonic() value; None means no limit."""
    if deadline is not None and time.monotonic() > deadline:
        raise DeadlineExceeded()


@dataclass(frozen=True)
class RecallParams:
    k: int = 8
    candidates: int = 30
    half_life_days: float = 30.0
    neighbors: int = 1
    block_type: str | None = None
    harness: str | None = None


@dataclass
class Hit:
    row: Row
    score: float
    neighbours: list[Row] = field(default_factory=list)


_QUOTE_STRIP = re.compile(r'["\\]')
_HAS_WORD = re.compile(r"[^\W_]", re.UNICODE)


def bm25_query_text(query: str) -> str:
    """Quote every whitespace-separated word so tantivy's parser accepts any user text.

    `MT-4471` then becomes the positional phrase `mt 4471`; words with no letter or digit
    are dropped (calibration: this made 20,000 random strings parse).
    """
    words = [_QUOTE_STRIP.sub("", w) for w in query.split()]
    return " ".join(f'"{w}"' for w in words if _HAS_WORD.search(w))


def _bm25_leg(reader: MemoryReader, text: str, limit: int, mask: Mask) -> list[int]:
    if not text:
        return []
    try:
        query = reader.store.fts.parse_query(text, ["text"])
    except ValueError:
        return []
    out: list[int] = []
    # Ask for more than needed: dead or filtered-out docs are dropped after the search.
    for row_id, _ in reader.store.bm25(query, limit * 2 + 10):
        if reader.passes(row_id, mask):
            out.append(row_id)
            if len(out) == limit:
                break
    return out


def _recency(epoch: float | None, now: float, half_life_days: float) -> float:
    if half_life_days <= 0 or epoch is None:
        return 1.0
    age_days = max(now - epoch, 0.0) / 86400.0
    return 1.0 - RECENCY_SHARE + RECENCY_SHARE * 0.5 ** (age_days / half_life_days)


def recall(
    reader: MemoryReader,
    embedder: Embedder,
    query: str,
    params: RecallParams,
    reranker: Reranker | None = None,
    now: float | None = None,
    deadline: float | None = None,
) -> list[Hit]:
    query = query.strip()
    if not query:
        return []
    qvec = embedder.embed_query(query)
    now = time.time() if now is None else now
    with reader.fresh():  # no lock while searching: concurrent calls on one memory run side by side
        check_deadline(deadline)
        mask = reader.filter_mask(params.block_type, params.harness)
        c = params.candidates
        idents = query_identifiers(query)
        fused: dict[int, float] = {}
        for leg in (reader.nearest(qvec, c, mask), _bm25_leg(reader, bm25_query_text(query), c, mask)):
            for rank, row_id in enumerate(leg):
                fused[row_id] = fused.get(row_id, 0.0) + 1.0 / (rank + RRF_K)
        if idents:
            # Chunks holding the identifiers join the pool even when both legs missed them, but
            # add no score: the identifier-first order below already favours them.
            for row_id in _bm25_leg(reader, " ".join(f'"{i}"' for i in idents), c, mask):
                fused.setdefault(row_id, 0.0)
        rows = reader.store.rows(list(fused))
        patterns = [identifier_pattern(i) for i in idents]
        ident_hits = {rid: count_identifiers(rows[rid].text, patterns) for rid in rows} if patterns else {}
        pool = sorted(rows, key=lambda rid: (ident_hits.get(rid, 0), fused[rid]), reverse=True)[:c]

        if reranker is not None and len(pool) >= RERANK_POOL_FACTOR * params.k:
            check_deadline(deadline)  # the cross-encoder is the costliest stage
            base = dict(zip(pool, reranker.scores(query, [rows[r].text for r in pool]).tolist()))
        else:
            base = {rid: fused[rid] for rid in pool}
        scored = {rid: base[rid] * _recency(reader.epoch_of(rid), now, params.half_life_days) for rid in pool}
        ranked = sorted(pool, key=lambda rid: (ident_hits.get(rid, 0), scored[rid]), reverse=True)
        hits = [Hit(rows[rid], scored[rid]) for rid in _select_hits(ranked, rows, params.k, params.neighbors)]
        if params.neighbors > 0:
            for hit in hits:
                r = hit.row
                hit.neighbours = [
                    n for n in reader.store.session_rows(r.session_id, r.seq - params.neighbors, r.seq + params.neighbors)
                    if n.turn_uuid != r.turn_uuid
                ]
        return hits


def _select_hits(ranked: list[int], rows: dict[int, Row], k: int, neighbors: int) -> list[int]:
    """Top k, skipping what an earlier hit already shows in full: a repeated text (chats repeat
    short lines such as "thanks, check K-012 too" across sessions) or a short turn that is an
    earlier hit's neighbour and so already visible in its preview."""
    seen: set[str] = set()
    shown: list[Row] = []
    out: list[int] = []
    for rid in ranked:
        row = rows[rid]
        key = " ".join(row.text.split()).casefold()
        if key in seen:
            continue
        if len(row.text) <= NEIGHBOUR_PREVIEW_CHARS and any(
                h.session_id == row.session_id and h.turn_uuid != row.turn_uuid and abs(h.seq - row.seq) <= neighbors
                for h in shown):
            continue
        seen.add(key)
        shown.append(row)
        out.append(rid)
        if len(out) == k:
            break
    return out


def turn_window(reader: MemoryReader, session_id: str, turn_uuid: str, window: int) -> list[Row] | None:
    """Every chunk of the turns within `window` seqs of the target, or None if it is unknown."""
    target = reader.store.turn_rows(session_id, turn_uuid)
    if not target:
        return None
    seq = target[0].seq
    return reader.store.session_rows(session_id, seq - window, seq + window)
