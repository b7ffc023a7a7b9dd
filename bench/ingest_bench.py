"""Write-path benchmark (issue 3): sustained ingest with one and two indexer workers.

    .venv/bin/python -m bench.ingest_bench [--rate 20] [--seconds 60]

For each worker count, on a fresh embedded redis-server and data dir: a fixed offered load of
`rate` conversations per second for `seconds` (each post is a 6-turn conversation of one of
200 users, about a third of them updates of an earlier conversation, as a gateway resends
whole conversations), the stream backlog sampled every second, and ingest-to-searchable
p50/p95 from the indexers' `recall_ingest_to_searchable_seconds` histogram (interpolated in
its buckets like PromQL's histogram_quantile). Then a short unthrottled burst measures the
accepted turns per second of one ingest process.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis

from bench.report import table, write_section
from bench.stack_processes import start, stop_all
from shared.child_process import free_port
from shared.redis_server import EmbeddedRedis

KEY = "bench-ingest-key-0123456789"
USERS = 200


def payload(user: int, conv: int, rng: random.Random) -> dict:
    turns = [{"role": "user" if i % 2 == 0 else "assistant",
              "text": f"User {user} conversation {conv} turn {i}: ticket MT-{rng.randrange(10**5)} on line N-{rng.randrange(99)} "
                      f"needs a follow-up by {rng.choice(['Priya', 'Tomas', 'Aiko'])} before Friday.",
              "ts": "2026-10-08T10:00:00Z"} for i in range(6)]
    return {"user": f"user-{user}", "conversation_id": f"c{conv}", "turns": turns}


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    total = buckets[-1][1]
    if total == 0:
        return float("nan")
    rank, prev_le, prev_count = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / max(count - prev_count, 1e-9)
        prev_le, prev_count = le, count
    return prev_le


def scrape_buckets(ports: list[int]) -> tuple[list[tuple[float, float]], float, float]:
    merged: dict[float, float] = {}
    total_sum = total_count = 0.0
    for port in ports:
        for line in httpx.get(f"http://127.0.0.1:{port}/metrics").text.splitlines():
            if line.startswith("recall_ingest_to_searchable_seconds_bucket"):
                le = line.split('le="')[1].split('"')[0]
                merged[float(le)] = merged.get(float(le), 0.0) + float(line.split()[-1])
            elif line.startswith("recall_ingest_to_searchable_seconds_sum"):
                total_sum += float(line.split()[-1])
            elif line.startswith("recall_ingest_to_searchable_seconds_count"):
                total_count += float(line.split()[-1])
    return sorted(merged.items()), total_sum, total_count


async def offered_load(url: str, rate: float, seconds: float, r: redis.Redis) -> tuple[int, list[tuple[int, int, int]]]:
    rng = random.Random(5)
    accepted, backlog = 0, []
    sent_convs: dict[int, int] = {}
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=32)) as client:
        async def post(body: dict) -> None:
            nonlocal accepted
            resp = await client.post(f"{url}/turns", json=body, headers={"x-ingest-key": KEY})
            accepted += resp.status_code == 202

        start_t = time.perf_counter()
        tasks, n = [], 0
        next_sample = 0.0
        while (elapsed := time.perf_counter() - start_t) < seconds:
            while n < elapsed * rate:
                user = rng.randrange(USERS)
                conv = sent_convs.get(user, 0)
                if conv == 0 or rng.random() > 0.33:
                    conv += 1
                sent_convs[user] = conv
                tasks.append(asyncio.create_task(post(payload(user, conv, rng))))
                n += 1
            if elapsed >= next_sample:
                backlog.append((int(elapsed), r.xlen("recall:turns"), r.zcard("recall:index:due")))
                next_sample += 1.0
            await asyncio.sleep(0.005)
        await asyncio.gather(*tasks)
    return accepted, backlog


async def burst(url: str, seconds: float, concurrency: int = 16) -> float:
    rng = random.Random(9)
    accepted = 0
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=concurrency)) as client:
        async def worker(w: int) -> None:
            nonlocal accepted
            i = 0
            while time.perf_counter() < deadline:
                body = payload(1000 + w, i, rng)
                resp = await client.post(f"{url}/turns", json=body, headers={"x-ingest-key": KEY})
                accepted += 6 if resp.status_code == 202 else 0
                i += 1

        t0 = time.perf_counter()
        await asyncio.gather(*[worker(w) for w in range(concurrency)])
        return accepted / (time.perf_counter() - t0)


def run(workers: int, rate: float, seconds: float, work: Path) -> dict:
    base = work / f"w{workers}"
    server = EmbeddedRedis(base / "redis")
    server.start()
    r = redis.Redis.from_url(server.url)
    ingest_port = free_port()
    env = {"RECALL_DATA_DIR": str(base / "data"), "RECALL_REDIS_URL": server.url, "RECALL_INGEST_KEY": KEY,
           "RECALL_INGEST_PORT": str(ingest_port), "RECALL_LOG_LEVEL": "WARNING", "RECALL_INDEX_DEBOUNCE_S": "1"}
    procs, idx_ports = [], []
    try:
        procs.append(start("ingest", env, ingest_port, base.parent))
        for _ in range(workers):
            port = free_port()
            idx_ports.append(port)
            procs.append(start("indexer", {**env, "RECALL_INDEXER_PORT": str(port)}, port, base.parent))
        url = f"http://127.0.0.1:{ingest_port}"
        accepted, backlog = asyncio.run(offered_load(url, rate, seconds, r))
        drain_t0 = time.perf_counter()
        while r.xlen("recall:turns") or r.zcard("recall:index:due"):
            time.sleep(0.2)
        drain = time.perf_counter() - drain_t0
        time.sleep(1.0)
        buckets, total, count = scrape_buckets(idx_ports)
        burst_rate = asyncio.run(burst(url, 10))
        return {"workers": workers, "accepted": accepted, "rate": accepted / seconds, "backlog": backlog, "drain": drain,
                "p50": histogram_quantile(0.5, buckets), "p95": histogram_quantile(0.95, buckets),
                "mean": total / count if count else float("nan"), "observed": int(count), "burst": burst_rate}
    finally:
        stop_all(*procs)
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="recall-ingest-bench-"))
    results = [run(w, args.rate, args.seconds, work) for w in (1, 2)]
    summary = table(
        ["indexer workers", "offered (conv/s)", "accepted (conv/s)", "ingest→searchable p50 (s)", "p95 (s)", "mean (s)",
         "snapshots observed", "drain after load (s)", "unthrottled accepted turns/s (1 ingest)"],
        [[x["workers"], args.rate, f"{x['rate']:.1f}", f"{x['p50']:.2f}", f"{x['p95']:.2f}", f"{x['mean']:.2f}",
          x["observed"], f"{x['drain']:.1f}", f"{x['burst']:.0f}"] for x in results])
    samples = sorted({t for x in results for t, _, _ in x["backlog"]})
    pick = [t for t in samples if t % 10 == 0 or t == samples[-1]]
    backlog_rows = []
    for t in pick:
        row: list[object] = [t]
        for x in results:
            match = next(((s, d) for tt, s, d in x["backlog"] if tt == t), ("-", "-"))
            row += list(match)
        backlog_rows.append(row)
    body = (f"Offered load: {args.rate:g} conversation snapshots/s (6 turns each, 200 users) for {args.seconds:g} s, "
            "debounce 1 s.\n\n" + summary + "\n\nBacklog over time (stream entries not yet acked / users waiting for an index run):\n\n"
            + table(["t (s)", "1 worker: stream", "1 worker: users due", "2 workers: stream", "2 workers: users due"], backlog_rows))
    print(body)
    if not args.no_doc:
        write_section("ingest-bench", "python -m bench.ingest_bench " + " ".join(sys.argv[1:]), body)


if __name__ == "__main__":
    main()
