"""Requests lost to the keep-alive race (round 35): a gateway's pooled connections to a busy ingest.

    .venv/bin/python -m bench.keep_alive_bench [--keep-alive 5 75] [--rounds 2] [--callers 40]
        [--posts 8] [--gap 4.9 5.0] [--busy 4] [--no-doc]

A gateway posts each completed turn through a pooled HTTP client. httpx keeps an idle connection
5 s; uvicorn closed one 5 s after its last answer. A post sent on a connection the service is
closing fails at the caller (httpx: ReadError), and nothing tells it whether the turn arrived.

Each run starts embedded Redis and a real `recall ingest` with RECALL_HTTP_KEEP_ALIVE_S set to one
value of `--keep-alive` (5 is uvicorn's default, the code before round 35; 75 this round's), keeps
it busy with `--busy` connections posting ~3.6 MB conversations back to back (its snapshot cleaner
holds the interpreter lock, so its event loop runs late, as a loaded pod's does), and has
`--callers` pooled clients (one httpx.AsyncClient each, its default pool) post a small
conversation, wait a gap drawn from `--gap` seconds, and post again, `--posts` times. Values
alternate for `--rounds` rounds. Counted: posts answered 202, posts that failed on the way (by
exception), and how many new connections the callers opened.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections import Counter

from bench.probe_latency_bench import INGEST_KEY, turns_payload
from bench.report import publish, table
from bench.stack_processes import ingest_alone

BIG_TEXT = "The KESTREL rollout moved to Thursday after the pump P-12 gland leak; " * 9


async def busy_posters(url: str, connections: int, stop: asyncio.Event) -> int:
    """Conversations of ~3.6 MB posted back to back until `stop`; how many were posted."""
    import httpx

    posted = 0

    async def one(i: int) -> None:
        nonlocal posted
        turns = [(f"{k} {BIG_TEXT}" * 300)[:190_000] for k in range(19)]
        async with httpx.AsyncClient(timeout=120, headers={"x-ingest-key": INGEST_KEY}) as http:
            j = 0
            while not stop.is_set():
                await http.post(f"{url}/turns", json=turns_payload(f"busy-{i}-{j % 20}", f"c{j}", turns))
                posted += 1
                j += 1

    await asyncio.gather(*[one(i) for i in range(connections)])
    return posted


async def pooled_callers(url: str, callers: int, posts: int, gap: tuple[float, float], seed: int) -> tuple[Counter, int]:
    """Outcomes of every post after a caller's first (its connection then idle for a gap), and
    the connections the callers opened."""
    import httpx

    outcomes: Counter = Counter()
    opened = 0

    async def caller(i: int) -> None:
        nonlocal opened
        rnd = random.Random(seed * 1000 + i)
        streams: list = []  # each answer's connection, held so that no two share an id()
        async with httpx.AsyncClient(timeout=60, headers={"x-ingest-key": INGEST_KEY}) as http:
            for j in range(posts + 1):
                if j:
                    await asyncio.sleep(rnd.uniform(*gap))
                body = turns_payload(f"caller-{i}", f"chat-{j}", [f"turn {j} of caller {i}"] * 2)
                try:
                    resp = await http.post(f"{url}/turns", json=body)
                    streams.append(resp.extensions["network_stream"])
                    outcome = str(resp.status_code)
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
                if j:
                    outcomes[outcome] += 1
        opened += len({id(s) for s in streams})

    await asyncio.gather(*[caller(i) for i in range(callers)])
    return outcomes, opened


async def one_run(url: str, args, seed: int) -> tuple[Counter, int, int]:
    stop = asyncio.Event()
    busy = asyncio.create_task(busy_posters(url, args.busy, stop))
    await asyncio.sleep(2.0)  # the cleaner is busy before the callers start
    outcomes, opened = await pooled_callers(url, args.callers, args.posts, tuple(args.gap), seed)
    stop.set()
    return outcomes, opened, await busy


def run_with(keep_alive: float, args, seed: int) -> dict:
    env = {"RECALL_INGEST_KEY": INGEST_KEY, "RECALL_HTTP_KEEP_ALIVE_S": str(keep_alive)}
    with ingest_alone(env, "keep-alive-bench-") as (_, port):
        outcomes, opened, busy = asyncio.run(one_run(f"http://127.0.0.1:{port}", args, seed))
    return {"keep_alive": keep_alive, "outcomes": outcomes, "opened": opened, "busy": busy, "load": os.getloadavg()[0]}


def render(args, runs: list[dict]) -> str:
    rows = []
    for r in runs:
        sent = sum(r["outcomes"].values())
        lost = sent - r["outcomes"].get("202", 0)
        errors = ", ".join(f"{k} {v}" for k, v in sorted(r["outcomes"].items()) if k != "202") or "–"
        rows.append([f"{r['keep_alive']:g}", sent, lost, f"{100 * lost / max(sent, 1):.1f}", errors, r["opened"], r["busy"], f"{r['load']:.1f}"])
    return (f"{args.callers} pooled callers (httpx.AsyncClient, default pool: 5 s keep-alive), {args.posts} posts each after "
            f"gaps of {args.gap[0]:g}–{args.gap[1]:g} s, beside {args.busy} connections posting ~3.6 MB conversations; "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, 2 cores:\n\n"
            + table(["RECALL_HTTP_KEEP_ALIVE_S (s)", "posts after a gap", "lost", "lost (%)", "how they failed",
                     "connections the callers opened", "busy posts", "load1"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep-alive", type=float, nargs="+", default=[5.0, 75.0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--callers", type=int, default=40)
    ap.add_argument("--posts", type=int, default=8)
    ap.add_argument("--gap", type=float, nargs=2, default=[4.9, 5.0])
    ap.add_argument("--busy", type=int, default=4)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    runs = []
    for r in range(args.rounds):
        for keep_alive in (args.keep_alive if r % 2 == 0 else args.keep_alive[::-1]):
            runs.append(run_with(keep_alive, args, seed=r))
            print(render(args, runs[-1:]).splitlines()[-1], flush=True)
    publish("keep_alive_bench", render(args, runs), args.no_doc)


if __name__ == "__main__":
    main()
