"""Recall service benchmark (issue 4): end-to-end MCP latency for a 10,000-conversation tenant.

    .venv/bin/python -m bench.recall_service_bench [--conversations 10000] [--calls 200] [--memory-from DIR]

One run measures, with the same tenant memory and queries: the service with the embedded
engine, the service with the funes-mode process pool (`recall-engine mcp` children), and the
seed's baseline of one fresh engine process per call (`recall-engine recall`, no HTTP, so the
baseline is measured at its most favourable). 1 and 16 concurrent clients; each client holds
one MCP session over streamable HTTP with a bearer token. Beside the latencies: calls/s of the
measured calls and the service's CPU per call (user + system from /proc, its live engine
children included), the clients running on the same machine. `--memory-from` copies a memory
directory already indexed from the same corpus (`bench.corpus.generate(conversations)`, the
default model) instead of indexing it again: ~16 minutes of CPU with e5 at 10k.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.corpus import conversation_lines, generate
from bench.report import ms, pct, table, write_section
from bench.stack_processes import BIN, hs256_token, start, stop_all, tree_cpu_s
from shared.child_process import free_port
from shared.engine.embedder import shared_embedder
from shared.engine.index_run import index_tree
from shared.tenant_paths import TenantPaths

SECRET = "bench-secret-0123456789abcdef0123456789"
USER = "bench-user"


async def mcp_latencies(url: str, queries: list[str], clients: int, calls: int, server_pid: int) -> tuple[list[float], float, float]:
    """Per-call latencies, then the wall time and the service's CPU seconds of the measured calls
    (sessions opened and warmed up before the clock starts)."""
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    lat: list[float] = []

    async def one_client(i: int, c) -> None:
        for j in range(calls // clients):
            q = queries[(i * 7919 + j) % len(queries)]
            t0 = time.perf_counter()
            res = await c.call_tool("recall_my_conversations", {"query": q})
            lat.append(time.perf_counter() - t0)
            assert res.content[0].text and "unavailable" not in res.content[0].text

    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(Client(url, auth=BearerAuth(hs256_token(USER, SECRET)))) for _ in range(clients)]
        for c in sessions:
            await c.call_tool("recall_my_conversations", {"query": "warm up"})
        cpu0, wall0 = tree_cpu_s(server_pid), time.perf_counter()
        await asyncio.gather(*[one_client(i, c) for i, c in enumerate(sessions)])
        return lat, time.perf_counter() - wall0, tree_cpu_s(server_pid) - cpu0


async def process_per_call(memory: Path, queries: list[str], clients: int, calls: int) -> list[float]:
    lat: list[float] = []
    sem = asyncio.Semaphore(clients)

    async def one(q: str) -> None:
        async with sem:
            t0 = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(str(BIN / "recall-engine"), "recall", "-k", "3", "--candidates", "8",
                                                        "--memory", str(memory), "--", q,
                                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            await proc.wait()
            lat.append(time.perf_counter() - t0)

    await asyncio.gather(*[one(queries[i % len(queries)]) for i in range(calls)])
    return lat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=10000)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--baseline-calls", type=int, default=32)
    ap.add_argument("--memory-from", type=Path, help="a memory dir indexed from the same corpus, copied instead of indexing")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="recall-svc-bench-"))
    data = work / "data"
    paths = TenantPaths.for_user(data, USER)
    convs, questions = generate(args.conversations)
    paths.src.mkdir(parents=True)
    for c in convs:
        (paths.src / f"{c.conversation_id}.funes.jsonl").write_text(conversation_lines(c))
    t0 = time.perf_counter()
    if args.memory_from:
        shutil.copytree(args.memory_from, paths.memory)
    else:
        index_tree(paths.root, paths.src, shared_embedder())
    print(f"{'copied' if args.memory_from else 'indexed'} {args.conversations} conversations in "
          f"{time.perf_counter() - t0:.0f}s", file=sys.stderr)
    rng = random.Random(1)
    queries = [q.short for q in rng.sample(questions, 100)] + [q.long for q in rng.sample(questions, 100)]
    rows = []
    results: dict[tuple[str, int], list[float]] = {}
    throughput: dict[tuple[str, int], tuple[float, float]] = {}  # calls/s, service CPU ms per call
    for engine in ("embedded", "funes"):
        port = free_port()
        env = {"RECALL_DATA_DIR": str(data), "RECALL_JWT_SECRET": SECRET, "RECALL_RECALL_PORT": str(port),
               "RECALL_ENGINE": engine, "RECALL_FUNES_BIN": str(BIN / "recall-engine"), "RECALL_LOG_LEVEL": "WARNING"}
        proc = start("serve", env, port, work)
        try:
            for clients in (1, 16):
                lat, wall, cpu = asyncio.run(mcp_latencies(f"http://127.0.0.1:{port}/mcp", queries, clients, args.calls, proc.pid))
                results[(engine, clients)] = lat
                throughput[(engine, clients)] = (len(lat) / wall, 1000 * cpu / len(lat))
        finally:
            stop_all(proc)
    for clients in (1, 16):
        results[("process per call (seed baseline)", clients)] = asyncio.run(
            process_per_call(paths.memory, queries, clients, args.baseline_calls))
    for (name, clients), lat in results.items():
        calls_s, cpu_ms = throughput.get((name, clients), (None, None))
        rows.append([name, clients, len(lat), ms(pct(lat, 0.5)), ms(pct(lat, 0.95)), ms(pct(lat, 0.99)),
                     "–" if calls_s is None else f"{calls_s:.0f}", "–" if cpu_ms is None else f"{cpu_ms:.1f}"])
    speedup = [[c, f"{pct(results[('process per call (seed baseline)', c)], 0.5) / pct(results[('embedded', c)], 0.5):.0f}x",
                f"{pct(results[('process per call (seed baseline)', c)], 0.5) / pct(results[('funes', c)], 0.5):.0f}x"]
               for c in (1, 16)]
    body = (f"Tenant with {args.conversations} conversations ({args.conversations * 6} chunks); k=3, candidates=8; "
            "queries: 100 short identifier queries and 100 long paraphrased questions.\n\n"
            + table(["engine", "concurrent clients", "calls", "p50 (ms)", "p95 (ms)", "p99 (ms)", "calls/s",
                     "service CPU per call (ms; with its engine children)"], rows)
            + "\n\nSpeed-up of the p50 over the process-per-call baseline:\n\n"
            + table(["concurrent clients", "embedded", "funes-mode pool"], speedup))
    print(body)
    if not args.no_doc:
        write_section("recall-service-bench", "python -m bench.recall_service_bench " + " ".join(sys.argv[1:]), body)


if __name__ == "__main__":
    main()
