"""Which ranking parts earn their place on LoCoMo: the engine in-process with one constant changed.

    .venv/bin/python -m bench.locomo_ablation [path-to-locomo-dir] [--workdir DIR]

Same memories, questions and hit rule as bench/locomo_bench.py (k=3 from 8 for R@3, k=8 from
16 for R@8, neighbour previews counted and not), no relevance floor. Prints a table; the
numbers behind the constants in shared/engine/hybrid_search.py are recorded in
docs/benchmarks.md beside this command.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.locomo_bench import DEFAULT_DATA, hit_texts, is_hit, load, questions_of, write_sample
from bench.report import table
from shared.engine import hybrid_search as hs
from shared.engine.api import Engine
from shared.engine.embedder import shared_embedder
from shared.engine.index_run import index_tree, memory_dir

VARIANTS: list[tuple[str, dict[str, object]]] = [
    ("shipped", {}),
    ("legs only C deep (no minimum depth)", {"MIN_LEG_DEPTH": 0}),
    ("no session lift", {"SESSION_WEIGHT": 0.0}),
    ("session lift 0.5", {"SESSION_WEIGHT": 0.5}),
    # The dense weight is per model (DENSE_WEIGHTS); emptying the table gives every model DENSE_WEIGHT.
    ("dense weight 0.3", {"DENSE_WEIGHTS": {}, "DENSE_WEIGHT": 0.3}),
    ("dense weight 0.5", {"DENSE_WEIGHTS": {}, "DENSE_WEIGHT": 0.5}),
    ("dense weight 0.15", {"DENSE_WEIGHTS": {}, "DENSE_WEIGHT": 0.15}),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default=str(DEFAULT_DATA))
    ap.add_argument("--workdir", help="keep memories here between runs")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="recall-locomo-") as tmp:
        work = Path(args.workdir or tmp)
        embedder = shared_embedder()
        memories = {}
        for s in load(Path(args.path)):
            texts = write_sample(s, work / "src" / s["sample_id"])
            index_tree(work / "home" / s["sample_id"], work / "src" / s["sample_id"], embedder)
            memories[s["sample_id"]] = (memory_dir(work / "home" / s["sample_id"]), questions_of(s, texts))
        engine = Engine(embedder=embedder)
        rows = []
        for label, constants in VARIANTS:
            saved = {name: getattr(hs, name) for name in constants}
            for name, value in constants.items():
                setattr(hs, name, value)
            try:
                hits = [0, 0, 0, 0]
                n = 0
                for memory, questions in memories.values():
                    for q in questions:
                        r3 = hit_texts(engine.recall(memory, q.text, hs.RecallParams(k=3, candidates=8)))
                        r8 = hit_texts(engine.recall(memory, q.text, hs.RecallParams(k=8, candidates=16)))
                        for i, found in enumerate((r3[1], r8[1], r3[0], r8[0])):
                            hits[i] += is_hit(found, q)
                        n += 1
            finally:
                for name, value in saved.items():
                    setattr(hs, name, value)
            rows.append([label, *(f"{h / n:.3f}" for h in hits)])
            print(rows[-1], flush=True)
    print(table(["variant", "R@3", "R@8", "R@3 (own text only)", "R@8 (own text only)"], rows))


if __name__ == "__main__":
    main()
