"""Which ranking parts earn their place on LoCoMo: the engine in-process with one constant changed.

    .venv/bin/python -m bench.locomo_ablation [path-to-locomo-dir] [--workdir DIR]

Same memories, questions and hit rule as bench/locomo_bench.py (k=3 from 8 for R@3, k=8 from
16 for R@8, neighbour previews counted and not), no relevance floor. Each query is embedded
once and its vector reused by every variant (they differ only in ranking). Prints a table with
R@3 / R@8 (previews counted) per sample, so a lever that moves the total can be seen to hold on
every sample rather than on one sample's luck; the numbers behind the constants in
shared/engine/hybrid_search.py are recorded in docs/benchmarks.md beside this command.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import defaultdict
from pathlib import Path

from bench.locomo_bench import DEFAULT_DATA, hit_texts, is_hit, load, questions_of, write_sample
from bench.report import table
from shared.engine import hybrid_search as hs
from shared.engine.api import Engine
from shared.engine.embedder import shared_embedder
from shared.engine.index_run import index_tree, memory_dir



def plain_window(reader, hits, window) -> None:
    """funes' neighbours: every turn within the seq window, whether or not it is already on screen."""
    for hit in hits:
        r = hit.row
        hit.neighbours = [n for n in reader.store.session_rows(r.session_id, r.seq - window, r.seq + window)
                          if n.turn_uuid != r.turn_uuid]


VARIANTS: list[tuple[str, dict[str, object]]] = [
    ("shipped", {}),  # conversation evidence 0.4, 30 conversations judged, best 3 turns
    ("neighbours: the plain seq window (funes; turns on screen previewed again)", {"_attach_neighbours": plain_window}),
    ("neighbours: turns read above not previewed again, no preview moves out", {"NEIGHBOUR_REACH": 1}),
    ("neighbours: freed slots up to 3 windows out", {"NEIGHBOUR_REACH": 3}),
    ("legs only C deep (no minimum depth)", {"MIN_LEG_DEPTH": 0}),
    ("legs at least 50 deep", {"MIN_LEG_DEPTH": 50}),
    ("no session lift", {"SESSION_WEIGHT": 0.0}),
    ("session lift 0.1", {"SESSION_WEIGHT": 0.1}),
    ("session lift 0.3", {"SESSION_WEIGHT": 0.3}),
    # The dense weight is per model (DENSE_WEIGHTS); emptying the table gives every model DENSE_WEIGHT.
    ("dense weight 0.3", {"DENSE_WEIGHTS": {}, "DENSE_WEIGHT": 0.3}),
    ("dense weight 0.5", {"DENSE_WEIGHTS": {}, "DENSE_WEIGHT": 0.5}),
    ("no conversation evidence", {"CONVERSATION_WEIGHT": 0.0}),
    ("conversation evidence 0.2", {"CONVERSATION_WEIGHT": 0.2}),
    ("conversation evidence 0.6", {"CONVERSATION_WEIGHT": 0.6}),
    ("conversation evidence 0.8", {"CONVERSATION_WEIGHT": 0.8}),
    ("conversation evidence 1.2", {"CONVERSATION_WEIGHT": 1.2}),
    ("conversation evidence: 10 conversations judged", {"CONVERSATION_SESSIONS": 10}),
    ("conversation evidence: best 2 turns", {"CONVERSATION_TURNS": 2}),
]


class CachedQueries:
    """The embedder with each query's vector kept: every variant asks the same questions."""

    def __init__(self, embedder) -> None:
        self._embedder, self._vectors = embedder, {}
        self.spec, self.dim = embedder.spec, embedder.dim

    def embed_query(self, text: str):
        if text not in self._vectors:
            self._vectors[text] = self._embedder.embed_query(text)
        return self._vectors[text]

    def text_log_prob(self, text: str):
        return self._embedder.text_log_prob(text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default=str(DEFAULT_DATA))
    ap.add_argument("--workdir", help="keep memories here between runs")
    ap.add_argument("--only", nargs="*", help="run only the variants whose label starts with one of these")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="recall-locomo-") as tmp:
        work = Path(args.workdir or tmp)
        embedder = shared_embedder()
        memories = {}
        for s in load(Path(args.path)):
            texts = write_sample(s, work / "src" / s["sample_id"])
            index_tree(work / "home" / s["sample_id"], work / "src" / s["sample_id"], embedder)
            memories[s["sample_id"]] = (memory_dir(work / "home" / s["sample_id"]), questions_of(s, texts))
        engine = Engine(embedder=CachedQueries(embedder))
        rows = []
        for label, constants in VARIANTS:
            if args.only and not any(label.startswith(o) for o in args.only):
                continue
            saved = {name: getattr(hs, name) for name in constants}
            for name, value in constants.items():
                setattr(hs, name, value)
            try:
                hits: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])  # n, R@3, R@8, own R@3, own R@8
                chars = 0
                for sample, (memory, questions) in memories.items():
                    for q in questions:
                        r3 = engine.recall(memory, q.text, hs.RecallParams(k=3, candidates=8))
                        r8 = engine.recall(memory, q.text, hs.RecallParams(k=8, candidates=16))
                        chars += len(r8)
                        found = [is_hit(p, q) for p in (hit_texts(r3)[1], hit_texts(r8)[1], hit_texts(r3)[0],
                                                         hit_texts(r8)[0])]
                        for group in ("all", sample):
                            hits[group][0] += 1
                            for i, f in enumerate(found, 1):
                                hits[group][i] += f
            finally:
                for name, value in saved.items():
                    setattr(hs, name, value)
            n = hits["all"][0]
            rows.append([label, *(f"{h / n:.3f}" for h in hits["all"][1:]),
                         *(f"{hits[s][1] / hits[s][0]:.3f} / {hits[s][2] / hits[s][0]:.3f}" for s in memories),
                         f"{chars / n:.0f}"])
            print(rows[-1], flush=True)
    print(table(["variant", "R@3", "R@8", "R@3 own text", "R@8 own text",
                 *(f"{s} R@3 / R@8" for s in memories), "characters per k=8 answer"], rows))


if __name__ == "__main__":
    main()
