"""Capacity figures per replica (docs/capacity.md), in process CPU time and resident memory.

    .venv/bin/python -m bench.capacity_bench [--sizes 1000 10000] [--tenants 8] [--reuse-above 1000] [--no-doc]

The machine's 2 cores are shared with other work, so throughput is derived from CPU seconds
consumed (all threads of the measured process), not wall time:
- indexer: CPU seconds to index N six-turn conversations from scratch -> conversations per core-second;
  sizes above --reuse-above are built with recall_cpu_bench's ReusingEmbedder (3,000 real
  vectors reused by text hash: real text, BM25 and rows, hours of embedding saved) and give no
  indexer row, only a tenant to read;
- recall: RSS of a fresh process after loading the model (the baseline, same run), then after
  opening 1..T tenants of 1,000 conversations and one of the largest size, and the CPU time of
  warm recalls on the largest tenant -> calls per core-second;
- ingest: CPU seconds of a real `recall ingest` process per accepted six-turn snapshot;
- Redis: used_memory per pending (unprocessed) snapshot on a real redis-server.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from bench.corpus import generate
from bench.engine_bench import write_tree
from bench.report import table, write_section

BIN = Path(sys.executable).parent
KEY = "capacity-bench-ingest-key-Zq8vXk29bT7"


def cpu_seconds() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def index_cpu(src: Path, home: Path, reuse: bool = False) -> float:
    from bench.recall_cpu_bench import ReusingEmbedder
    from shared.engine.embedder import shared_embedder
    from shared.engine.index_run import index_tree

    embedder = shared_embedder()
    embedder.embed(["warm up"])
    if reuse:
        embedder = ReusingEmbedder(embedder)
    before = cpu_seconds()
    index_tree(home, src, embedder)
    return cpu_seconds() - before


def _rss_probe(small: list[Path], large: Path, queries: list[str], out) -> None:
    """Runs in a fresh process: RSS after the model, after each tenant, and recall CPU time."""
    from shared.engine.api import Engine
    from shared.engine.embedder import shared_embedder
    from shared.engine.hybrid_search import RecallParams

    proc = psutil.Process()
    mib = lambda: proc.memory_info().rss / 2**20  # noqa: E731
    base = mib()
    embedder = shared_embedder()
    embedder.embed(["warm up"])
    engine = Engine(max_readers=len(small) + 2, embedder=embedder)
    params = RecallParams(k=3, candidates=8)
    model = mib()
    rows = [("interpreter", base), ("+ model", model)]
    for i, memory in enumerate(small, 1):
        engine.recall(memory, queries[0], params)
        rows.append((f"+ {i} small tenant(s)", mib()))
    engine.recall(large, queries[0], params)
    rows.append(("+ 1 tenant of the large size", mib()))
    for q in queries[:20]:  # warm the large tenant's caches
        engine.recall(large, q, params)
    before = cpu_seconds()
    for q in queries:
        engine.recall(large, q, params)
    out.put((rows, (cpu_seconds() - before) / len(queries)))


def ingest_cpu(base: Path, conversations) -> tuple[float, int]:
    import httpx

    from shared.child_process import free_port, wait_healthy
    from shared.redis_server import EmbeddedRedis

    server = EmbeddedRedis(base / "redis-ingest")
    server.start()
    port = free_port()
    env = {**os.environ, "RECALL_REDIS_URL": server.url, "RECALL_INGEST_KEY": KEY, "RECALL_INGEST_PORT": str(port),
           "RECALL_DATA_DIR": str(base / "ingest-data")}
    proc = subprocess.Popen([str(BIN / "recall"), "ingest"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/healthz", 60)
        child = psutil.Process(proc.pid)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"x-ingest-key": KEY}, timeout=10) as client:
            def post(conv) -> None:
                body = {"user": f"user-{hash(conv.conversation_id) % 200}", "conversation_id": conv.conversation_id,
                        "turns": [{"id": f"t{i}", "role": "user" if i % 2 == 0 else "assistant", "text": m,
                                   "ts": "2026-10-08T10:00:00Z"} for i, m in enumerate(conv.messages)]}
                assert client.post("/turns", json=body).status_code == 202
            for conv in conversations[:20]:
                post(conv)
            t = child.cpu_times()
            before = t.user + t.system
            for conv in conversations:
                post(conv)
            t = child.cpu_times()
            return (t.user + t.system - before) / len(conversations), len(conversations)
    finally:
        proc.terminate()
        proc.wait(30)
        server.stop()


def redis_bytes_per_snapshot(base: Path, conversations) -> tuple[float, float]:
    import redis

    from shared.redis_server import EmbeddedRedis
    from shared.stream_schema import StreamTurn, TurnsEvent

    server = EmbeddedRedis(base / "redis-mem")
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        client.xadd("recall:turns", {"kind": "warm"})
        events = [TurnsEvent(user_hash="0" * 24, conversation_id=conv.conversation_id, received_at=time.time(),
                             turns=[StreamTurn(id=f"t{i}", role="user", text=m, ts="2026-10-08T10:00:00Z")
                                    for i, m in enumerate(conv.messages)]).fields() for conv in conversations]
        before = client.info("memory")["used_memory"]
        pipe = client.pipeline()
        for fields in events:
            pipe.xadd("recall:turns", fields)
        pipe.execute()
        used = client.info("memory")["used_memory"] - before
        client.close()
        return used / len(events), sum(sum(len(v) for v in f.values()) for f in events) / len(events)
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--reuse-above", type=int, default=None,
                    help="build tenants larger than this with reused embeddings (no indexer row for them)")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="recall-capacity-") as d:
        base = Path(d)
        index_rows, memories = [], {}
        for n in args.sizes:
            conversations, questions = generate(n)
            write_tree(base / f"src-{n}", conversations)
            reuse = args.reuse_above is not None and n > args.reuse_above
            cpu = index_cpu(base / f"src-{n}", base / f"home-{n}", reuse)
            from shared.engine.index_run import memory_dir

            memories[n] = memory_dir(base / f"home-{n}")
            disk = sum(p.stat().st_size for p in memories[n].rglob("*") if p.is_file()) / 2**20
            index_rows.append([n, "(reused embeddings)" if reuse else f"{cpu:.1f}",
                               "" if reuse else f"{n / cpu:.1f}", f"{disk:.1f}"])
        small = []
        for i in range(args.tenants):
            copy = base / f"tenant-{i}" / "memory"
            shutil.copytree(memories[min(args.sizes)], copy)
            small.append(copy)
        _, questions = generate(max(args.sizes))
        queries = [q.short for q in questions[:100]] + [q.long for q in questions[:100]]
        random.Random(3).shuffle(queries)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        probe = ctx.Process(target=_rss_probe, args=(small, memories[max(args.sizes)], queries, out))
        probe.start()
        rss_rows, recall_cpu = out.get(timeout=1800)
        probe.join()
        conversations, _ = generate(1000, seed=11)
        ingest_cpu_per_req, n_ingest = ingest_cpu(base, conversations[:300])
        redis_per_snapshot, event_bytes = redis_bytes_per_snapshot(base, conversations)

    body = [f"Measured on commit {commit}; CPU figures are process CPU time (user + system, all threads).", "",
            "### Indexer: from-scratch index runs (six-turn conversations)", "",
            table(["conversations", "CPU seconds", "conversations per core-second", "memory on disk (MiB)"], index_rows), "",
            f"### Recall process: resident memory (fresh process; tenants of {min(args.sizes)} conversations, then one of {max(args.sizes)})", "",
            table(["state", "RSS (MiB)", "step (MiB)"],
                  [[name, f"{rss:.0f}", f"{rss - rss_rows[i - 1][1]:+.0f}" if i else ""] for i, (name, rss) in enumerate(rss_rows)]), "",
            f"Warm recall on the {max(args.sizes)}-conversation tenant (k=3, candidates=8, {len(queries)} queries): "
            f"**{recall_cpu * 1000:.1f} ms CPU per call** = {1 / recall_cpu:.0f} calls per core-second (engine only; "
            "the MCP/HTTP layer adds its own share, see the recall-service benchmark).", "",
            "### Ingest and Redis", "",
            table(["figure", "value"], [
                ["ingest CPU per accepted six-turn snapshot (real `recall ingest`, sequential client)",
                 f"{ingest_cpu_per_req * 1000:.2f} ms = {1 / ingest_cpu_per_req:.0f} requests per core-second ({n_ingest} requests)"],
                ["Redis used_memory per pending six-turn snapshot", f"{redis_per_snapshot / 1024:.2f} KiB (event fields {event_bytes / 1024:.2f} KiB)"],
            ])]
    text = "\n".join(body)
    print(text)
    if not args.no_doc:
        write_section("capacity-bench", "python -m bench.capacity_bench " + " ".join(sys.argv[1:]), text)


if __name__ == "__main__":
    main()
