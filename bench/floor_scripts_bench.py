"""Questions that share no word with the memory: across scripts, off-topic, and keyboard mashing.

    .venv/bin/python -m bench.floor_scripts_bench [path-to-locomo-dir] [--workdir DIR] [--no-doc]

Memories (default embedder, built by the engine): `en`, one conversation per fact of
bench/embedder_paraphrase.py's English chats (80 facts, four chatter turns each naming the same
sites and equipment); `locomo`, the first LoCoMo-dev sample; and two mixed ones, as a user who
chats in both languages has: `en+ru`, the English chats of facts 0-39 beside the Russian chats
of facts 40-79, and `locomo+ru`, the LoCoMo sample beside those Russian chats. Questions, each
asked through `Engine.recall` with the relevance floor on (as the service asks) and k=3:

- `ru → en`: the 80 Russian paraphrase questions over the English chats: answerable, and no
  word can be shared. A hit = the fact among the three passages.
- `ru 0-39 → en+ru`: the same for facts 0-39, answered in English beside Russian chats of other
  facts (which share the sites' and equipment's names).
- `ru → locomo`, `ru 0-39 → locomo+ru`: the same questions over memories that never discussed
  them: off-topic.
- keyboard mashing, Latin, Cyrillic and CJK, over the English and LoCoMo memories: gibberish.

Each row gives how often the engine answers at all and, for the answerable rows, how often the
right turn is among the three. Baseline in the same run, from the same legs: round 30's floor,
under which a question faced the across-scripts bar only when none of its nearest passages was
written in its script (in a mixed memory, a Russian question about an English chat met a
Russian turn among them and faced the same-script bar).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from bench.corpus import Conversation
from bench.embedder_paraphrase import generate
from bench.engine_bench import write_tree
from bench.locomo_bench import DEFAULT_DATA, load, write_sample
from bench.report import table, write_section
from shared.engine import relevance_floor
from shared.engine.agent_format import NO_RESULTS
from shared.engine.api import Engine
from shared.engine.embedder import shared_embedder
from shared.engine.hybrid_search import RecallParams
from shared.engine.index_run import index_tree, memory_dir
from shared.engine.text_analysis import scripts

MASHING = {
    "Latin mashing": ["xyzzy plugh", "qwertyuiop asdf", "zxcv bnm lkjh", "asdfgh jkl", "blorft snizzle"],
    "Cyrillic mashing": ["фывапролдж", "ъъъ ыыы ььь", "йцукен шщзх", "ывфа прол джэ", "кккк лллл"],
    "CJK mashing": ["あああ", "ぬぬぬねね", "ㅋㅋㅋㅋ", "啊啊啊", "嗯嗯 呃呃"],
}


def build(home: Path, write_src) -> Path:
    if not (memory_dir(home) / "chunks.sqlite3").exists():
        src = home.parent / f"{home.name}-src"
        write_src(src)
        index_tree(home, src, shared_embedder())
    return memory_dir(home)


STARTED = datetime(2026, 10, 8, 10, tzinfo=timezone.utc)


def write_chats(src: Path, ps, passages: list[str], facts: range, prefix: str) -> None:
    """One conversation per fact: its four chatter turns and the fact, in `passages`' language."""
    write_tree(src, [Conversation(f"{prefix}{i}", STARTED, passages[ps.answer[i] - 4 : ps.answer[i] + 1]) for i in facts])


class Round30Floor(relevance_floor.RelevanceFloor):
    """The floor before round 31: the across-scripts bar only when no nearest passage shares the
    question's script, else the same-script bar for every passage."""

    def admits(self, query, legs, nearest, log_prob, said) -> bool:
        asked = scripts(query) - {"other"}

        def as_before() -> list[tuple[float, str]]:
            passages = nearest()
            if any(asked & scripts(text) for _, text in passages):
                return [(-1.0, text) for _, text in passages]  # none may clear the across-scripts bar
            return passages
        return super().admits(query, legs, as_before, log_prob, said)


def ask(engine: Engine, memory: Path, questions: list[str], facts: list[str] | None) -> tuple[float, float | None]:
    answered = hits = 0
    for i, q in enumerate(questions):
        out = engine.recall(memory, q, RecallParams(k=3, floor=True))
        if out.strip() != NO_RESULTS:
            answered += 1
            hits += facts is not None and facts[i] in out
    return answered / len(questions), (hits / len(questions) if facts is not None else None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default=str(DEFAULT_DATA))
    ap.add_argument("--workdir", help="keep memories here between runs")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="floor-scripts-"))
    ps = generate(80)
    facts = [ps.passages_en[a] for a in ps.answer]
    first, second = range(0, 40), range(40, 80)
    locomo = load(Path(args.path))[0]

    def mixed(src: Path, write_first) -> None:
        write_first(src)
        write_chats(src, ps, ps.passages_ru, second, "ru")
    memories = {"en": build(work / "en", lambda src: write_chats(src, ps, ps.passages_en, range(80), "c")),
                "locomo": build(work / "locomo", lambda src: write_sample(locomo, src)),
                "en+ru": build(work / "en+ru", lambda src: mixed(src, lambda s: write_chats(s, ps, ps.passages_en, first, "c"))),
                "locomo+ru": build(work / "locomo+ru", lambda src: mixed(src, lambda s: write_sample(locomo, s)))}
    engine = Engine(embedder=shared_embedder())
    asked_first = ps.questions_ru[:40]
    sets = [("ru → en (answerable)", "en", ps.questions_ru, facts),
            ("ru 0-39 → en+ru (answerable)", "en+ru", asked_first, facts[:40]),
            ("ru → locomo (off-topic)", "locomo", ps.questions_ru, None),
            ("ru 0-39 → locomo+ru (off-topic)", "locomo+ru", asked_first, None)]
    sets += [(f"{label} → {name}", name, qs, None) for label, qs in MASHING.items() for name in ("en", "locomo")]
    shipped = relevance_floor.FLOORS[engine.embedder.spec.model_id]
    before = Round30Floor(shipped.with_words, shipped.without_words, shipped.language_log_prob, shipped.refuse_runs)
    rows = []
    for label, name, questions, answers in sets:
        relevance_floor.FLOORS[engine.embedder.spec.model_id] = before
        old = ask(engine, memories[name], questions, answers)
        relevance_floor.FLOORS[engine.embedder.spec.model_id] = shipped
        new = ask(engine, memories[name], questions, answers)
        rows.append([label, len(questions), f"{old[0]:.2f}", f"{new[0]:.2f}",
                     "–" if answers is None else f"{old[1]:.2f} / {new[1]:.2f}"])
        print(rows[-1], flush=True)
    body = table(["questions → memory", "n", "answered, round 30's floor", "answered, shipped floor",
                  "right turn in top 3, round 30 / shipped"], rows)
    print(body)
    if not args.no_doc:
        write_section("floor-scripts", "python -m bench.floor_scripts_bench", body)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
