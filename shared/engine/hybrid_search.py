"""Recall: a stemmed BM25 leg and a dense leg fused by their normalised scores, an identifier
boost, recency weighting, a relevance floor, optional cross-encoder rerank, neighbours attached.

Why score fusion and not reciprocal rank fusion: on LoCoMo (issue 10) plain RRF makes stemmed
BM25 *worse* (it throws away how far ahead the best BM25 match is), while min-max score fusion
with a light dense weight beats both legs. How light depends on how good the dense leg is, so
the weight is per embedding model (like the relevance floor): 0.3 for MiniLM, 0.4 for e5.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import cache, reduce
from operator import or_
from typing import NamedTuple

import numpy as np

from shared.engine.embedder import E5_STAMPS, Embedder, query_model_busy
from shared.engine.identifiers import IdentifierPattern, query_identifiers
from shared.engine.memory_reader import Mask, MemoryReader
from shared.engine.relevance_floor import floor_for
from shared.engine.reranker import Reranker
from shared.engine.store import Row
from shared.engine.text_analysis import ANALYZER, STEMMED_ANALYZERS, phrase, query_clauses, query_terms, scripts

RRF_K = 60  # only the benchmarks' plain-RRF baseline uses it
# Share of the dense leg in the fused score, per embedding model (docs/benchmarks.md, "Engine v2
# quality"). MiniLM, LoCoMo R@3 / R@8 with legs C deep: 0.2 0.717 / 0.841, 0.3 0.706 / 0.838,
# 0.4 0.697 / 0.835. multilingual-e5-small, whose dense leg alone is ~10 points of R@8 better:
# 0.3 0.754 / 0.864, 0.35 0.754 / 0.868, 0.4 0.748 / 0.872, 0.45 0.742 / 0.866, and on the
# synthetic paraphrases 0.4 lifts long 0.928 -> 0.937 and bare 0.820 -> 0.845 hit@3.
# An uncalibrated model gets the default.
DENSE_WEIGHT = 0.3
DENSE_WEIGHTS: dict[str, float] = {stamp: 0.4 for stamp in E5_STAMPS.values()}  # both of e5's graphs
# A hit holding every identifier of the query gains this much: enough to lift it over the
# template-alike turns about other units, while the rest of the query still orders the turns
# that all hold the identifier (issue 10: a hard identifier-first sort let a chatter mention win).
IDENTIFIER_BOOST = 0.5
# The earliest turns (by date) of the identifier leg read to find one holding every identifier
# of the query (a phrase match may be a look-alike: `MT 4471` in "MT 4471-B").
FIRST_MENTION_TRIES = 5
# Without a cross-encoder the fused scores are close together, so a full half-life decay would
# let any recent weak match bury an older exact one. Recency may discount a hit by at most this
# share of its score: it orders near-ties by date, it does not override relevance.
RECENCY_SHARE = 0.25
# Each leg looks at least this deep, even when the pool kept is smaller: min-max normalisation
# over a short list flattens real gaps, and session evidence needs the session's other turns
# (LoCoMo, k=3 from 8: R@3 0.706 -> 0.718 alone, 0.733 with the session lift).
MIN_LEG_DEPTH = 30
# A turn gains this share of the fused scores of the other turns of its session in the legs:
# answers cluster in the session where the topic was discussed (LoCoMo R@3 +2.0, R@8 +1.4
# points; 0.1-0.2 flat, 0.5 hurts). A lift from the adjacent turns alone, the old skip of hits
# already visible as a neighbour, and pseudo-relevance feedback on the BM25 leg measured flat
# or worse and are not used.
SESSION_WEIGHT = 0.2
# Conversation-level evidence (a document score beside the passage score): a question without
# an identifier often names a machine and a site that one turn of the right conversation holds
# and a person that another turn holds, so no single turn matches best. Each turn therefore gains
# CONVERSATION_WEIGHT times the share of the query's information (idf of its BM25 clauses that
# occur in the memory) held by the turn together with its conversation's best CONVERSATION_TURNS
# turns among the query's top CONVERSATION_DEPTH BM25 hits (judged for the CONVERSATION_SESSIONS
# conversations whose such turns score most); the best turn of the CONVERSATION_POOL
# conversations holding the most becomes a candidate (fused score 0, so only its lifts can rank
# it into the pool) even when neither leg's top list had it.
# Measured (e5; docs/benchmarks.md "Fourth pass: conversation-level evidence"): weight 0 / 0.2 /
# 0.4 / 0.6 / 0.8 / 1.2 give LoCoMo R@3 0.762 / 0.772 / 0.781 / 0.779 / 0.780 / 0.765 and R@8
# 0.884 / 0.883 / 0.888 / 0.883 / 0.883 / 0.874; at 0.4 every sample's R@3 gains or holds and
# R@8 holds but one question on one sample (multi-hop R@8 0.823 -> 0.809, single-hop 0.923 ->
# 0.938); 0.8 costs multi-hop 0.787 (answers spread over sessions). Synthetic bare hit@3 at 0 /
# 0.4 / 0.8: 1k 0.840 / 0.885 / 0.910, 10k 0.367 / 0.482 / 0.576; long unchanged. Judging 10
# conversations instead of 30 lost 2 LoCoMo questions of R@8 (at weight 0.8), counting 2 turns
# instead of 3 lost R@3 (0.767 vs 0.780). A BM25 turn-sum per conversation instead of the
# clause share cost synthetic long questions 2-5 points at 10k. CPU: ~1.2 ms per warm call at
# 10k (bench/conversation_cpu.py, ranking 3.1 -> 4.3 ms on a quiet machine: one BM25 search
# 300 deep instead of 30, ~60 more rows read, ~70 turns' stems intersected with the query's).
CONVERSATION_DEPTH = 300
CONVERSATION_TURNS = 3
CONVERSATION_SESSIONS = 30
CONVERSATION_WEIGHT = 0.4
CONVERSATION_POOL = 3
RERANK_POOL_FACTOR = 4
# Neighbour previews show the agent turns it has not read yet, reading the answer top down. The
# answer holds as many previews as funes' seq window would give its hits, but never a turn read
# above (a better hit, or any earlier preview); every hit first gets its unread turns within the
# window, then the previews left over go, nearest first and best hit first, to turns up to this
# many windows out. LoCoMo (e5 int8, k=8): R@8 0.859 -> 0.875, R@3 0.755 -> 0.767, each of the
# five samples equal or better, 4,702 -> 4,670 characters per answer. A hit further down *is*
# previewed beside a better one (read there first): skipping it there too gave LoCoMo R@8 0.880
# but split a unit's fact from its request in the synthetic set (English long hit@3 0.946 -> 0.845)
# and in any answer cut to its top passages. 1 = no preview moves out of the window.
NEIGHBOUR_REACH = 2
NEIGHBOUR_PREVIEW_CHARS = 160  # funes shows neighbours as previews of this many code points
# BM25's best turns asked whether one holds every word of the query (`_one_turn_holds_every_word`):
# a turn holding them all ranks near the top of the leg.
BM25_TURNS_FOR_WORDS = 10


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
    # Say "no results" when nothing passes the embedder's relevance floor. The agent-facing
    # entry points (CLI, stdio MCP, the recall service's embedded backend) turn it on.
    floor: bool = False
    # With the floor on, an answer shows only passages that hold a query word, clear its bar or
    # are in another script (RelevanceFloor.shows); `fill` also lets the others fill k places: a
    # question naming a time wants that time's passages for their date, whatever their words.
    fill: bool = False
    explain: bool = False  # attach how each hit was scored (Hit.explain)


@dataclass
class Explain:
    dense_rank: int | None = None
    dense_score: float | None = None
    bm25_rank: int | None = None
    bm25_score: float | None = None
    fused: float = 0.0
    session_lift: float = 0.0
    conversation: float = 0.0
    identifier_boost: float = 0.0
    recency: float = 1.0
    reranked: float | None = None
    dense_weight: float = DENSE_WEIGHT
    first_mention: bool = False  # shown first: the identifier's first mention (_first_mention)

    def line(self) -> str:
        def leg(name: str, rank: int | None, score: float | None) -> str:
            return f"{name} -" if rank is None else f"{name} #{rank + 1} {score:.3f}"

        parts = [leg("dense", self.dense_rank, self.dense_score), leg("bm25", self.bm25_rank, self.bm25_score),
                 f"fused {self.fused:.3f} (dense weight {self.dense_weight})", f"session +{self.session_lift:.3f}",
                 f"conversation +{self.conversation:.3f}",
                 f"identifier +{self.identifier_boost:.2f}"]
        if self.reranked is not None:
            parts.append(f"cross-encoder {self.reranked:.3f}")
        parts.append(f"recency x{self.recency:.3f}")
        if self.first_mention:
            parts.append("first mention of the identifier")
        return " | ".join(parts)


@dataclass
class Hit:
    row: Row
    score: float
    neighbours: list[Row] = field(default_factory=list)
    explain: Explain | None = None
    # Here only because RecallParams.fill let it fill a place: the floor would not show it (no
    # query word, under the bar). Wanted only for its date, if it is from the query's time.
    filler: bool = False


@dataclass(frozen=True)
class Legs:
    dense: list[tuple[int, float]]
    bm25: list[tuple[int, float]]
    bm25_deep: list[tuple[int, float]] = field(default_factory=list)  # for conversation evidence
    # The best BM25 score of a turn the leg left out, 0 when it holds every turn with a query word.
    bm25_floor: float = 0.0


_QUOTE_STRIP = re.compile(r'["\\]')
_HAS_WORD = re.compile(r"[^\W_]", re.UNICODE)


def bm25_query_text(query: str, analyzer: str = ANALYZER) -> str:
    """The query for tantivy's parser: every term quoted, so any user text parses.

    With the current analyzer the terms are the query's stems without stop words
    (text_analysis); a memory indexed before stemming gets its plain words, as it was built.
    An empty string means nothing to search.
    """
    if analyzer in STEMMED_ANALYZERS:
        return " ".join(f'"{t}"' for t in query_clauses(query))
    words = [_QUOTE_STRIP.sub("", w) for w in query.split()]
    return " ".join(f'"{w}"' for w in words if _HAS_WORD.search(w))


def bm25_leg(reader: MemoryReader, text: str, limit: int, mask: Mask) -> list[tuple[int, float]]:
    if not text:
        return []
    try:
        query = reader.store.fts.parse_query(text, ["text"])
    except ValueError:
        return []
    # Ask for more than needed: dead or filtered-out docs are dropped after the search.
    return reader.bm25(query, limit * 2 + 10, limit, mask)


def dense_weight_for(model_id: str) -> float:
    return DENSE_WEIGHTS.get(model_id, DENSE_WEIGHT)


def _minmax(leg: list[tuple[int, float]], lo: float | None = None) -> dict[int, float]:
    """Scores to [0, 1] within the leg, from `lo` (default: its last score); a row the leg did
    not return counts as 0."""
    if not leg:
        return {}
    hi, lo = leg[0][1], leg[-1][1] if lo is None else lo
    span = hi - lo
    return {rid: (s - lo) / span if span > 0 else 1.0 for rid, s in leg}


def fuse(legs: Legs, dense_weight: float = DENSE_WEIGHT) -> dict[int, float]:
    dense, bm25 = _minmax(legs.dense), _minmax(legs.bm25, legs.bm25_floor)
    if not bm25:  # no query word occurs in the memory: the dense leg alone orders the pool
        return dense
    return {rid: (1 - dense_weight) * bm25.get(rid, 0.0) + dense_weight * dense.get(rid, 0.0)
            for rid in dense.keys() | bm25.keys()}


def _recency(epoch: float | None, now: float, half_life_days: float) -> float:
    if half_life_days <= 0 or epoch is None:
        return 1.0
    age_days = max(now - epoch, 0.0) / 86400.0
    return 1.0 - RECENCY_SHARE + RECENCY_SHARE * 0.5 ** (age_days / half_life_days)


def search_legs(reader: MemoryReader, qvec: np.ndarray, query: str, candidates: int, mask: Mask,
                bm25_depth: int = 0) -> Legs:
    """Both legs, each its top `candidates` with raw scores (call inside `reader.fresh()`), and
    the BM25 leg's top `bm25_depth` when that is deeper (one search)."""
    bm25, deep, floor = bm25_legs(reader, query, candidates, mask, bm25_depth)
    return Legs(reader.nearest_scored(qvec, candidates, mask), bm25, deep, floor)


def bm25_legs(reader: MemoryReader, query: str, candidates: int, mask: Mask,
              bm25_depth: int = 0) -> tuple[list[tuple[int, float]], list[tuple[int, float]], float]:
    """The BM25 leg's top `candidates`, its top `bm25_depth` and its floor (Legs.bm25_floor),
    from one search."""
    bm25 = bm25_leg(reader, bm25_query_text(query, reader.fts_analyzer), max(candidates + 1, bm25_depth), mask)
    return bm25[:candidates], bm25[:bm25_depth], bm25[candidates][1] if len(bm25) > candidates else 0.0


@dataclass(frozen=True)
class QueryClauses:
    """The query's BM25 clauses (stems; a phrase for a joined word with a number) and the
    information each carries (BM25's idf in this memory)."""

    clauses: list[tuple[str, ...]]
    idf: list[float]
    total: float  # sum of idf
    stems: frozenset[str]  # every stem of every clause
    # Clause i as bit i: by stem for the one-stem clauses (most), listed for the phrases.
    single: dict[str, int]
    phrases: list[tuple[int, tuple[str, ...]]]

    @classmethod
    def of(cls, reader: MemoryReader, query: str) -> "QueryClauses":
        clauses = [tuple(c.split()) for c in query_clauses(query)]
        terms = sorted({t for c in clauses for t in c})
        n, freqs = reader.store.doc_freqs(terms)
        df = dict(zip(terms, freqs))
        # A clause no turn holds weighs nothing: it cannot tell one conversation from another.
        idf = [math.log(1 + (n - m + 0.5) / (m + 0.5)) if m else 0.0 for m in (min(df[t] for t in c) for c in clauses)]
        single: dict[str, int] = {}
        for i, c in enumerate(clauses):
            if len(c) == 1:
                single[c[0]] = single.get(c[0], 0) | 1 << i
        phrases = [(1 << i, c) for i, c in enumerate(clauses) if len(c) != 1]
        return cls(clauses, idf, sum(idf), frozenset(terms), single, phrases)

    def covered(self, held: frozenset[str]) -> int:
        """Which clauses a turn holds, as BM25 sees it (`held`: its `held_stems`, from its text
        and its date in words): bit i set for clause i, so a conversation's clauses are its
        turns' OR. Asked of ~100 turns per recall: it looks up the few stems a turn holds."""
        if not held:
            return 0
        single = self.single
        bits = 0
        for stem in held:
            bits |= single.get(stem, 0)
        for bit, phrase_stems in self.phrases:
            if held.issuperset(phrase_stems):
                bits |= bit
        return bits

    def share(self, covered: int) -> float:
        return sum(w for i, w in enumerate(self.idf) if covered >> i & 1) / self.total if self.total > 0 else 0.0


@dataclass
class ConversationEvidence:
    """Per conversation (session code) the turns it is judged by: its best CONVERSATION_TURNS
    turns among the query's top CONVERSATION_DEPTH BM25 hits, for the CONVERSATION_SESSIONS
    conversations whose such turns score most."""

    turns: dict[int, list[int]]  # in order of the turns' summed BM25 score, best first


def conversation_candidates(reader: MemoryReader, deep: list[tuple[int, float]], mask: Mask) -> ConversationEvidence:
    codes = reader.sessions_of([rid for rid, _ in deep], mask).tolist()
    # Hits come best first, so each conversation's turns are listed best first, and conversations
    # in the order their best turn ranks (dicts keep insertion order; the sort below is stable).
    turns: dict[int, list[int]] = {}
    totals: dict[int, float] = {}
    for (rid, score), code in zip(deep, codes):
        if code <= 0:
            continue
        judged = turns.setdefault(code, [])
        if len(judged) < CONVERSATION_TURNS:
            judged.append(rid)
            totals[code] = totals.get(code, 0.0) + score
    order = [code for code in sorted(totals, key=totals.__getitem__, reverse=True)[:CONVERSATION_SESSIONS]
             if totals[code] > 0]
    return ConversationEvidence({code: turns[code] for code in order})


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
    now = time.time() if now is None else now
    with reader.fresh():  # no lock while searching: concurrent calls on one memory run side by side
        check_deadline(deadline)
        mask = reader.filter_mask(params.block_type, params.harness)
        c = params.candidates
        # The query model runs one call's query at a time (query_batching.py). A call that finds
        # it busy does its word-based work first instead of waiting: its core searches while the
        # other runs the model, and by the time it asks, the run has often ended.
        words_first = query_model_busy(embedder)
        qvec = None if words_first else _embed(embedder, query, deadline)
        bm25, bm25_deep, bm25_floor = bm25_legs(reader, query, max(c, MIN_LEG_DEPTH), mask,
                                                CONVERSATION_DEPTH if CONVERSATION_WEIGHT > 0 else 0)
        idents = query_identifiers(query)
        # Turns holding the query's identifiers join the pool even when both legs missed them;
        # the deeper list is where the identifier's first mention is looked for.
        ident_deep = bm25_leg(reader, " ".join(f'"{phrase(i)}"' for i in idents), CONVERSATION_DEPTH, mask) if idents else []
        ident_leg = ident_deep[:c]
        # A memory indexed before stemming holds plain words: the query's stems say nothing there.
        stemmed = reader.fts_analyzer in STEMMED_ANALYZERS
        evidence = conversation_candidates(reader, bm25_deep, mask) if bm25_deep and stemmed else None
        clauses = QueryClauses.of(reader, query) if evidence else None
        if qvec is None:
            qvec = _embed(embedder, query, deadline)
        legs = Legs(reader.nearest_scored(qvec, max(c, MIN_LEG_DEPTH), mask), bm25, bm25_deep, bm25_floor)
        found = {rid for leg in (legs.dense, legs.bm25, ident_leg) for rid, _ in leg}
        judgement = _judge_conversations(reader, clauses, found, evidence, mask) if evidence and clauses else None
        # One read of the turns the pool may hold: the legs' and the best turns of the best conversations.
        rows = reader.store.rows(list(found | set(judgement.best if judgement else ())))
        dense_weight = dense_weight_for(embedder.spec.model_id)
        plain = {rid: s for rid, s in fuse(legs, dense_weight).items() if rid in rows}
        conv_lift: dict[int, float] = {}
        if judgement:
            conv_lift = judgement.lift(reader, rows, mask)
            for rid in judgement.best:
                if rid in rows:  # not forgotten since the search
                    plain.setdefault(rid, 0.0)
        fused = _session_lift(plain, rows)
        for rid in fused:
            fused[rid] += conv_lift.get(rid, 0.0)
        for rid, _ in ident_leg:
            fused.setdefault(rid, 0.0)
        boost = _identifier_boost(rows, idents)
        if params.floor and not any(boost.values()) and not _clears_floor(reader, embedder, query, legs, rows, c, mask):
            return []  # nothing close enough, or a query without a single word
        first = _first_mention(reader, query, idents, ident_deep, rows, boost, mask) if boost else None
        if first is not None:
            fused.setdefault(first, 0.0)
        pool = _best_chunk_of_each_turn(sorted(rows, key=lambda rid: fused[rid] + boost.get(rid, 0.0), reverse=True),
                                        rows)[:c]
        if first is not None and first not in pool:  # it stands for its turn
            pool = [rid for rid in pool if _turn(rows[rid]) != _turn(rows[first])] + [first]

        reranked: dict[int, float] = {}
        if reranker is not None and len(pool) >= RERANK_POOL_FACTOR * params.k:
            check_deadline(deadline)  # the cross-encoder is the costliest stage
            reranked = dict(zip(pool, reranker.scores(query, [rows[r].text for r in pool]).tolist()))
        base = reranked or {rid: fused[rid] + boost.get(rid, 0.0) for rid in pool}
        recency = {rid: _recency(reader.epoch_of(rid), now, params.half_life_days) for rid in pool}
        scored = {rid: base[rid] * recency[rid] for rid in pool}
        ranked = sorted(pool, key=scored.__getitem__, reverse=True)
        if first is not None:
            ranked = _first_then_each_conversation(first, ranked, rows, boost)
        shown: set[int] | None = None
        if params.floor:
            lexical = {rid for leg in (legs.bm25, legs.bm25_deep, ident_deep) for rid, _ in leg}
            shown = set(_shown(embedder, query, legs, rows, ranked, lexical))
            if not params.fill:
                ranked = [rid for rid in ranked if rid in shown]
        hits = [Hit(rows[rid], scored[rid], filler=shown is not None and rid not in shown)
                for rid in _select_hits(ranked, rows, params.k)]
        if params.explain:
            dense_rank = {rid: (i, s) for i, (rid, s) in enumerate(legs.dense)}
            bm25_rank = {rid: (i, s) for i, (rid, s) in enumerate(legs.bm25)}
            for hit in hits:
                rid = hit.row.row_id
                d, b = dense_rank.get(rid, (None, None)), bm25_rank.get(rid, (None, None))
                lift = conv_lift.get(rid, 0.0) if rid in plain else 0.0  # a turn only its identifier found gets none
                hit.explain = Explain(dense_rank=d[0], dense_score=d[1], bm25_rank=b[0], bm25_score=b[1],
                                      fused=plain.get(rid, 0.0), session_lift=fused[rid] - plain.get(rid, 0.0) - lift,
                                      conversation=lift, identifier_boost=boost.get(rid, 0.0), recency=recency[rid],
                                      reranked=reranked.get(rid), dense_weight=dense_weight, first_mention=rid == first)
        if params.neighbors > 0:
            _attach_neighbours(reader, hits, params.neighbors)
        return hits


def _identifier_boost(rows: dict[int, Row], idents: list[str]) -> dict[int, float]:
    """IDENTIFIER_BOOST times the share of the query's identifiers a row holds, for the rows that
    hold any (the others gain nothing). One identifier at a time over the ~70 rows: the digit test
    turns most of them away at the cost of a loop step."""
    patterns = [IdentifierPattern(i) for i in idents]
    held = Counter(rid for p in patterns for rid, row in rows.items() if p.search(row.text))
    return {rid: IDENTIFIER_BOOST * n / len(patterns) for rid, n in held.items()}


def _first_then_each_conversation(first: int, ranked: list[int], rows: dict[int, Row],
                                  boost: dict[int, float]) -> list[int]:
    """For a query the identifier alone decides (`_first_mention`): its first mention, then one
    turn holding it from each other conversation before a second from any (the short mentions of
    one conversation took every place, leaving out the postmortem that also named it), then
    the rest, each group in rank order."""
    seen = {rows[first].session_id}
    each, again, rest = [], [], []
    for rid in ranked:
        if rid == first:
            continue
        if rid not in boost:
            rest.append(rid)
        elif rows[rid].session_id in seen:
            again.append(rid)
        else:
            seen.add(rows[rid].session_id)
            each.append(rid)
    return [first, *each, *again, *rest]


def _first_mention(reader: MemoryReader, query: str, idents: list[str], deep: list[tuple[int, float]],
                   rows: dict[int, Row], boost: dict[int, float], mask: Mask) -> int | None:
    """The earliest turn holding every identifier of the query (among the identifier leg's
    CONVERSATION_DEPTH best), when the rest of the query cannot say which of the turns holding
    them is wanted: no other word of it is in any of them ("MT-4471", "status of MT-4471").
    There the ranking only weighs how short a turn is and how often its conversation repeats the
    identifier, so the chatter that mentions a ticket outranks the turn that opened it; the
    first mention is where a ticket, an order or an incident was said to be what it is. It is
    added to the rows read (`rows`, `boost`) when the ranking had not read it."""
    rest = [frozenset(c.split()) for c in query_clauses(query)]
    rest = [c for c in rest if c not in {frozenset(phrase(i).split()) for i in idents}]
    holding = {rid: rows[rid] for rid, b in boost.items() if b >= IDENTIFIER_BOOST}
    if rest and holding:
        stems = frozenset().union(*rest)
        if any(c <= held for held in reader.held_stems(holding, stems, mask).values() for c in rest):
            return None
    patterns = [IdentifierPattern(i) for i in idents]
    earliest = sorted((e, rid) for rid, _ in deep if (e := reader.epoch_of(rid)) is not None)
    for _, rid in earliest[:FIRST_MENTION_TRIES]:
        row = rows.get(rid) or reader.store.rows([rid]).get(rid)
        if row is not None and all(p.search(row.text) for p in patterns):
            rows[rid] = row
            boost[rid] = IDENTIFIER_BOOST
            return rid
    return None


class Dated(NamedTuple):
    hits: list[Hit]
    conversations: int  # how many conversations have turns in the time, shown or not


def dated(reader: MemoryReader, start: float, end: float, params: RecallParams) -> Dated:
    """The conversations with turns from `start` to `end` (epoch seconds, end excluded), most
    recent first, each by its first turn in that time, k passages with neighbours: what a
    question naming only a time ("what did we discuss last week") asks for. Fewer than k such
    conversations leave places that their later turns then fill, each past the previous
    passage's neighbours, so one conversation of the day is shown through, not by its opening;
    more than k are counted, so the answer can say that some are not shown."""
    with reader.fresh():
        mask = reader.filter_mask(params.block_type, params.harness)
        view = mask.view
        with np.errstate(invalid="ignore"):  # a turn without a date (NaN) is in no window
            positions = np.flatnonzero(mask.bits & (view.epoch >= start) & (view.epoch < end))
        positions = positions[np.argsort(view.epoch[positions], kind="stable")]  # oldest first
        ids = view.ids[positions]
        codes = reader.sessions_of(ids.tolist(), mask)
        # Array operations, not a loop per turn: "since January" may hold every turn of a tenant.
        newest_first = codes[::-1]
        _, at = np.unique(newest_first, return_index=True)  # each conversation's latest turn
        recent = newest_first[np.sort(at)][:params.k]
        # A turn once, by its first chunk: a pasted dump's pieces are not the conversation's turns.
        shown = np.isin(codes, recent)
        shown &= np.isin(ids, reader.store.turn_openings(ids[shown].tolist()))
        turns = [_spread(ids[shown & (codes == code)], params.neighbors) for code in recent.tolist()]  # oldest first
        # One passage per conversation on each pass until k: (pass, conversation), then shown by conversation.
        passes = sorted((i, c) for c, t in enumerate(turns) for i in range(min(len(t), params.k)))[:params.k]
        chosen = [int(turns[c][i]) for i, c in sorted(passes, key=lambda p: (p[1], p[0]))]
        rows = reader.store.rows(chosen)
        hits = [Hit(rows[rid], 1.0) for rid in chosen if rid in rows]
        if params.neighbors > 0:
            _attach_neighbours(reader, hits, params.neighbors)
        return Dated(hits, len(at))


def _spread(turns: np.ndarray, neighbors: int) -> np.ndarray:
    """Turns of one conversation to show as passages, in order, so that with their neighbours
    they cover it: each past the previous one's neighbours, and its last turn if the last of
    those stops short of it (three turns, one neighbour: the 1st and the 3rd)."""
    step = 2 * neighbors + 1
    picks = turns[::step]
    if len(turns) - 1 > (len(turns) - 1) // step * step + neighbors:
        picks = np.append(picks, turns[-1])
    return picks


def _embed(embedder: Embedder, query: str, deadline: float | None) -> np.ndarray:
    qvec = embedder.embed_query(query)
    check_deadline(deadline)
    return qvec


def _clears_floor(reader: MemoryReader, embedder: Embedder, query: str, legs: Legs, rows: dict[int, Row], c: int,
                  mask: Mask) -> bool:
    """The relevance floor of the embedder's model; a query without a single word never clears it."""
    def nearest() -> list[tuple[float, str]]:  # read only for a query that shares no word with the memory
        return [(cosine, rows[rid].text) for rid, cosine in legs.dense[:c] if rid in rows]

    def said() -> bool:
        return _one_turn_holds_every_word(reader, query, legs, rows, mask)

    floor = floor_for(embedder.spec.model_id)
    return bool(query_terms(query)) and floor.admits(query, legs, nearest, embedder.text_log_prob, said)


def _shown(embedder: Embedder, query: str, legs: Legs, rows: dict[int, Row], ranked: list[int],
           lexical: set[int]) -> list[int]:
    """The ranked passages the floor lets an answer show (RelevanceFloor.shows); `lexical`: the
    passages a BM25 or identifier leg found, which hold a query word. A query of one word
    (`1069.5`, `billing-stg-02`) that some passage holds shows only the passages holding it:
    e5 puts a lone number or code within the bar of unrelated turns (0.82 in a newcomer's
    trial), and the word itself, said, is what was asked for."""
    if len(query.split()) == 1 and lexical.intersection(ranked):
        return [rid for rid in ranked if rid in lexical]
    floor = floor_for(embedder.spec.model_id)
    cosine = dict(legs.dense)
    asked = scripts(query) - {"other"}
    return [rid for rid in ranked
            if floor.shows(cosine.get(rid), rid in lexical, asked, lambda rid=rid: rows[rid].text)]


def _one_turn_holds_every_word(reader: MemoryReader, query: str, legs: Legs, rows: dict[int, Row], mask: Mask) -> bool:
    """Whether one of BM25's best turns holds every clause of the query as BM25 reads them (its
    stems; every part of a joined word with a number). Stop words alone never count."""
    clauses = [frozenset(c.split()) for c in query_clauses(query)]
    if not clauses or not legs.bm25:
        return False
    stems = frozenset().union(*clauses)
    best = {rid: rows[rid] for rid, _ in legs.bm25[:BM25_TURNS_FOR_WORDS] if rid in rows}
    return any(all(c <= held for c in clauses) for held in reader.held_stems(best, stems, mask).values())


def _attach_neighbours(reader: MemoryReader, hits: list[Hit], window: int) -> None:
    """Neighbour previews, read top down: as many as the seq windows of the hits hold, none of a
    turn shown in the answer (a hit, above or below: it is shown whole) or previewed above, the
    rest spent nearest first, best hit first, up to NEIGHBOUR_REACH windows out."""
    reach = window * NEIGHBOUR_REACH
    own = {(h.row.session_id, h.row.turn_uuid) for h in hits}
    previewed: set[tuple[str, str]] = set()
    around: list[dict[str, list[Row]]] = []  # per hit: its session's turns within reach, in seq order
    budget = 0
    windows = reader.store.sessions_rows([(h.row.session_id, h.row.seq - reach, h.row.seq + reach) for h in hits])
    for hit, window_rows in zip(hits, windows):
        r = hit.row
        turns: dict[str, list[Row]] = {}
        for n in window_rows:
            if n.turn_uuid != r.turn_uuid:
                turns.setdefault(n.turn_uuid, []).append(n)
        around.append(turns)
        budget += sum(1 for chunks in turns.values() if abs(chunks[0].seq - r.seq) <= window)
    chosen: list[set[str]] = [set() for _ in hits]
    for distance in range(1, reach + 1):
        for hit, turns, mine in zip(hits, around, chosen):
            for turn, chunks in turns.items():
                key = (hit.row.session_id, turn)
                # A hit is never a preview: its opening would be read twice, spending the answer's characters.
                if budget and abs(chunks[0].seq - hit.row.seq) == distance and key not in previewed and key not in own:
                    mine.add(turn)
                    previewed.add(key)
                    budget -= 1
    for hit, turns, mine in zip(hits, around, chosen):
        hit.neighbours = [n for turn, chunks in turns.items() if turn in mine for n in chunks]


def _session_lift(fused: dict[int, float], rows: dict[int, Row]) -> dict[int, float]:
    """Each row's score plus SESSION_WEIGHT times the scores of the session's other turns, each
    turn counted once, by its best chunk: a pasted 15 KB log is ~13 chunks of one turn, and
    summed they lifted each other over a conversation holding every word of the question."""
    best: dict[tuple[str, str], float] = {}
    for rid, score in fused.items():
        turn = _turn(rows[rid])
        best[turn] = max(best.get(turn, score), score)
    by_session: dict[str, float] = {}
    for (session, _), score in best.items():
        by_session[session] = by_session.get(session, 0.0) + score
    return {rid: score + SESSION_WEIGHT * (by_session[rows[rid].session_id] - best[_turn(rows[rid])])
            for rid, score in fused.items()}


def _turn(row: Row) -> tuple[str, str]:
    return row.session_id, row.turn_uuid


def _best_chunk_of_each_turn(ranked: list[int], rows: dict[int, Row]) -> list[int]:
    """`ranked` with only each turn's first (best) chunk: the pool holds turns, not pieces of one
    long turn, whose chunks otherwise took every place (and came back as overlapping passages)."""
    seen: set[tuple[str, str]] = set()
    out: list[int] = []
    for rid in ranked:
        if (turn := _turn(rows[rid])) not in seen:
            seen.add(turn)
            out.append(rid)
    return out


@dataclass(frozen=True)
class ConversationJudgement:
    """What each judged conversation holds of the query, and the best turn of those holding most."""

    clauses: QueryClauses
    covered: dict[int, int]  # row -> its clauses (QueryClauses.covered), for every row judged so far
    held: dict[int, int]  # conversation code -> the clauses its judged turns hold together
    best: list[int]  # the best turn of the CONVERSATION_POOL conversations holding the most

    def lift(self, reader: MemoryReader, rows: dict[int, Row], mask: Mask) -> dict[int, float]:
        """Each row's lift from its conversation: CONVERSATION_WEIGHT times the share of the
        query's information (idf) that the row and its conversation's judged turns hold between them."""
        clauses, covered = self.clauses, self.covered
        unjudged = {rid: row for rid, row in rows.items() if rid not in covered}
        if unjudged:  # rows after the snapshot, or a snapshot without stems: their text
            covered = {**covered, **{rid: clauses.covered(h) for rid, h in reader.held_stems(unjudged, clauses.stems, mask).items()}}
        codes = reader.sessions_of(list(rows), mask).tolist()
        share = cache(clauses.share)  # few distinct sets of clauses per query, ~70 rows
        return {rid: CONVERSATION_WEIGHT * share(covered[rid] | self.held.get(code, 0)) for rid, code in zip(rows, codes)}


def _judge_conversations(reader: MemoryReader, clauses: QueryClauses, found: set[int], evidence: ConversationEvidence,
                         mask: Mask) -> ConversationJudgement:
    """Which clauses each judged conversation's turns hold, from the snapshot's stems, so a judged
    turn is read from SQLite only when the snapshot has no stems for it (and then only if it is
    still there); the legs' own turns are judged in the same pass."""
    judged = [rid for turns in evidence.turns.values() for rid in turns]
    held_by_row = reader.snapshot_held(list(found.union(judged)), clauses.stems, mask)
    unread = [rid for rid in judged if rid not in held_by_row]
    if unread:
        held_by_row.update(reader.held_stems(reader.store.rows(unread), clauses.stems, mask))
    covered = {rid: clauses.covered(h) for rid, h in held_by_row.items()}
    held = {code: reduce(or_, (covered.get(rid, 0) for rid in turns), 0) for code, turns in evidence.turns.items()}
    share = cache(clauses.share)
    ranked = sorted(evidence.turns, key=lambda code: share(held[code]), reverse=True)  # stable: BM25 order on ties
    best = [evidence.turns[code][0] for code in ranked[:CONVERSATION_POOL] if evidence.turns[code][0] in held_by_row]
    return ConversationJudgement(clauses, covered, held, best)


def _select_hits(ranked: list[int], rows: dict[int, Row], k: int) -> list[int]:
    """Top k, each text once: chats repeat short lines ("thanks!") across sessions, and a
    second copy shows the agent nothing new."""
    seen: set[str] = set()
    out: list[int] = []
    for rid in ranked:
        key = " ".join(rows[rid].text.split()).casefold()
        if key in seen:
            continue
        seen.add(key)
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
