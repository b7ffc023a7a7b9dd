"""What the Kubernetes probes and resource requests must allow for, measured on the real services.

    .venv/bin/python -m bench.service_footprint_bench [--tenants 40] [--conversations 15] [--recall-seconds 30]

On a fresh embedded redis-server and data dir, the three services (`recall ingest`, `recall
indexer`, `recall serve`, the images' commands) are started one after another; for each: the wall
time from spawn to its first `/healthz` 200, its process CPU and RSS then. Then
`tenants x conversations` six-turn snapshots are posted and indexed, then 4 MCP clients recall
across every tenant for `--recall-seconds`. Throughout, a prober calls each service's `/healthz`
and `/readyz` every 100 ms with the probes' 1 s timeout (kubelet's default `timeoutSeconds`),
like kubelet, and records the latency; the idle phase before any traffic is the baseline. RSS is
sampled every 100 ms (the peak is what a memory limit must hold).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
import redis

from bench.ingest_bench import KEY, payload
from bench.report import pct, table, write_section
from bench.stack_processes import hs256_token, start, stop_all
from shared.child_process import free_port
from shared.redis_server import EmbeddedRedis

JWT_SECRET = "bench-footprint-jwt-secret-0123456789abcdef"
SERVICES = (("ingest", "RECALL_INGEST_PORT"), ("indexer", "RECALL_INDEXER_PORT"), ("serve", "RECALL_RECALL_PORT"))
PROBE_TIMEOUT_S = 1.0


class Prober(threading.Thread):
    """kubelet's view: GET /healthz and /readyz every 100 ms; latency per phase, failures, peak RSS."""

    def __init__(self, ports: dict[str, int], procs: dict[str, psutil.Process]) -> None:
        super().__init__(daemon=True)
        self.ports, self.procs = ports, procs
        self.phase = "idle"
        self.latency: dict[tuple[str, str], list[float]] = {}
        self.failures: dict[tuple[str, str], int] = {}
        self.peak_rss = {name: 0 for name in ports}
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
            while not self.done.is_set():
                for name, port in self.ports.items():
                    self.peak_rss[name] = max(self.peak_rss[name], self.procs[name].memory_info().rss)
                    for path in ("healthz", "readyz"):
                        key = (name, self.phase)
                        t0 = time.perf_counter()
                        try:
                            ok = client.get(f"http://127.0.0.1:{port}/{path}").status_code == 200
                        except httpx.HTTPError:
                            ok = False
                        self.latency.setdefault(key, []).append(time.perf_counter() - t0)
                        self.failures[key] = self.failures.get(key, 0) + (not ok)
                time.sleep(0.1)


async def recall_load(port: int, tenants: int, seconds: float, clients: int = 4) -> int:
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    calls = 0
    deadline = time.perf_counter() + seconds

    async def client_loop(c: int) -> None:
        nonlocal calls
        rng = random.Random(c)
        while time.perf_counter() < deadline:
            user = rng.randrange(tenants)
            async with Client(f"http://127.0.0.1:{port}/mcp", auth=BearerAuth(hs256_token(f"user-{user}", JWT_SECRET))) as mcp:
                for _ in range(5):
                    await mcp.call_tool("recall_my_conversations", {"query": f"ticket on line N-{rng.randrange(99)}"})
                    calls += 1

    await asyncio.gather(*(client_loop(c) for c in range(clients)))
    return calls


def post_all(port: int, tenants: int, conversations: int) -> None:
    rng = random.Random(7)
    with httpx.Client(timeout=30) as client:
        for conv in range(conversations):
            for user in range(tenants):
                resp = client.post(f"http://127.0.0.1:{port}/turns", json=payload(user, conv, rng), headers={"x-ingest-key": KEY})
                assert resp.status_code == 202, resp.text


def mib(n: float) -> str:
    return f"{n / 2**20:.0f}"


def run(tenants: int, conversations: int, recall_seconds: float, work: Path) -> str:
    server = EmbeddedRedis(work / "redis")
    server.start()
    r = redis.Redis.from_url(server.url)
    ports = {name: free_port() for name, _ in SERVICES}
    env = {"RECALL_DATA_DIR": str(work / "data"), "RECALL_REDIS_URL": server.url, "RECALL_INGEST_KEY": KEY,
           "RECALL_JWT_SECRET": JWT_SECRET, "RECALL_LOG_LEVEL": "WARNING", "RECALL_INDEX_DEBOUNCE_S": "1",
           "FASTMCP_LOG_ENABLED": "false", **{var: str(ports[name]) for name, var in SERVICES}}
    procs: dict[str, psutil.Process] = {}
    started, start_rows = [], []
    try:
        for name, _ in SERVICES:
            t0 = time.perf_counter()
            proc = start(name, env, ports[name], work)
            wall = time.perf_counter() - t0
            started.append(proc)
            procs[name] = ps = psutil.Process(proc.pid)
            start_rows.append((name, wall, sum(ps.cpu_times()[:2]), ps.memory_info().rss))
        prober = Prober(ports, procs)
        prober.start()
        time.sleep(10)  # idle baseline

        prober.phase = "indexing"
        t0 = time.perf_counter()
        post_all(ports["ingest"], tenants, conversations)
        time.sleep(2)  # the indexer picks the last posts up
        while r.xlen("recall:turns") or r.zcard("recall:index:due"):
            time.sleep(0.2)
        index_wall = time.perf_counter() - t0
        time.sleep(2)  # a run started by the last writes

        prober.phase = "recalling"
        calls = asyncio.run(recall_load(ports["serve"], tenants, recall_seconds))
        prober.done.set()
        prober.join(5)
        after = {name: ps.memory_info().rss for name, ps in procs.items()}
        cpu_total = {name: sum(ps.cpu_times()[:2]) for name, ps in procs.items()}
    finally:
        stop_all(*started)
        server.stop()

    rows = [[name, f"{wall:.1f}", f"{cpu:.1f}", mib(rss), mib(after[name]), mib(prober.peak_rss[name]), f"{cpu_total[name]:.0f}"]
            for name, wall, cpu, rss in start_rows]
    probe_rows = []
    for name, _ in SERVICES:
        for phase in ("idle", "indexing", "recalling"):
            lat = prober.latency.get((name, phase), [])
            probe_rows.append([name, phase, len(lat), f"{pct(lat, 0.5) * 1000:.1f}", f"{pct(lat, 0.99) * 1000:.1f}",
                               f"{max(lat, default=float('nan')) * 1000:.1f}", prober.failures.get((name, phase), 0)])
    return (f"{tenants} tenants x {conversations} six-turn conversations posted and indexed in {index_wall:.0f} s; "
            f"then {calls} recalls from 4 MCP clients over {recall_seconds:.0f} s; machine: {os.cpu_count()} cores, "
            f"load average {os.getloadavg()[0]:.1f} at the end.\n\n"
            + table(["service", "spawn to /healthz (s)", "CPU at ready (s)", "RSS at ready (MiB)", "RSS at the end (MiB)",
                     "peak RSS (MiB)", "CPU over the run (s)"], rows)
            + "\n\nProbe latency (`/healthz` and `/readyz`, every 100 ms, 1 s timeout; idle = before any traffic, the baseline):\n\n"
            + table(["service", "phase", "probes", "p50 (ms)", "p99 (ms)", "max (ms)", "failed or > 1 s"], probe_rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tenants", type=int, default=40)
    ap.add_argument("--conversations", type=int, default=15)
    ap.add_argument("--recall-seconds", type=float, default=30)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    body = run(args.tenants, args.conversations, args.recall_seconds, Path(tempfile.mkdtemp(prefix="recall-footprint-")))
    print(body)
    if not args.no_doc:
        write_section("service-footprint-bench",
                      f"python -m bench.service_footprint_bench --tenants {args.tenants} --conversations {args.conversations} "
                      f"--recall-seconds {args.recall_seconds:g}", body)


if __name__ == "__main__":
    main()
