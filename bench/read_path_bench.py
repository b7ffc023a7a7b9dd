"""Read-path benchmark (issue 15): CPU per warm recall of this tree against another commit's
engine (default `main`) in the same run, on the same tenant files, and proof that both
return the same bytes.

    .venv/bin/python -m bench.read_path_bench [--sizes 1000 10000] [--models minilm e5] [--calls 160]
        [--clients 1 8] [--ref main] [--rounds 2]

- Tenants of 1k and 10k conversations are built once per model by this tree's engine with
  3,000 real embeddings reused (bench/recall_cpu_bench.py's `ReusingEmbedder`); `--ref`'s
  `shared/` is exported by `git archive` and reads the same files.
- Each measurement runs in a fresh child process (`ref` or `ours`), alternating which goes
  first from round to round, since the machine is shared and its load drifts.
- In a child: 20 warm-up calls (their CPU is reported: a hot snapshot's one-time packing of
  the scan lands there), then for each client count two measurements of `--calls` calls:
  **whole call** (`Engine.recall`, k=3, candidates=8, every call a question not asked before
  in the process, so the query embedding is paid) and **search only** (the same questions with
  their vectors embedded before the clock starts: what the read path itself costs). CPU ms per
  call = process CPU time (all threads) / calls.
- Identical results: each child renders 100 questions with `explain` (every leg's rank and
  score, the fused score, boosts, recency) at a fixed clock and reports a hash of the bytes; the
  run fails if `ours` and `ref` differ on any tenant.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import mean

from bench.recall_cpu_bench import ReusingEmbedder, export_code, write_src
from bench.report import table, write_section
from shared.engine.embedder import E5_MODEL_ID, MINILM_MODEL_ID

REPO = Path(__file__).resolve().parents[1]
MODELS = {"minilm": MINILM_MODEL_ID, "e5": E5_MODEL_ID}
WARM_UP = 20
IDENTITY_QUESTIONS = 100

WORKER = r'''
import hashlib, json, os, sys, threading, time
from pathlib import Path
sys.path.insert(0, os.getcwd())
from shared.engine import agent_format
from shared.engine.api import Engine
from shared.engine.embedder import embedder_for_stamp
from shared.engine.hybrid_search import RecallParams, recall
import sqlite3

args = json.loads(sys.argv[1])
memory = Path(args["memory"])
stamp = sqlite3.connect(memory / "chunks.sqlite3").execute("SELECT value FROM meta WHERE key='model_id'").fetchone()[0]
real = embedder_for_stamp(stamp)
queries = args["queries"]
real.embed(["warm up the model"])
vectors = {}

class Embedded:
    """The real model's vectors, computed before the clock starts."""
    spec, dim = real.spec, real.dim
    def embed_query(self, text):
        return vectors[text]
    def text_log_prob(self, text):
        return real.text_log_prob(text)

params = RecallParams(k=3, candidates=8)
engine = Engine(embedder=real)
reader = engine.reader(memory)
c0 = time.process_time()
for q in queries[:args["warm_up"]]:
    engine.recall(memory, q, params)
result = {"warm_up_cpu_ms": 1000 * (time.process_time() - c0), "runs": {}}
at = args["warm_up"]

def measure(engine, clients, asked):
    per = args["calls"] // clients
    def work(i):
        for q in asked[i * per:(i + 1) * per]:
            engine.recall(memory, q, params)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    w0, c0 = time.perf_counter(), time.process_time()
    for t in threads: t.start()
    for t in threads: t.join()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return {"cpu_ms": 1000 * cpu / (per * clients), "calls_s": per * clients / wall, "load": os.getloadavg()[0]}

searcher = Engine(embedder=Embedded())
for clients in args["clients"]:
    asked = queries[at:at + args["calls"]]
    at += args["calls"]
    assert len(asked) == args["calls"], "too few distinct questions"
    whole = measure(engine, clients, asked)
    for q in asked:
        vectors[q] = real.embed_query(q)
    result["runs"][str(clients)] = {"whole": whole, "search": measure(searcher, clients, asked)}

digest = hashlib.sha256()
with engine.lease(memory) as leased:
    for q in queries[:args["identity"]]:
        hits = recall(leased, real, q, RecallParams(k=3, candidates=8, explain=True), now=1.8e9)
        digest.update(agent_format.render_recall(hits, "m").encode())
result["answers_sha256"] = digest.hexdigest()
print(json.dumps(result))
'''


def run_worker(code_dir: Path, args: dict, model: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code_dir), "RECALL_EMBEDDER": model}
    env.pop("RECALL_QUERY_CACHE", None)
    done = subprocess.run([sys.executable, "-c", WORKER, json.dumps(args)], cwd=code_dir, env=env,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    ap.add_argument("--calls", type=int, default=160)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--ref", default="main", help="the engine to compare with (git ref)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    from shared.engine.embedder import embedder_for_stamp
    from shared.engine.index_run import index_tree, memory_dir

    ref_commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.ref], check=True,
                                capture_output=True, text=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="read-path-bench-"))
    codes = {"ref": export_code(args.ref, work / "ref-code"), "ours": REPO}
    results: dict[tuple[int, str, str], list[dict]] = {}
    try:
        for n in args.sizes:
            src = work / f"src-{n}"
            queries = write_src(src, n)
            for model in args.models:
                home = work / f"home-{n}-{model}"
                t0 = time.perf_counter()
                index_tree(home, src, ReusingEmbedder(embedder_for_stamp(MODELS[model])))
                print(f"built {n} conversations ({model}) in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
                job = {"memory": str(memory_dir(home)), "queries": queries[: WARM_UP + len(args.clients) * args.calls],
                       "warm_up": WARM_UP, "calls": args.calls,
                       "clients": args.clients, "identity": IDENTITY_QUESTIONS}
                for r in range(args.rounds):
                    for code in (("ref", "ours") if r % 2 == 0 else ("ours", "ref")):
                        out = run_worker(codes[code], job, model)
                        results.setdefault((n, model, code), []).append(out)
                        print(n, model, code, json.dumps(out), file=sys.stderr)
                hashes = {o["answers_sha256"] for code in ("ref", "ours") for o in results[(n, model, code)]}
                if len(hashes) != 1:
                    raise SystemExit(f"answers differ between {args.ref} and this tree: {n} conversations, {model}")
                shutil.rmtree(home)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    body = render(args, ref_commit, results)
    print(body)
    if not args.no_doc:
        write_section("read-path-bench", "python -m bench.read_path_bench " + " ".join(sys.argv[1:]), body)


def render(args, ref_commit: str, results: dict[tuple[int, str, str], list[dict]]) -> str:
    def avg(n: int, model: str, code: str, clients: int, kind: str, key: str = "cpu_ms") -> float:
        return mean(o["runs"][str(clients)][kind][key] for o in results[(n, model, code)])

    rows = []
    for n in args.sizes:
        for model in args.models:
            for clients in args.clients:
                cells = [n, model, clients]
                for kind in ("whole", "search"):
                    ref, ours = avg(n, model, "ref", clients, kind), avg(n, model, "ours", clients, kind)
                    cells += [f"{ref:.2f}", f"{ours:.2f}", f"{ours / ref:.2f}"]
                cells += [f"{avg(n, model, code, clients, 'whole', 'calls_s'):.0f}" for code in ("ref", "ours")]
                rows.append(cells)
    perf = table(["conversations", "model", "clients", f"whole call CPU ms, `{ref_commit}`", "whole call, ours", "ratio",
                  f"search only CPU ms, `{ref_commit}`", "search only, ours", "ratio",
                  f"calls/s, `{ref_commit}`", "calls/s, ours"], rows)
    warm = table(["conversations", "model", f"CPU of the first {WARM_UP} calls (ms), `{ref_commit}`", "ours"],
                 [[n, model, *[f"{mean(o['warm_up_cpu_ms'] for o in results[(n, model, code)]):.0f}"
                               for code in ("ref", "ours")]]
                  for n in args.sizes for model in args.models])
    loads = [run[kind]["load"] for rs in results.values() for o in rs for run in o["runs"].values() for kind in run]
    return (f"`{args.ref}` = `{ref_commit}` (its `shared/` by git archive) against this tree, {args.rounds} rounds "
            f"alternating which runs first, means over the rounds; {args.calls} calls per cell, every one a question "
            f"not asked before in its process; k=3, candidates=8; engine level (no HTTP). Load average during the "
            f"calls: {min(loads):.1f}-{max(loads):.1f} on 2 cores. Answers identical: the {IDENTITY_QUESTIONS} "
            f"questions rendered with `explain` at a fixed clock hash the same for both codes on every tenant "
            f"(the run stops otherwise).\n\n{perf}\n\n{warm}")


if __name__ == "__main__":
    main()
