"""Evidence recall on real long conversations (LoCoMo), through the engine's MCP server.

    .venv/bin/python -m bench.locomo_bench [path-to-locomo-dir] [--workdir DIR] [--no-doc] [--pasted N]

The data (CC BY-NC, evaluation only) is read from `../shared/data/locomo-dev` relative to the
repo root unless a path is given; nothing of it is written into the repository, only scores.
One memory per sample, one conversation per session, a turn is `speaker: text` (plus
` [shares a photo: caption]`). Every answerable question (categories 1-4) goes to a long-lived
`recall-engine mcp` child with the recall service's defaults: k=3 with candidates=8 for R@3, and
k=8 with candidates=max(8, 2k)=16 (the service's rule) for R@5 (its first five) and R@8.
A hit = the first 80 characters of an evidence turn appear in the returned text, counted in the
hits' own text only and with the neighbour previews. A plain-RRF baseline (the same two legs,
RRF k=60, ±1 neighbours) runs on the same memories in the same run. The relevance floor is
measured by asking each sample's questions of the next sample's memory (off-topic for that
user): the share answered "no results", and the answerable R@8 lost to the floor.

`--pasted N` adds to each sample's memory N conversations of one long turn each, a document the
user pasted: the next sample's sessions, N at a time, one per line (~5-15 KB, many chunks), dated
a day after the sample's last session. They share the everyday words of the questions and hold
none of their answers: what a pasted log or dump does to the questions about everything else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bench.report import table, write_section
from shared.engine.agent_format import NO_RESULTS, parse_recall
from shared.engine.api import Engine
from shared.engine.embedder import shared_embedder
from shared.engine.hybrid_search import RRF_K, RecallParams, search_legs
from shared.engine.index_run import index_tree, memory_dir
from shared.engine.transcript import Block, TranscriptTurn, dump_transcript
from shared.mcp_stdio_client import StdioMCPChild

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO.parent / "shared" / "data" / "locomo-dev"
ENGINE = str(Path(sys.executable).parent / "recall-engine")
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
PREFIX = 80
# The recall service asks the engine for k passages from a pool of max(candidates, 2k), candidates=8.
# R@5 is its own call: the first 5 of a k=8 answer miss what a k=5 answer previews (a hit 6-8 is
# never a preview in the k=8 one, since it is shown whole there).
SERVICE = {3: 8, 5: 10, 8: 16}


@dataclass(frozen=True)
class Question:
    sample: str
    text: str
    category: int
    evidence: tuple[str, ...]  # the first PREFIX characters of each evidence turn


def turn_text(turn: dict) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


def session_start(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%I:%M %p on %d %B, %Y").replace(tzinfo=timezone.utc)


def load(path: Path) -> list[dict]:
    file = path / "locomo-dev.json" if path.is_dir() else path
    return json.loads(file.read_text())


def write_sample(sample: dict, src: Path) -> dict[str, str]:
    """One `.funes.jsonl` per session; returns dia_id → turn text."""
    conv = sample["conversation"]
    src.mkdir(parents=True, exist_ok=True)
    texts: dict[str, str] = {}
    n = 1
    while f"session_{n}" in conv:
        start = session_start(conv[f"session_{n}_date_time"])
        sid = f"{sample['sample_id']}-s{n:02d}"
        turns = []
        for seq, t in enumerate(conv[f"session_{n}"]):
            texts[t["dia_id"]] = turn_text(t)
            turns.append(TranscriptTurn(
                session_id=sid, turn_uuid=f"{sid}-{seq}", seq=seq,
                ts=(start + timedelta(minutes=seq)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                role="user" if t["speaker"] == conv["speaker_a"] else "assistant", harness="chat",
                blocks=[Block(block_type="text", text=turn_text(t))]))
        write_transcript(src, sid, turns)
        n += 1
    return texts


def write_transcript(src: Path, session_id: str, turns: list[TranscriptTurn]) -> None:
    path, body = src / f"{session_id}.funes.jsonl", dump_transcript(turns)
    if not path.exists() or path.read_text() != body:  # unchanged files keep the memory warm
        path.write_text(body)


def write_pasted(sample: dict, other: dict, src: Path, n: int) -> None:
    """`n` conversations of one user turn, each holding `n` of `other`'s sessions pasted whole."""
    conv, pasted = sample["conversation"], other["conversation"]
    last = max(session_start(conv[k]) for k in conv if k.startswith("session_") and k.endswith("_date_time"))
    sessions = [pasted[f"session_{i}"] for i in range(1, 100) if f"session_{i}" in pasted]
    for p in range(n):
        text = "\n".join(turn_text(t) for session in sessions[p * n:(p + 1) * n] for t in session)
        sid = f"{sample['sample_id']}-pasted{p}"
        turn = TranscriptTurn(session_id=sid, turn_uuid=f"{sid}-0", seq=0,
                              ts=(last + timedelta(days=1, minutes=p)).strftime("%Y-%m-%dT%H:%M:%SZ"), role="user",
                              harness="chat", blocks=[Block(block_type="text", text=f"Summarise this for me:\n{text}")])
        write_transcript(src, sid, [turn])


def questions_of(sample: dict, texts: dict[str, str]) -> list[Question]:
    out = []
    for qa in sample["qa"]:
        if qa.get("category") not in CATEGORIES:
            continue
        ev = tuple(texts[e][:PREFIX] for e in qa.get("evidence", []) if e in texts)
        if ev:
            out.append(Question(sample["sample_id"], qa["question"], qa["category"], ev))
    return out


def hit_texts(output: str) -> tuple[list[str], list[str]]:
    """Per returned hit: its own text, and its text with the neighbour previews."""
    hits = parse_recall(output)
    return [h.text for h in hits], [h.text + "\n" + "\n".join(t for _, _, t in h.neighbours) for h in hits]


def is_hit(passages: list[str], q: Question) -> bool:
    return any(e in p for p in passages for e in q.evidence)


def plain_rrf(engine: Engine, memory: Path, query: str, k: int, candidates: int) -> tuple[list[str], list[str]]:
    """The baseline: the engine's two legs fused by plain RRF (k=60), ±1 neighbouring turns."""
    reader = engine.reader(memory)
    qvec = engine.embedder.embed_query(query)
    with reader.fresh():
        found = search_legs(reader, qvec, query, candidates, reader.filter_mask(None, None))
        legs = [[rid for rid, _ in found.dense], [rid for rid, _ in found.bm25]]
        fused: dict[int, float] = defaultdict(float)
        for leg in legs:
            for rank, rid in enumerate(leg):
                fused[rid] += 1.0 / (rank + RRF_K)
        top = sorted(fused, key=fused.get, reverse=True)[:k]
        rows = reader.store.rows(top)
        own, shown = [], []
        for rid in top:
            r = rows[rid]
            near = [n.text[:160] for n in reader.store.session_rows(r.session_id, r.seq - 1, r.seq + 1)
                    if n.turn_uuid != r.turn_uuid]
            own.append(r.text)
            shown.append(r.text + "\n" + "\n".join(near))
    return own, shown


class Tally:
    def __init__(self) -> None:
        self.hits: dict[tuple[str, str, int, bool], int] = defaultdict(int)
        self.n: dict[str, int] = defaultdict(int)

    def add(self, system: str, q: Question, k_outputs: dict[int, tuple[list[str], list[str]]]) -> None:
        for group in (CATEGORIES[q.category], "overall"):
            if system == SYSTEMS[0]:
                self.n[group] += 1
            for k, (own, shown) in k_outputs.items():
                self.hits[(system, group, k, False)] += is_hit(own[:k], q)
                self.hits[(system, group, k, True)] += is_hit(shown[:k], q)

    def rate(self, system: str, group: str, k: int, neighbours: bool) -> float:
        return self.hits[(system, group, k, neighbours)] / max(self.n[group], 1)


SYSTEMS = ["recall-engine (MCP)", "plain RRF"]


async def evaluate(samples: list[dict], workdir: Path, pasted: int = 0) -> dict[str, object]:
    embedder = shared_embedder()
    memories, questions = {}, {}
    t0 = time.process_time()
    for i, s in enumerate(samples):
        texts = write_sample(s, workdir / "src" / s["sample_id"])
        if pasted:
            write_pasted(s, samples[(i + 1) % len(samples)], workdir / "src" / s["sample_id"], pasted)
        home = workdir / "home" / s["sample_id"]
        index_tree(home, workdir / "src" / s["sample_id"], embedder)
        memories[s["sample_id"]] = memory_dir(home)
        questions[s["sample_id"]] = questions_of(s, texts)
    index_cpu = time.process_time() - t0
    engine = Engine(embedder=embedder)
    tally = Tally()
    child = await StdioMCPChild([ENGINE, "mcp", str(next(iter(memories.values())))]).start()
    try:
        await child.call_tool("recall", {"query": "warm up", "k": 3}, 60)
        ids = list(memories)
        off_topic = answered_nothing = lost = 0
        t0 = time.perf_counter()
        for i, sid in enumerate(ids):
            memory = str(memories[sid])
            for q in questions[sid]:
                outs = {k: hit_texts(await child.call_tool(
                    "recall", {"query": q.text, "k": k, "candidates": c, "memory": memory}, 60)) for k, c in SERVICE.items()}
                tally.add(SYSTEMS[0], q, outs)
                tally.add(SYSTEMS[1], q, {k: plain_rrf(engine, Path(memory), q.text, k, c) for k, c in SERVICE.items()})
                # The floor's price on answerable questions: the same query with the floor off.
                unfloored = hit_texts(engine.recall(Path(memory), q.text, RecallParams(k=8, candidates=16, floor=False)))
                lost += is_hit(unfloored[1], q) - is_hit(outs[8][1], q)
            other = str(memories[ids[(i + 1) % len(ids)]])
            for q in questions[sid]:
                out = await child.call_tool("recall", {"query": q.text, "k": 3, "candidates": 8, "memory": other}, 60)
                off_topic += 1
                answered_nothing += out.strip() == NO_RESULTS
        query_s = time.perf_counter() - t0
    finally:
        await child.close()
    return {"tally": tally, "off_topic": off_topic, "nothing": answered_nothing, "lost": lost,
            "n": tally.n["overall"], "index_cpu": index_cpu, "query_s": query_s,
            "model": embedder.spec.model_id, "pasted": pasted}


def render(r: dict[str, object], n_samples: int) -> str:
    tally: Tally = r["tally"]
    groups = [*CATEGORIES.values(), "overall"]
    rows = []
    for system in SYSTEMS:
        for neighbours in (True, False):
            for g in groups:
                rows.append([system, "yes" if neighbours else "no", g, tally.n[g],
                             *(f"{tally.rate(system, g, k, neighbours):.3f}" for k in (3, 5, 8))])
    n = r["n"]
    floor_rows = [[r["off_topic"], f"{r['nothing'] / max(r['off_topic'], 1):.1%}", f"{-r['lost'] / max(n, 1) * 100:+.1f}"]]
    return "\n\n".join([
        f"### LoCoMo evidence recall ({n_samples} samples, {n} answerable questions, embedder `{r['model']}`"
        + (f", {r['pasted']} pasted documents per sample" if r["pasted"] else "") + ")\n\n"
        "k as the recall service (k=3 from a pool of 8, k=5 from 10, k=8 from 16); "
        "a hit = the first 80 characters of an evidence turn in the returned text.\n\n"
        + table(["system", "neighbour previews counted", "category", "questions", "R@3", "R@5", "R@8"], rows),
        "### Relevance floor (each sample's questions asked of the next sample's memory, k=3)\n\n"
        + table(["off-topic questions", "answered `no results`", "answerable R@8 change from the floor (points)"], floor_rows),
        f"Index CPU (in-process, all samples): {r['index_cpu']:.0f} s; query phase wall time: {r['query_s']:.0f} s.",
    ])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default=str(DEFAULT_DATA), help="LoCoMo directory or json file")
    ap.add_argument("--workdir", help="keep memories here between runs (default: a temporary directory)")
    ap.add_argument("--no-doc", action="store_true", help="print only; do not update docs/benchmarks.md")
    ap.add_argument("--pasted", type=int, default=0, help="long pasted documents added to each memory (default 0)")
    args = ap.parse_args()
    samples = load(Path(args.path))
    if args.workdir:
        result = asyncio.run(evaluate(samples, Path(args.workdir), args.pasted))
    else:
        with tempfile.TemporaryDirectory(prefix="recall-locomo-") as d:
            result = asyncio.run(evaluate(samples, Path(d), args.pasted))
    body = render(result, len(samples))
    print(body)
    if not args.no_doc:
        write_section("locomo-bench", " ".join(["python -m bench.locomo_bench", *sys.argv[1:]]), body)


if __name__ == "__main__":
    main()
