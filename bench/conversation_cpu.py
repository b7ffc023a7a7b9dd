"""CPU per warm recall with and without conversation-level evidence, in the same process.

    .venv/bin/python -m bench.conversation_cpu HOME [--size 10000] [--calls 150] [--rounds 3]

HOME is a FUNES_HOME of `bench.corpus.generate(size)` indexed by `recall-engine index`. Each
question's vector is embedded once beforehand, so the figures are the ranking's CPU alone (the
query embedding is the same for both); the two variants alternate round by round over the same
questions (short, long and bare forms), k=3 from 8 candidates as the service asks.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench import corpus
from bench.engine_bench import sample_questions
from bench.locomo_ablation import CachedQueries
from shared.engine import hybrid_search as hs
from shared.engine.api import Engine
from shared.engine.embedder import shared_embedder
from shared.engine.index_run import memory_dir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("home")
    ap.add_argument("--size", type=int, default=10000)
    ap.add_argument("--calls", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    _, questions = corpus.generate(args.size)
    texts = [t for q in sample_questions(questions, args.calls, args.size) for t in (q.short, q.long, q.bare) if t]
    texts = texts[: args.calls]
    engine = Engine(embedder=CachedQueries(shared_embedder()))
    memory = memory_dir(Path(args.home))
    params = hs.RecallParams(k=3, candidates=8)
    for t in texts:  # embed, open the reader, pack the scan
        engine.recall(memory, t, params)
    shipped = hs.CONVERSATION_WEIGHT
    cpu: dict[str, list[float]] = {"without conversation evidence": [], "with (shipped)": []}
    for _ in range(args.rounds):
        for label, weight in (("without conversation evidence", 0.0), ("with (shipped)", shipped)):
            hs.CONVERSATION_WEIGHT = weight
            t0 = time.process_time()
            for t in texts:
                engine.recall(memory, t, params)
            cpu[label].append((time.process_time() - t0) / len(texts) * 1000)
    hs.CONVERSATION_WEIGHT = shipped
    for label, per_round in cpu.items():
        print(f"| {label} | {min(per_round):.2f} | {sorted(per_round)[len(per_round) // 2]:.2f} | {len(texts)} |")


if __name__ == "__main__":
    main()
