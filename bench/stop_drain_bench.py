"""Posts lost when ingest stops under pooled callers (round 35).

    .venv/bin/python -m bench.stop_drain_bench [--stops 8] [--callers 20] [--gap 0.05]
        [--before-tree DIR] [--no-doc]

A rollout or scale-down sends SIGTERM to a pod whose callers (the gateway's pooled HTTP client)
keep posting on connections they opened earlier. A post sent on a connection the service closes
at that moment is lost: the caller gets ReadError and cannot tell whether its turn was stored. A
post refused a new connection (ConnectError: the listener is closed) is no loss: in Kubernetes the
Service sends it to another pod.

Each stop starts embedded Redis and a real `recall ingest`; `--callers` pooled clients (one
httpx.AsyncClient each) post small conversations with random pauses of 0–2×`--gap` seconds; after
2.5 s the service gets SIGTERM, and the callers go on for 3.5 s more. `--before-tree`: a checkout
of the code before (`git worktree add DIR <commit>`), whose service runs from this venv with
PYTHONPATH=DIR; its stops alternate with this tree's.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import time
from collections import Counter
from pathlib import Path

from bench.probe_latency_bench import INGEST_KEY, turns_payload
from bench.report import median, publish, table
from bench.stack_processes import ingest_alone

SIGTERM_AFTER_S = 2.5
CALLING_S = 6.0


async def stop_under_callers(port: int, proc, callers: int, gap: float, seed: int) -> tuple[Counter, float]:
    """Outcomes of every post, and the seconds from SIGTERM until the process exited."""
    import httpx

    outcomes: Counter = Counter()
    until = time.monotonic() + CALLING_S
    exited: list[float] = []

    async def caller(i: int) -> None:
        rnd = random.Random(seed * 1000 + i)
        async with httpx.AsyncClient(timeout=30, headers={"x-ingest-key": INGEST_KEY}) as http:
            j = 0
            while time.monotonic() < until:
                try:
                    resp = await http.post(f"http://127.0.0.1:{port}/turns", json=turns_payload(f"u{i}", f"c{j}", ["hello"] * 2))
                    outcomes[str(resp.status_code)] += 1
                except httpx.ConnectError:
                    outcomes["ConnectError"] += 1
                    await asyncio.sleep(0.05)
                except httpx.HTTPError as exc:
                    outcomes[type(exc).__name__] += 1
                j += 1
                await asyncio.sleep(rnd.uniform(0, 2 * gap))

    async def terminate() -> None:
        await asyncio.sleep(SIGTERM_AFTER_S)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None:
            await asyncio.sleep(0.02)
        exited.append(time.monotonic() - signalled)

    await asyncio.gather(terminate(), *[caller(i) for i in range(callers)])
    return outcomes, exited[0]


def one_stop(tree: Path | None, args, seed: int) -> dict:
    env = {"RECALL_INGEST_KEY": INGEST_KEY, **({"PYTHONPATH": str(tree)} if tree else {})}
    with ingest_alone(env, "stop-drain-bench-") as (ingest, port):
        outcomes, stop_s = asyncio.run(stop_under_callers(port, ingest, args.callers, args.gap, seed))
    return {"outcomes": outcomes, "stop_s": stop_s}


def render(args, runs: dict[str, list[dict]]) -> str:
    rows = []
    for label, stops in runs.items():
        total: Counter = Counter()
        for s in stops:
            total.update(s["outcomes"])
        lost = sum(v for k, v in total.items() if k not in ("202", "ConnectError"))
        how = ", ".join(f"{k} {v}" for k, v in sorted(total.items()) if k not in ("202", "ConnectError")) or "–"
        rows.append([label, len(stops), total["202"], lost, how, sum(1 for s in stops if any(k not in ("202", "ConnectError") for k in s["outcomes"])),
                     total["ConnectError"], f"{median([s['stop_s'] for s in stops]):.2f}", f"{max(s['stop_s'] for s in stops):.2f}"])
    return (f"{args.callers} pooled callers posting with pauses of 0–{2 * args.gap:g} s, SIGTERM {SIGTERM_AFTER_S:g} s in; "
            f"stops alternate; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, 2 cores:\n\n"
            + table(["code", "stops", "posts answered 202", "posts lost", "how", "stops that lost a post",
                     "refused a new connection (another pod's)", "SIGTERM to exit, median (s)", "max (s)"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stops", type=int, default=8, help="stops of each code")
    ap.add_argument("--callers", type=int, default=20)
    ap.add_argument("--gap", type=float, default=0.05)
    ap.add_argument("--before-tree", type=Path)
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    trees = {"this tree": None, **({f"before ({args.before_tree.name})": args.before_tree} if args.before_tree else {})}
    runs: dict[str, list[dict]] = {label: [] for label in trees}
    for n in range(args.stops):
        for label, tree in (list(trees.items()) if n % 2 == 0 else list(trees.items())[::-1]):
            runs[label].append(one_stop(tree, args, seed=n))
            print(label, dict(runs[label][-1]["outcomes"]), f"stop {runs[label][-1]['stop_s']:.2f}s", flush=True)
    publish("stop_drain_bench", render(args, runs), args.no_doc)


if __name__ == "__main__":
    main()
