"""Recall CPU benchmark (issue 15): CPU per call, calls/s, cold open and RSS as tenants grow,
today's code against main's engine in the same run.

    .venv/bin/python -m bench.recall_cpu_bench [--sizes 1000 10000 40000] [--calls 160] [--baseline-ref 477ac4d]

- Tenants of 1k, 10k and 40k conversations (6 turns each; seed 000's corpus, bench/corpus.py)
  are indexed once by this tree's engine. Embedding 240k turns takes hours on 2 shared cores,
  so the read-path tenants reuse embeddings: the first 3,000 distinct chunk texts are embedded
  with the real model, every later chunk gets the real vector of one of those 3,000 chosen by a
  hash of its text. Text, BM25 and SQLite rows are real; vectors are real model outputs, so the
  dense scan does exactly the work it does in production (its ranking is not what is measured
  here; bench/engine_bench.py measures quality).
- Each measurement runs in a fresh child process: `ours` imports this tree's `shared/`,
  `baseline` imports `shared/` of `--baseline-ref` exported by `git archive` into a temp dir
  (both read the same memory; the baseline ignores `vectors.i8`).
- Cold open: wall and CPU time from nothing to a reader ready to search (model already
  loaded), RSS after it minus before, and the peak during it (VmHWM reset first); then RSS
  after all the calls, split into anonymous memory and file-backed pages (the mapped snapshot:
  page cache, shared by every process reading the memory, reclaimable).
- Warm calls: `Engine.recall` with k=3, candidates=8 (the service's defaults) on real queries,
  1, 4 and 8 client threads; CPU ms per call = process CPU time / calls (all threads,
  query embedding included; the service's HTTP/MCP layer adds ~1.5-2 ms, not measured here).
- Indexing CPU per conversation: a 1,000-conversation tenant indexed from scratch with the
  real model (no reuse), process CPU / 1,000.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.corpus import conversation_lines, generate
from bench.report import table, write_section

REPO = Path(__file__).resolve().parents[1]
DISTINCT_EMBEDDINGS = 3000

WORKER = r'''
import json, os, sys, threading, time
from pathlib import Path
sys.path.insert(0, os.getcwd())

def status():
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if v.split():
            out[k] = int(v.split()[0]) * 1024 if v.strip().endswith("kB") else v.strip()
    return out

args = json.loads(sys.argv[1])
from shared.engine.embedder import shared_embedder
from shared.engine.api import Engine
from shared.engine.hybrid_search import RecallParams
if args["mode"] == "index":
    from shared.engine.index_run import index_tree
    emb = shared_embedder()
    c0 = time.process_time()
    index_tree(Path(args["home"]), Path(args["src"]), emb)
    print(json.dumps({"index_cpu_s": time.process_time() - c0}))
    sys.exit(0)
emb = shared_embedder()
engine = Engine(embedder=emb)
memory = Path(args["memory"])
queries = args["queries"]
emb.embed(["warm up the model"])
Path("/proc/self/clear_refs").write_text("5")
before = status()
w0, c0 = time.perf_counter(), time.process_time()
reader = engine.reader(memory)
reader.refresh()
cold_wall, cold_cpu = time.perf_counter() - w0, time.process_time() - c0
after = status()
result = {"cold_wall_s": cold_wall, "cold_cpu_s": cold_cpu, "rss_delta": after["VmRSS"] - before["VmRSS"],
          "peak_delta": after["VmHWM"] - before["VmRSS"], "runs": {}}
params = RecallParams(k=3, candidates=8)
for q in queries[:10]:
    engine.recall(memory, q, params)
for clients in args["clients"]:
    calls = args["calls"]
    per = calls // clients
    def work(i):
        for j in range(per):
            engine.recall(memory, queries[(i * 7919 + j) % len(queries)], params)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    w0, c0 = time.perf_counter(), time.process_time()
    for t in threads: t.start()
    for t in threads: t.join()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    result["runs"][str(clients)] = {"cpu_ms": 1000 * cpu / (per * clients), "calls_s": per * clients / wall}
end = status()
result["threads"] = int(end["Threads"])
result["anon_after_calls"] = end["RssAnon"] - before["RssAnon"]
result["file_after_calls"] = end["RssFile"] - before["RssFile"]
print(json.dumps(result))
'''


class ReusingEmbedder:
    """The real model for the first DISTINCT_EMBEDDINGS distinct texts; later texts reuse one of
    those real vectors, picked by a hash of the text (see the module docstring)."""

    def __init__(self, real) -> None:
        self.real = real
        self.spec = real.spec
        self.dim = real.dim
        self.bank: list[np.ndarray] = []

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        fresh = list(range(min(len(texts), DISTINCT_EMBEDDINGS - len(self.bank))))
        if fresh:
            vecs = self.real.embed([texts[i] for i in fresh])
            self.bank += list(vecs)
            out[fresh] = vecs
        for i in range(len(fresh), len(texts)):
            h = int.from_bytes(hashlib.blake2b(texts[i].encode(), digest_size=8).digest(), "little")
            out[i] = self.bank[h % len(self.bank)]
        return out


def write_src(src: Path, n: int) -> list[str]:
    conversations, questions = generate(n)
    src.mkdir(parents=True, exist_ok=True)
    for conv in conversations:
        (src / f"{conv.conversation_id}.funes.jsonl").write_text(conversation_lines(conv))
    rng = random.Random(n)
    sample = rng.sample(questions, min(100, len(questions)))
    return [q.short for q in sample[:50]] + [q.long for q in sample[50:]]


def export_baseline(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "shared"], check=True, capture_output=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "x", "-C", str(into)], input=archive, check=True)
    return into


def run_worker(code_dir: Path, args: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code_dir)}
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(args)], cwd=code_dir, env=env,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 40000])
    ap.add_argument("--calls", type=int, default=160)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--baseline-ref", default="477ac4d", help="the engine before issue 15's work")
    ap.add_argument("--index-conversations", type=int, default=1000)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    from shared.engine.embedder import shared_embedder
    from shared.engine.index_run import index_tree, memory_dir

    work = Path(tempfile.mkdtemp(prefix="recall-cpu-bench-"))
    codes = {"ours": REPO, "baseline": export_baseline(args.baseline_ref, work / "baseline-code")}
    reuse = ReusingEmbedder(shared_embedder())
    results: dict[tuple[int, str], dict] = {}
    for n in args.sizes:
        src, home = work / f"src-{n}", work / f"home-{n}"
        queries = write_src(src, n)
        t0 = time.perf_counter()
        index_tree(home, src, reuse)
        print(f"built {n} conversations in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        for name, code in codes.items():
            results[(n, name)] = run_worker(code, {"mode": "search", "memory": str(memory_dir(home)), "queries": queries,
                                                   "clients": args.clients, "calls": args.calls})
            print(n, name, json.dumps(results[(n, name)]), file=sys.stderr)
    index_cpu = {}
    isrc = work / "src-index"
    write_src(isrc, args.index_conversations)
    for name, code in codes.items():
        out = run_worker(code, {"mode": "index", "home": str(work / f"index-{name}"), "src": str(isrc)})
        index_cpu[name] = 1000 * out["index_cpu_s"] / args.index_conversations
    body = render(args, results, index_cpu)
    print(body)
    if not args.no_doc:
        write_section("recall-cpu-bench", "python -m bench.recall_cpu_bench " + " ".join(sys.argv[1:]), body)


def render(args, results: dict[tuple[int, str], dict], index_cpu: dict[str, float]) -> str:
    mib = 2**20
    rows = []
    for n in args.sizes:
        for name in ("baseline", "ours"):
            r = results[(n, name)]
            rows.append([n, name, *[f"{r['runs'][str(c)]['cpu_ms']:.1f}" for c in args.clients],
                         *[f"{r['runs'][str(c)]['calls_s']:.0f}" for c in args.clients]])
    perf = table(["conversations", "code", *[f"CPU ms/call, {c} client(s)" for c in args.clients],
                  *[f"calls/s, {c} client(s)" for c in args.clients]], rows)
    cold = table(["conversations", "code", "cold open wall (s)", "cold open CPU (s)", "RSS after open (MiB)",
                  "peak RSS during open (MiB)", "RSS after the calls: anon + file-backed (MiB)", "OS threads after the calls"],
                 [[n, name, f"{results[(n, name)]['cold_wall_s']:.3f}", f"{results[(n, name)]['cold_cpu_s']:.3f}",
                   f"{results[(n, name)]['rss_delta'] / mib:.0f}", f"{results[(n, name)]['peak_delta'] / mib:.0f}",
                   f"{results[(n, name)]['anon_after_calls'] / mib:.0f} + {results[(n, name)]['file_after_calls'] / mib:.0f}",
                   results[(n, name)]["threads"]] for n in args.sizes for name in ("baseline", "ours")])
    index = table(["code", f"indexing CPU per conversation (ms, {args.index_conversations} conversations, real model)"],
                  [[name, f"{v:.1f}"] for name, v in index_cpu.items()])
    return (f"Baseline: `{args.baseline_ref}`'s `shared/` (git archive) in the same run; {args.calls} calls per row; "
            "k=3, candidates=8; engine level (no HTTP). Tenants reuse 3,000 real embeddings (module docstring).\n\n"
            f"{perf}\n\n{cold}\n\n{index}")


if __name__ == "__main__":
    main()
