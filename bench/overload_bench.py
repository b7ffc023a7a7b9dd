"""Overload benchmark (issue 11, "timeouts do not bound work"): 30 concurrent MCP clients for a
bounded time against one recall replica (embedded engine, default settings), hot tenants.

    .venv/bin/python -m bench.overload_bench [--clients 30] [--seconds 20] [--baseline-bin DIR]

Every client holds one MCP session over streamable HTTP and calls `recall_my_conversations`
back to back on one of a few tenants (client i → tenant i mod tenants, so searches of one memory
queue on its reader). Reported: client-side latency of every call, how each call was answered,
and the server process's CPU time and peak thread count. `--baseline-bin` runs the same load, in
the same run, against a second tree's `recall` (e.g. a worktree of the commit before the change,
with its own `make install`), so the table holds a before and an after. The memories are indexed
by this tree's engine, so the baseline must read the same index format and embedding model (a
baseline that cannot answers every call "unavailable").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench.corpus import conversation_lines, generate
from bench.report import ms, pct, table, write_section
from bench.stack_processes import hs256_token
from shared.child_process import free_port, stop, wait_healthy
from shared.engine.embedder import shared_embedder
from shared.engine.index_run import index_tree
from shared.recall_answer_format import UNAVAILABLE
from shared.tenant_paths import TenantPaths

SECRET = "bench-secret-0123456789abcdef0123456789"
BUSY_PREFIX = "Conversation memory is busy"


def build_tenants(data: Path, conversations: int, tenants: int) -> list[str]:
    """One indexed memory, copied for every tenant (same size, independent readers)."""
    users = [f"bench-user-{i}" for i in range(tenants)]
    first = TenantPaths.for_user(data, users[0])
    convs, _ = generate(conversations)
    first.src.mkdir(parents=True)
    for c in convs:
        (first.src / f"{c.conversation_id}.funes.jsonl").write_text(conversation_lines(c))
    index_tree(first.root, first.src, shared_embedder())
    for user in users[1:]:
        shutil.copytree(first.root, TenantPaths.for_user(data, user).root)
    return users


async def load(url: str, users: list[str], queries: list[str], clients: int, seconds: float) -> tuple[list[float], dict]:
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    lat: list[float] = []
    outcomes = {"answered": 0, "busy": 0, "unavailable": 0, "error": 0}
    stop_at = time.monotonic() + seconds

    async def one_client(i: int) -> None:
        rng = random.Random(i)
        user = users[i % len(users)]
        async with Client(url, auth=BearerAuth(hs256_token(user, SECRET)), timeout=120) as c:
            # At least one call each: the 0.01 s warm-up used to end before any session opened,
            # so the measured run began with cold readers (30 first calls racing on 3 memories).
            calls = 0
            while calls == 0 or time.monotonic() < stop_at:
                calls += 1
                t0 = time.perf_counter()
                try:
                    res = await c.call_tool("recall_my_conversations", {"query": rng.choice(queries)})
                    text = res.content[0].text
                    kind = "busy" if text.startswith(BUSY_PREFIX) else "unavailable" if text == UNAVAILABLE else "answered"
                except Exception:
                    kind = "error"
                lat.append(time.perf_counter() - t0)
                outcomes[kind] += 1

    await asyncio.gather(*[one_client(i) for i in range(clients)])
    return lat, outcomes


def run_variant(name: str, recall_bin: Path, data: Path, work: Path, users: list[str], queries: list[str],
                clients: int, seconds: float) -> list[object]:
    port = free_port()
    env = {**os.environ, "RECALL_USER_HASH_KEY": "",  # unkeyed: this process writes the tenants' paths
           "RECALL_DATA_DIR": str(data), "RECALL_JWT_SECRET": SECRET, "RECALL_RECALL_PORT": str(port),
           "RECALL_ENGINE": "embedded", "RECALL_LOG_LEVEL": "ERROR"}
    log = open(work / f"serve-{name}.log", "wb")
    proc = subprocess.Popen([str(recall_bin), "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/healthz", 120)
        server = psutil.Process(proc.pid)
        # Warm every tenant's reader, then measure.
        asyncio.run(load(f"http://127.0.0.1:{port}/mcp", users, queries[:1], len(users), 0.01))
        cpu0 = sum(server.cpu_times()[:2])
        peak_threads, sampling = [server.num_threads()], True

        def sample() -> None:
            while sampling:
                peak_threads.append(server.num_threads())
                time.sleep(0.1)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        lat, outcomes = asyncio.run(load(f"http://127.0.0.1:{port}/mcp", users, queries, clients, seconds))
        # Work still running after the clients stopped is work the service did not bound.
        time.sleep(2.0)
        sampling = False
        sampler.join()
        cpu = sum(server.cpu_times()[:2]) - cpu0
    finally:
        stop(proc)
    return [name, len(lat), ms(pct(lat, 0.5)), ms(pct(lat, 0.95)), ms(pct(lat, 0.99)), ms(max(lat)),
            outcomes["answered"], outcomes["busy"], outcomes["unavailable"], outcomes["error"], f"{cpu:.1f}",
            max(peak_threads)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=2000, help="per tenant")
    ap.add_argument("--tenants", type=int, default=3)
    ap.add_argument("--clients", type=int, default=30)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--baseline-bin", type=Path, help="bin/ of another tree's venv: the 'before' in the same run")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="recall-overload-bench-"))
    try:
        data = work / "data"
        users = build_tenants(data, args.conversations, args.tenants)
        _, questions = generate(args.conversations)
        rng = random.Random(1)
        queries = [q.short for q in rng.sample(questions, 50)] + [q.long for q in rng.sample(questions, 50)]
        variants = [("this tree", Path(sys.executable).parent / "recall")]
        if args.baseline_bin:
            variants.insert(0, ("baseline (--baseline-bin)", args.baseline_bin / "recall"))
        rows = [run_variant(name, binary, data, work, users, queries, args.clients, args.seconds)
                for name, binary in variants]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    body = (f"{args.clients} concurrent MCP clients for {args.seconds:.0f} s on one replica (embedded engine, default "
            f"RECALL_MAX_CONCURRENCY=4, RECALL_QUEUE_MAX=32, RECALL_QUEUE_WAIT_S=1, RECALL_TIMEOUT_S=10); "
            f"{args.tenants} tenants of {args.conversations} conversations each, client i on tenant i mod "
            f"{args.tenants}; 2 cores shared with the clients. Server CPU is user+system time from the first "
            "call to 2 s after the last.\n\n"
            + table(["server", "calls", "p50 (ms)", "p95 (ms)", "p99 (ms)", "max (ms)", "answered", "busy",
                     "unavailable", "MCP errors", "server CPU (s)", "peak threads"], rows))
    print(body)
    if not args.no_doc:
        write_section("overload-bench", "python -m bench.overload_bench " + " ".join(sys.argv[1:]), body)


if __name__ == "__main__":
    main()
