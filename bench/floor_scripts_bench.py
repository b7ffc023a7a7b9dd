"""Questions that share no word with the memory: across scripts, off-topic, and keyboard mashing.

    .venv/bin/python -m bench.floor_scripts_bench [path-to-locomo-dir] [--workdir DIR] [--no-doc]

Memories (default embedder, built by the engine): `en`, one conversation per fact of
bench/embedder_paraphrase.py's English chats (80 facts, four chatter turns each naming the same
sites and equipment), and `locomo`, the first LoCoMo-dev sample. Questions, each asked through
`Engine.recall` with the relevance floor on (as the service asks) and k=3:

- `ru → en`: the 80 Russian paraphrase questions over the English chats: answerable, and no
  word can be shared. A hit = the fact among the three passages.
- `ru → locomo`: the same questions over a memory that never discussed them: off-topic.
- keyboard mashing, Latin, Cyrillic and CJK, over both memories: gibberish.

Each row gives how often the engine answers at all and, for the answerable row, how often the
right turn is among the three. The floor before this change (no language test, 0.84 for any
query sharing no word) is the baseline, computed in the same run from the same legs.
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


def write_en(src: Path, ps) -> None:
    started = datetime(2026, 10, 8, 10, tzinfo=timezone.utc)
    write_tree(src, [Conversation(f"c{i}", started, ps.passages_en[a - 4 : a + 1]) for i, a in enumerate(ps.answer)])


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
    memories = {"en": build(work / "en", lambda src: write_en(src, ps)),
                "locomo": build(work / "locomo", lambda src: write_sample(load(Path(args.path))[0], src))}
    engine = Engine(embedder=shared_embedder())
    sets = [("ru → en (answerable)", "en", ps.questions_ru, facts), ("ru → locomo (off-topic)", "locomo", ps.questions_ru, None)]
    sets += [(f"{label} → {name}", name, qs, None) for label, qs in MASHING.items() for name in memories]
    shipped = relevance_floor.FLOORS[engine.embedder.spec.model_id]
    before = relevance_floor.RelevanceFloor(shipped.with_words, shipped.without_words)  # no language test
    rows = []
    for label, name, questions, answers in sets:
        relevance_floor.FLOORS[engine.embedder.spec.model_id] = before
        old = ask(engine, memories[name], questions, answers)
        relevance_floor.FLOORS[engine.embedder.spec.model_id] = shipped
        new = ask(engine, memories[name], questions, answers)
        rows.append([label, len(questions), f"{old[0]:.2f}", f"{new[0]:.2f}",
                     "–" if answers is None else f"{old[1]:.2f} / {new[1]:.2f}"])
        print(rows[-1], flush=True)
    body = table(["questions → memory", "n", "answered, floor before", "answered, shipped floor",
                  "right turn in top 3, before / shipped"], rows)
    print(body)
    if not args.no_doc:
        write_section("floor-scripts", "python -m bench.floor_scripts_bench", body)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
