"""Probe latency under load (round 34): how long /healthz and /readyz take while a service is busy.

    .venv/bin/python -m bench.probe_latency_bench build --data DIR [--conversations 20000]
    .venv/bin/python -m bench.probe_latency_bench recall --data DIR [--clients 8 16 32] [--seconds 30]
    .venv/bin/python -m bench.probe_latency_bench sigterm --data DIR [--clients 16] [--redis] [--keep-calling]
    .venv/bin/python -m bench.probe_latency_bench stack [--clients 16] [--big-bodies] [--pastes 4] [--bin BIN ...]

Kubernetes restarts a pod whose liveness probe (GET /healthz, 5 s timeout) fails three times in
a row, and a probe that times out because the pod is busy restarts exactly the busy pods. This
measures what a kubelet would see: a separate prober process (blocking sockets, its own
interpreter, so the load generator's own event loop does not delay it) asks /healthz and
/readyz every 0.5 s while N real MCP clients (fastmcp, each its own session and HS256 token)
call `recall_my_conversations` on one big tenant as fast as they are answered.

`--data`: a data dir whose tenant `bench-user` (unkeyed hash) is indexed, as `build` makes it:
`bench.corpus.generate(n)` indexed by the real engine with `bench.recall_cpu_bench`'s
ReusingEmbedder (3,000 real e5 vectors reused, ~1.5 minutes at 20,000 conversations); the
questions are written to `queries.json` beside it.

`sigterm`: the same load with `--clients` in flight, then SIGTERM; the time the process takes to
exit, and when the last in-flight call was answered (`--keep-calling`: the clients go on
calling after the signal; `--redis`: with Redis, as deployed).

`stack`: embedded Redis, ingest and the indexer; ingest under `--clients` connections posting
conversations back to back for `--seconds` (`--big-bodies`: ~3.6 MB each, 19 turns of ~190,000
characters), then the indexer for `--seconds` while `--pastes` users' 150,000-character pastes
index. `--bin` runs the services of other checkouts' venvs in turn (before and after, same run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import pct
from bench.stack_processes import BIN, hs256_token, start, stop_all
from shared.child_process import free_port

SECRET = "bench-secret-0123456789abcdef0123456789"
USER = "bench-user"
PROBE_EVERY_S = 0.5
PROBE_TIMEOUT_S = 10.0  # longer than any probe's timeout, to see how late a late answer is


def probe_forever(port: int, paths: list[str], out: Path) -> None:
    """The prober process: each path every PROBE_EVERY_S on a fresh connection (as kubelet does);
    appends `{"path", "t", "s", "status"}` lines to `out` (status 0: no answer within the timeout)."""
    with out.open("a") as f:
        while True:
            for path in paths:
                t0 = time.perf_counter()
                status = 0
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT_S)
                    conn.request("GET", path)
                    resp = conn.getresponse()
                    resp.read()
                    status = resp.status
                    conn.close()
                except OSError:
                    pass
                f.write(json.dumps({"path": path, "t": time.time(), "s": time.perf_counter() - t0, "status": status}) + "\n")
                f.flush()
            time.sleep(PROBE_EVERY_S)


def start_prober(port: int, paths: list[str], out: Path) -> subprocess.Popen:
    code = f"from bench.probe_latency_bench import probe_forever; from pathlib import Path; " \
           f"probe_forever({port}, {paths!r}, Path({str(out)!r}))"
    return subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1])


def probe_summary(out: Path, since: float, until: float) -> dict[str, dict]:
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    summary = {}
    for path in sorted({r["path"] for r in rows}):
        mine = [r for r in rows if r["path"] == path and since <= r["t"] - r["s"] <= until]
        lat = [r["s"] for r in mine]
        summary[path] = {"n": len(lat), "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "max": max(lat, default=float("nan")),
                         "over_1s": sum(s > 1 for s in lat), "no_answer": sum(r["status"] == 0 for r in mine),
                         "statuses": sorted({r["status"] for r in mine})}
    return summary


async def mcp_load(url: str, queries: list[str], clients: int, seconds: float, stop: asyncio.Event | None = None,
                   session_per_call: bool = False) -> dict:
    """`clients` sessions calling the tool back to back for `seconds` (or until `stop`);
    `session_per_call`: each call opens its own MCP session (initialize, call, close), as an
    agent that connects for one call does."""
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    lat: list[float] = []
    answers: dict[str, int] = {}
    last_answer = [0.0]
    deadline = time.monotonic() + seconds

    async def one(i: int, c) -> None:
        j = 0
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            q = queries[(i * 7919 + j) % len(queries)]
            j += 1
            t0 = time.perf_counter()
            try:
                if session_per_call:
                    async with Client(url, auth=BearerAuth(hs256_token(USER, SECRET)), timeout=60) as own:
                        res = await own.call_tool("recall_my_conversations", {"query": q})
                else:
                    res = await c.call_tool("recall_my_conversations", {"query": q})
                text = res.content[0].text
                kind = "busy" if text.startswith("busy") or "try again" in text else "answer"
            except Exception as exc:  # the service stopped under it (sigterm) or refused
                kind = type(exc).__name__
                answers[kind] = answers.get(kind, 0) + 1
                return
            lat.append(time.perf_counter() - t0)
            last_answer[0] = time.time()
            answers[kind] = answers.get(kind, 0) + 1

    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(Client(url, auth=BearerAuth(hs256_token(USER, SECRET)), timeout=60)) for _ in range(clients)]
        await sessions[0].call_tool("recall_my_conversations", {"query": "warm up"})
        t0 = time.time()
        await asyncio.gather(*[one(i, c) for i, c in enumerate(sessions)])
        with contextlib.suppress(Exception):
            await stack.aclose()
    return {"calls": len(lat), "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "answers": answers, "started": t0,
            "last_answer": last_answer[0]}


def fmt(p: dict) -> str:
    return (f"n={p['n']} p50={p['p50'] * 1000:.1f}ms p99={p['p99'] * 1000:.1f}ms max={p['max'] * 1000:.1f}ms "
            f">1s={p['over_1s']} no_answer={p['no_answer']} statuses={p['statuses']}")


def serve(data: Path, work: Path, extra: dict[str, str], bin_dir: Path = BIN) -> tuple[subprocess.Popen, int]:
    port = free_port()
    env = {"RECALL_DATA_DIR": str(data), "RECALL_JWT_SECRET": SECRET, "RECALL_RECALL_PORT": str(port),
           "RECALL_LOG_LEVEL": "WARNING", "FASTMCP_LOG_ENABLED": "false", **extra}
    return start("serve", env, port, work, bin_dir), port


def recall(args) -> None:
    queries = json.loads((args.data.parent / "queries.json").read_text())
    work = Path(tempfile.mkdtemp(prefix="probe-bench-"))
    proc, port = serve(args.data, work, dict(kv.split("=", 1) for kv in args.service_env), args.bin[0])
    out = work / "probes.jsonl"
    prober = start_prober(port, ["/healthz", "/readyz"], out)
    try:
        time.sleep(3)
        idle = probe_summary(out, 0, time.time())
        print("idle: " + "; ".join(f"{p} {fmt(s)}" for p, s in idle.items()), flush=True)
        for clients in args.clients:
            t0 = time.time()
            load = asyncio.run(mcp_load(f"http://127.0.0.1:{port}/mcp", queries, clients, args.seconds,
                                        session_per_call=args.session_per_call))
            probes = probe_summary(out, t0, time.time())
            print(f"{clients} clients: calls={load['calls']} call p50={load['p50'] * 1000:.0f}ms "
                  f"p99={load['p99'] * 1000:.0f}ms answers={load['answers']} load1={os.getloadavg()[0]:.1f}", flush=True)
            for p, s in probes.items():
                print(f"    {p} {fmt(s)}", flush=True)
    finally:
        prober.kill()
        stop_all(proc)


def sigterm(args) -> None:
    queries = json.loads((args.data.parent / "queries.json").read_text())
    work = Path(tempfile.mkdtemp(prefix="probe-bench-"))
    redis = None
    if args.redis:  # as deployed: the forget listener, the due list and the shared-dir watch run too
        from shared.redis_server import EmbeddedRedis

        (work / "redis").mkdir()
        redis = EmbeddedRedis(work / "redis")
        redis.start()
    for attempt in range(args.rounds):
        extra = {**({"RECALL_REDIS_URL": redis.url} if redis else {}), **dict(kv.split("=", 1) for kv in args.service_env)}
        proc, port = serve(args.data, work, extra, args.bin[0])

        async def run() -> tuple[dict, float, float]:
            stop = asyncio.Event()
            load = asyncio.create_task(mcp_load(f"http://127.0.0.1:{port}/mcp", queries, args.clients, 600, stop))
            await asyncio.sleep(args.warm_s)
            signalled = time.time()
            proc.send_signal(signal.SIGTERM)
            if not args.keep_calling:
                stop.set()  # the clients send nothing more; the calls in flight run to their end
            while proc.poll() is None:
                await asyncio.sleep(0.02)
            exited = time.time()
            return await load, signalled, exited

        load, signalled, exited = asyncio.run(run())
        last = load["last_answer"]
        print(f"sigterm with {args.clients} clients: exit after {exited - signalled:.2f}s (rc={proc.returncode}); "
              f"last in-flight call answered {last - signalled:.2f}s after the signal, exit "
              f"{exited - last:.2f}s after it; answers={load['answers']}", flush=True)
    if redis is not None:
        redis.stop()


INGEST_KEY = "bench-ingest-key-0123456789abcdef"
PASTE_CHARS = 150_000  # a token per character: every chunk at e5's 512 tokens (tests/test_index_fairness.py)


def turns_payload(user: str, conversation_id: str, texts: list[str]) -> dict:
    return {"user": user, "conversation_id": conversation_id,
            "turns": [{"id": f"{conversation_id}-t{i}", "role": "user" if i % 2 == 0 else "assistant", "text": t,
                       "ts": f"2026-10-08T10:{i:02d}:00Z"} for i, t in enumerate(texts)]}


async def post_burst(url: str, clients: int, seconds: float, big: bool = False) -> dict:
    """`clients` connections posting whole conversations back to back: 20 turns of ~600
    characters, or (`big`) 19 turns of ~190,000 (~3.6 MB, under the 4 MiB body limit: what a
    gateway posts for a conversation of pasted logs); beside them, small posts' latency."""
    import httpx

    lat: list[float] = []
    codes: dict[int, int] = {}
    deadline = time.monotonic() + seconds
    text = "The KESTREL rollout moved to Thursday after the pump P-12 gland leak; " * 9

    async def one(i: int) -> None:
        async with httpx.AsyncClient(timeout=60, headers={"x-ingest-key": INGEST_KEY}) as http:
            j = 0
            while time.monotonic() < deadline:
                turns = [(f"{k} {text}" * 300)[:200_000] for k in range(19)] if big else [f"{k} {text}" for k in range(20)]
                body = turns_payload(f"burst-{i}-{j % 50}", f"c{j}", turns)
                j += 1
                t0 = time.perf_counter()
                resp = await http.post(f"{url}/turns", json=body)
                lat.append(time.perf_counter() - t0)
                codes[resp.status_code] = codes.get(resp.status_code, 0) + 1

    small: list[float] = []

    async def small_poster() -> None:
        """One more connection posting a six-turn conversation every 0.2 s: how long a small post
        waits behind the burst's."""
        async with httpx.AsyncClient(timeout=60, headers={"x-ingest-key": INGEST_KEY}) as http:
            while time.monotonic() < deadline:
                t0 = time.perf_counter()
                resp = await http.post(f"{url}/turns", json=turns_payload("small", "chat", [text[:80]] * 6))
                assert resp.status_code == 202, resp.text
                small.append(time.perf_counter() - t0)
                await asyncio.sleep(0.2)

    await asyncio.gather(small_poster(), *[one(i) for i in range(clients)])
    return {"calls": len(lat), "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "codes": codes,
            "small": f"n={len(small)} p50={pct(small, 0.5) * 1000:.0f}ms p99={pct(small, 0.99) * 1000:.0f}ms"}


def stack(args) -> None:
    """`stack_once` with each `--bin` in turn (before and after, in the same run)."""
    for bin_dir in args.bin:
        print(f"== services from {bin_dir}", flush=True)
        stack_once(args, bin_dir)


def stack_once(args, bin_dir: Path) -> None:
    """Ingest under a burst of POST /turns, then the indexer during heavy index runs (pastes)."""
    import httpx

    from shared.redis_server import EmbeddedRedis

    work = Path(tempfile.mkdtemp(prefix="probe-bench-stack-"))
    data = work / "data"
    data.mkdir()
    redis = EmbeddedRedis(work / "redis")
    (work / "redis").mkdir()
    redis.start()
    ingest_port, indexer_port = free_port(), free_port()
    env = {"RECALL_DATA_DIR": str(data), "RECALL_REDIS_URL": redis.url, "RECALL_INGEST_KEY": INGEST_KEY,
           "RECALL_INGEST_PORT": str(ingest_port), "RECALL_INDEXER_PORT": str(indexer_port), "RECALL_LOG_LEVEL": "WARNING",
           "RECALL_INDEX_CONCURRENCY": "2", "RECALL_INDEX_DEBOUNCE_S": "0.2"}
    ingest = start("ingest", env, ingest_port, work, bin_dir)
    indexer = start("indexer", env, indexer_port, work, bin_dir)
    out = work / "probes.jsonl"
    probers = [start_prober(ingest_port, ["/healthz", "/readyz"], out.with_suffix(".ingest")),
               start_prober(indexer_port, ["/healthz", "/readyz"], out.with_suffix(".indexer"))]
    try:
        time.sleep(3)
        for name, f in (("ingest", out.with_suffix(".ingest")), ("indexer", out.with_suffix(".indexer"))):
            print(f"{name} idle: " + "; ".join(f"{p} {fmt(s)}" for p, s in probe_summary(f, 0, time.time()).items()), flush=True)
        t0 = time.time()
        burst = asyncio.run(post_burst(f"http://127.0.0.1:{ingest_port}", args.clients[0], args.seconds, args.big_bodies))
        t1 = time.time()
        print(f"ingest burst, {args.clients[0]} clients{', ~3.6 MB bodies' if args.big_bodies else ''}: posts={burst['calls']} p50={burst['p50'] * 1000:.0f}ms "
              f"p99={burst['p99'] * 1000:.0f}ms codes={burst['codes']} load1={os.getloadavg()[0]:.1f}; "
              f"small posts beside them {burst['small']}", flush=True)
        for name, f in (("ingest", out.with_suffix(".ingest")), ("indexer", out.with_suffix(".indexer"))):
            for p, s in probe_summary(f, t0, t1).items():
                print(f"    {name} {p} {fmt(s)}", flush=True)
        # Heavy index runs: large pasted conversations, each user's run embedding 150,000 characters.
        t2 = time.time()
        for i in range(args.pastes):
            seed = f"paste-{i}"
            body = turns_payload(seed, "dump", [(seed + " " + "漢字の文章" * (PASTE_CHARS // 5))[:PASTE_CHARS]])
            resp = httpx.post(f"http://127.0.0.1:{ingest_port}/turns", json=body, headers={"x-ingest-key": INGEST_KEY}, timeout=60)
            assert resp.status_code == 202, resp.text
        heavy_seen = 0  # samples of the indexer's /metrics that showed a heavy run going
        samples = 0
        while time.time() < t2 + args.seconds:
            time.sleep(2.0)
            metrics = httpx.get(f"http://127.0.0.1:{indexer_port}/metrics", timeout=30).text
            samples += 1
            heavy_seen += any(line.startswith("recall_index_heavy_jobs_running ") and float(line.split()[1]) > 0
                              for line in metrics.splitlines())
        t3 = time.time()
        print(f"indexer, {args.pastes} pastes of {PASTE_CHARS} characters (2 index slots), {args.seconds:.0f}s:"
              f" a heavy run going in {heavy_seen} of {samples} samples; load1={os.getloadavg()[0]:.1f}", flush=True)
        for p, s in probe_summary(out.with_suffix(".indexer"), t2, t3).items():
            print(f"    indexer {p} {fmt(s)}", flush=True)
    finally:
        for p in probers:
            p.kill()
        stop_all(ingest, indexer)
        redis.stop()
        for d in (data, work / "redis"):  # hundreds of MB of posted text; the logs stay
            shutil.rmtree(d, ignore_errors=True)


def build(args) -> None:
    from bench.recall_cpu_bench import ReusingEmbedder, write_src
    from shared.engine.embedder import shared_embedder
    from shared.engine.index_run import index_tree
    from shared.tenant_paths import TenantPaths

    paths = TenantPaths.for_user(args.data, USER)  # unkeyed, as bench/stack_processes.py starts the service
    started = time.perf_counter()
    queries = write_src(paths.src, args.conversations)
    (args.data.parent / "queries.json").write_text(json.dumps(queries))
    index_tree(paths.root, paths.src, ReusingEmbedder(shared_embedder()))
    print(f"built {args.conversations} conversations in {time.perf_counter() - started:.0f}s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["build", "recall", "sigterm", "stack"])
    ap.add_argument("--data", type=Path)
    ap.add_argument("--pastes", type=int, default=4)
    ap.add_argument("--conversations", type=int, default=20000)
    ap.add_argument("--clients", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warm-s", type=float, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--session-per-call", action="store_true")
    ap.add_argument("--keep-calling", action="store_true", help="sigterm: the clients go on calling after the signal")
    ap.add_argument("--service-env", nargs="*", default=[], help="recall, sigterm: KEY=VALUE settings of the service")
    ap.add_argument("--bin", type=Path, nargs="+", default=[BIN], help="stack: venv bin dirs whose `recall` to run, in turn")
    ap.add_argument("--big-bodies", action="store_true", help="stack: the ingest burst posts ~3.6 MB conversations")
    ap.add_argument("--redis", action="store_true", help="sigterm: the service with Redis, as deployed")
    args = ap.parse_args()
    if args.mode == "sigterm":
        args.clients = args.clients[0]
    {"build": build, "recall": recall, "sigterm": sigterm, "stack": stack}[args.mode](args)


if __name__ == "__main__":
    main()
