"""When to answer "no results": nothing in the memory is close enough to the query.

The dense leg's best cosine is the one signal comparable across memories (BM25 scores are
not: they depend on the memory's size and word statistics). How close is "close enough" depends
on the embedding model, so the floor is keyed by the model id a memory is stamped with. A query
none of whose words occurs in the memory (gibberish, a topic never discussed) must clear a
higher bar than one that shares words with some turn, and must read as language to the
model's tokenizer; a question in another script than the memory's passages shares no word by
necessity and faces the lower bar. A query whose every word one turn holds is answered whatever
the cosine: the words were said (a codename said once in a turn of several sentences sits under
the bar by cosine).

Calibration (bench/locomo_bench.py, LoCoMo-dev): each sample's questions asked of another
sample's memory must get "no results" at least 60 % of the time, while answerable questions
lose at most one point of R@8.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.engine.embedder import E5_STAMPS, MINILM_MODEL_ID, MINILM_SHIPPED_MODEL_ID
from shared.engine.text_analysis import STOP_WORDS, scripts, words

if TYPE_CHECKING:
    from shared.engine.hybrid_search import Legs


@dataclass(frozen=True)
class RelevanceFloor:
    with_words: float  # best cosine needed when some query word occurs in the memory
    without_words: float  # best cosine needed when none does
    # When no query word occurs in the memory, whether the query reads as language at all (its
    # tokenizer's log-probability per character at least this) decides the rest: keyboard
    # mashing (and text in characters the model lacks) does not pass, however close e5's
    # squeezed cosines put it; a passage in a script the question is not written in (Russian
    # over English chats) cannot share a word with it, so BM25's silence says nothing of that
    # passage, and it faces the with-words bar. None: the model's tokenizer has no piece scores,
    # and only the cosine bars apply.
    language_log_prob: float | None = None
    # Likewise a query of nothing but character runs ("aaaaaaaa", "hahaha", "zzzz"): tokenizers
    # score such runs as plausible text (-2.7 per character) and e5 puts them at 0.85-0.87 from
    # short chat turns ("thanks"), yet they ask for nothing.
    refuse_runs: bool = True

    def admits(self, query: str, legs: "Legs", nearest: Callable[[], list[tuple[float, str]]],
               log_prob: Callable[[str], float | None], said: Callable[[], bool]) -> bool:
        """Whether the best passage is close enough to answer `query`; `nearest` gives the dense
        leg's best passages (cosine, text), `log_prob` the query's log-probability per character,
        `said` whether one turn holds every word of the query (asked only when the cosine falls
        short)."""
        best = legs.dense[0][1] if legs.dense else -1.0
        # Stop words alone ("the", "and then") ask for nothing: every turn holds them, and e5 puts
        # "the" past both bars of short turns ("thanks"), as it does character runs.
        if STOP_WORDS.issuperset(words(query)):
            return False
        if legs.bm25:
            return best >= self.with_words or said()
        if self.refuse_runs and _only_character_runs(query):
            return False
        asked = scripts(query) - {"other"}  # digits alone are no script to be asked across
        # A CJK character carries a word's worth of information: real Chinese, Japanese or Korean
        # questions score -5 to -7.7 per character, as low as CJK mashing; they keep the cosine bars.
        score = log_prob(query) if self.language_log_prob is not None and "cjk" not in asked else None
        if score is None:
            return best >= self.without_words
        if score < self.language_log_prob:
            return False
        if best >= self.without_words:
            return True
        # Each passage by the bar its script allows: in a memory of Russian and English chats, a
        # Russian question about an English one was held to the same-script bar because some
        # Russian turn was among its nearest passages, and refused (an integrator's 0 of 7).
        return any(cosine >= self.with_words and _across(asked, text) for cosine, text in nearest())

    def shows(self, cosine: float | None, holds_a_word: bool, query_scripts: set[str], text: Callable[[], str]) -> bool:
        """Whether a passage found for an answered query is shown: it holds a query word (a
        lexical leg found it), or is as close as the bar for a query that shares words, or is
        written in none of the query's scripts (it could not share a word: a Russian question
        over English turns). Otherwise it was found only because k places were there to fill: a
        codename said once came back with two passages that had nothing to do with it."""
        if holds_a_word or (cosine if cosine is not None else -1.0) >= self.with_words:
            return True
        return _across(query_scripts, text())


def _across(query_scripts: set[str], text: str) -> bool:
    """Whether `text` is written in none of the query's scripts, so it cannot share a word with it."""
    return bool(query_scripts) and not query_scripts & scripts(text)


_RUN = re.compile(r"(.{1,3}?)\1+")  # a unit of one to three characters, repeated


def _only_character_runs(query: str) -> bool:
    found = words(query)
    return bool(found) and all(len(w) >= 4 and _RUN.fullmatch(w) for w in found)


_MINILM = RelevanceFloor(with_words=0.40, without_words=0.50)
_E5 = RelevanceFloor(with_words=0.805, without_words=0.84, language_log_prob=-4.0)  # calibration: FLOORS below
FLOORS: dict[str, RelevanceFloor] = {
    # LoCoMo-dev, 759 answerable questions and the same asked of the next sample's memory:
    # best cosine < 0.38 refuses 69 % of off-topic ones, < 0.40 77 %, < 0.44 89 %, costing
    # answerable R@8 0.3 / 0.4 / 0.7 points; from 0.46 on the cost passes one point.
    # Gibberish ("xyzzy plugh", "qwertyuiop asdf") peaks at 0.30 and never shares a word.
    MINILM_SHIPPED_MODEL_ID: _MINILM,
    # The same weights computing in int8: cosines move in the third decimal (not recalibrated).
    MINILM_MODEL_ID: _MINILM,
    # e5 squeezes every cosine into 0.7-0.9: < 0.80 refuses 64 % of off-topic questions at no
    # cost, < 0.805 72 % for 0.13 points, < 0.82 89 % for 0.9, < 0.83 95 % for 5.3 points.
    # Gibberish scores 0.79-0.82 against LoCoMo and shares no word; no answerable question
    # lacked a shared word (a Russian question over English turns would: hence not higher).
    # Across scripts (bench/embedder_paraphrase.py's 80 Russian questions over their English
    # chats): best cosine 0.785 / 0.809 / 0.833 at p10 / p50 / p90, so the 0.84 bar refused 96 %
    # of them; with the 0.805 bar 61 % pass. The same questions asked of a LoCoMo memory peak at
    # 0.79 (all refused). Cyrillic keyboard mashing scores as high as 0.834 over English chats,
    # but -4.9 to -8.2 per character against -3.3 or more for every Russian or English question.
    # Calibrated on the 4-bit graph; the integer graph's cosines move in the third decimal, and
    # LoCoMo's off-topic rate and answerable loss were re-measured with this floor (docs/benchmarks.md, round 11).
    **{stamp: _E5 for stamp in E5_STAMPS.values()},
}
# An uncalibrated model gets no floor at all: a wrong "no results" is worse than a weak passage.
NO_FLOOR = RelevanceFloor(with_words=-1.0, without_words=-1.0, refuse_runs=False)


def floor_for(model_id: str) -> RelevanceFloor:
    return FLOORS.get(model_id, NO_FLOOR)
