"""Load and fault suite (issue 11): the write path under kill -9 and a forget storm.

    .venv/bin/python -m bench.chaos_bench [--users 120] [--rate 4] [--seconds 45] [--storm-users 100] [--storm-seconds 12]
        [--tenants 300] [--clients 16] [--read-seconds 60] [--sessions 8] [--only write|read]

1. Steady ingest with faults (users post in shuffled rounds, so every user posts). One ingest process and two indexers on an embedded redis-server
   (AOF, `appendfsync everysec`, as `recall up` runs it). `users` users post new two-turn
   conversations at `rate` per second for `seconds`, each carrying a unique fact code. A third
   of the way in, one indexer is killed with SIGKILL (and restarted 2 s later); two thirds of
   the way in, Redis is killed with SIGKILL and restarted on the same AOF and port. The
   load generator behaves like the gateway: a 503 or a connection error is retried until the
   conversation is accepted (202). After the stream drains: every accepted conversation must
   be on disk, indexed exactly once, and findable by its code through the engine.
2. A forget storm racing in-flight snapshots. `storm-users` users each have a conversation that
   keeps getting new snapshots (a fresh marker each) while a DELETE of it is sent in the middle.
   After every receipt is `done`: resurrections = conversations whose file or index holds a
   marker accepted before the DELETE was sent; marker bytes anywhere = such markers found in
   any file under the data dir or Redis's directory (AOF included).

3. The read side (bench/chaos_read.py): `tenants` tenants with skewed traffic, `clients`
   concurrent MCP clients over HTTP against a real recall service, a reader cache smaller than
   the tenant count, forget drops racing searches; errors, false "unavailable", busy answers,
   latency, and the service's RSS, fds and threads before and after. `--only read` runs (and
   rewrites the doc section of) this part alone, `--only write` parts 1 and 2.

Baseline in the same run: the unfaulted steady phase's ingest→searchable numbers are reported
beside the faulted ones (both from the indexers' histogram).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis

from bench.chaos_read import read_phase
from bench.ingest_bench import histogram_quantile, scrape_buckets
from bench.report import DOC, table, write_section
from bench.stack_processes import start, stop_all
from shared.child_process import free_port
from shared.redis_server import EmbeddedRedis
from shared.tenant_paths import TenantPaths

KEY = secrets.token_urlsafe(32)


class Stack:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.data = work / "data"
        self.redis = EmbeddedRedis(self.data / "redis")
        self.redis.start()
        self.ingest_port = free_port()
        self.env = {"RECALL_DATA_DIR": str(self.data), "RECALL_REDIS_URL": self.redis.url, "RECALL_INGEST_KEY": KEY,
                    "RECALL_INGEST_PORT": str(self.ingest_port), "RECALL_LOG_LEVEL": "WARNING",
                    "RECALL_INDEX_DEBOUNCE_S": "1", "RECALL_RECLAIM_IDLE_MS": "3000", "RECALL_INDEX_LOCK_TTL_S": "5"}
        self.ingest = start("ingest", self.env, self.ingest_port, work)
        self.indexer_ports = [free_port(), free_port()]
        self.indexers = [self._indexer(p) for p in self.indexer_ports]

    def _indexer(self, port: int):
        return start("indexer", {**self.env, "RECALL_INDEXER_PORT": str(port)}, port, self.work)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ingest_port}"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.redis.url, decode_responses=True)

    def kill_indexer(self, i: int) -> None:
        self.indexers[i].kill()
        self.indexers[i].wait()

    def restart_indexer(self, i: int) -> None:
        self.indexers[i] = self._indexer(self.indexer_ports[i])

    def kill_redis(self) -> None:
        self.redis.kill()

    def restart_redis(self) -> None:
        self.redis = EmbeddedRedis(self.data / "redis", port=self.redis.port)
        self.redis.start()

    def drained(self) -> bool:
        try:
            r = self.client()
            return r.xlen("recall:turns") == 0 and r.zcard("recall:index:due") == 0 and \
                r.xpending("recall:turns", "indexers")["pending"] == 0
        except redis.RedisError:
            return False

    def wait_drained(self, timeout: float = 900) -> float:
        t0 = time.perf_counter()
        while not self.drained():
            if time.perf_counter() - t0 > timeout:
                raise RuntimeError("the stream did not drain")
            time.sleep(0.25)
        time.sleep(2.0)  # the debounce of the last runs
        while not self.drained():
            time.sleep(0.25)
        return time.perf_counter() - t0

    def stop(self) -> None:
        stop_all(self.ingest, *self.indexers)
        self.redis.stop()


async def post_until_accepted(client: httpx.AsyncClient, url: str, body: dict, stats: dict) -> float:
    """Like the gateway: retry 503s and connection errors; returns when the post was accepted."""
    while True:
        try:
            resp = await client.post(f"{url}/turns", json=body, headers={"x-ingest-key": KEY})
            if resp.status_code == 202:
                return time.perf_counter()
            stats[f"http {resp.status_code}"] = stats.get(f"http {resp.status_code}", 0) + 1
            if resp.status_code != 503:
                raise RuntimeError(f"unexpected {resp.status_code}: {resp.text[:200]}")
        except httpx.TransportError:
            stats["connection errors"] = stats.get("connection errors", 0) + 1
        await asyncio.sleep(0.2)


def conversation(user: int, conv: int, code: str) -> dict:
    return {"user": f"user-{user}", "conversation_id": f"c{conv}", "turns": [
        {"role": "user", "text": f"Where do we stand on fact {code} for line N-{conv % 97}?", "ts": "2026-10-08T10:00:00Z"},
        {"role": "assistant", "text": f"Fact {code}: the valve on line N-{conv % 97} was replaced by Priya.",
         "ts": "2026-10-08T10:00:05Z"}]}


async def steady_load(stack: Stack, users: int, rate: float, seconds: float, faults: bool, stats: dict,
                      events: list[str]) -> dict[tuple[int, int], str]:
    rng = random.Random(11 if faults else 7)
    accepted: dict[tuple[int, int], str] = {}
    counters = {u: 0 for u in range(users)}
    loop_start = time.perf_counter()
    fault_plan = [(seconds / 3, "kill -9 indexer 1"), (seconds / 3 + 2, "restart indexer 1"),
                  (2 * seconds / 3, "kill -9 redis"), (2 * seconds / 3 + 1, "restart redis on its AOF")] if faults else []

    async def one(user: int, conv: int) -> None:
        code = f"F{user:03d}X{conv:03d}Q{rng.randrange(10**6):06d}"
        await post_until_accepted(client, stack.url, conversation(user, conv, code), stats)
        accepted[(user, conv)] = code

    actions = {"kill -9 indexer 1": lambda: stack.kill_indexer(1), "restart indexer 1": lambda: stack.restart_indexer(1),
               "kill -9 redis": stack.kill_redis, "restart redis on its AOF": stack.restart_redis}

    async def inject_faults() -> None:  # on its own task, so the offered load never pauses for them
        for at, what in fault_plan:
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - loop_start)))
            events.append(f"t={time.perf_counter() - loop_start:.0f}s {what}")
            await asyncio.to_thread(actions[what])

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as client:
        faults_done = asyncio.create_task(inject_faults())
        tasks, n = [], 0
        while (elapsed := time.perf_counter() - loop_start) < seconds or not faults_done.done():
            while n < elapsed * rate:
                if n % users == 0:
                    order = rng.sample(range(users), users)  # every user posts once per round
                user = order[n % users]
                counters[user] += 1
                tasks.append(asyncio.create_task(one(user, counters[user])))
                n += 1
            await asyncio.sleep(0.01)
        await faults_done
        await asyncio.gather(*tasks)
    return accepted


def verify(stack: Stack, accepted: dict[tuple[int, int], str]) -> dict:
    from shared.engine.api import Engine
    from shared.engine.embedder import shared_embedder
    from shared.engine.hybrid_search import RecallParams

    engine = Engine(embedder=shared_embedder())
    lost = duplicated = not_findable = 0
    by_user: dict[int, list[tuple[int, str]]] = {}
    for (user, conv), code in accepted.items():
        by_user.setdefault(user, []).append((conv, code))
    for user, convs in by_user.items():
        paths = TenantPaths.for_user(stack.data, f"user-{user}")
        db = paths.memory / "chunks.sqlite3"
        rows: list[str] = []
        if db.exists():
            conn = sqlite3.connect(db)
            rows = [t for (t,) in conn.execute("SELECT text FROM chunks")]
            conn.close()
        for conv, code in convs:
            on_disk = paths.transcript(f"c{conv}").exists() and code in paths.transcript(f"c{conv}").read_text()
            in_index = sum(code in t for t in rows)
            if not on_disk or in_index == 0:
                lost += 1
                continue
            duplicated += max(0, in_index - 2)  # two turns, each its own chunk
            out = engine.recall(paths.memory, f"fact {code}", RecallParams(k=3))
            not_findable += code not in out
    return {"lost": lost, "duplicated": duplicated, "not_findable": not_findable}


def steady_phase(work: Path, users: int, rate: float, seconds: float, faults: bool) -> dict:
    stack = Stack(work / ("faulted" if faults else "baseline"))
    stats: dict[str, int] = {}
    events: list[str] = []
    try:
        accepted = asyncio.run(steady_load(stack, users, rate, seconds, faults, stats, events))
        drain = stack.wait_drained()
        buckets, _, count = scrape_buckets(stack.indexer_ports)
        checked = verify(stack, accepted)
        return {"faults": faults, "accepted": len(accepted), "users": len({u for u, _ in accepted}), "drain": drain,
                "p50": histogram_quantile(0.5, buckets), "p95": histogram_quantile(0.95, buckets), "stats": stats,
                "events": events, **checked}
    finally:
        stack.stop()


async def storm_load(stack: Stack, users: int, seconds: float) -> tuple[dict, dict[int, list[str]], int]:
    """Per user: snapshots with fresh markers every ~0.3 s; a DELETE in the middle of the stream of them."""
    before: dict[int, list[str]] = {u: [] for u in range(users)}  # markers accepted before the DELETE was sent
    receipts: dict[int, str] = {}
    rng = random.Random(3)
    in_flight_at_delete = 0

    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=64)) as client:
        async def user_loop(u: int) -> None:
            delete_at = time.perf_counter() + rng.uniform(0.3, 0.7) * seconds
            deadline = time.perf_counter() + seconds
            turns: list[dict] = []
            pending: list[asyncio.Task] = []
            deleted = False

            async def delete() -> None:
                nonlocal in_flight_at_delete
                # Every snapshot sent so far is accepted first: one still in flight could land
                # after the DELETE and then legitimately start the conversation anew.
                await asyncio.gather(*pending)
                in_flight_at_delete += await asyncio.to_thread(lambda: stack.client().xlen("recall:turns"))
                while True:  # like the gateway: retry a dropped connection or a 503 (a repeated forget is harmless)
                    try:
                        resp = await client.delete(f"{stack.url}/conversations/doomed", params={"user": f"storm-{u}"},
                                                   headers={"x-ingest-key": KEY})
                        if resp.status_code == 202:
                            break
                    except httpx.TransportError:
                        pass
                    await asyncio.sleep(0.2)
                receipts[u] = resp.json()["receipt"]
            while time.perf_counter() < deadline:
                marker = f"MARK{u:03d}Z{len(turns):03d}Y{rng.randrange(10**6):06d}"
                turns.append({"role": "user", "text": f"note {marker}", "ts": "2026-10-08T10:00:00Z"})
                body = {"user": f"storm-{u}", "conversation_id": "doomed", "turns": list(turns)}

                async def send(body=body, marker=marker, sent_before=not deleted) -> None:
                    await post_until_accepted(client, stack.url, body, {})
                    if sent_before and not deleted:
                        before[u].append(marker)  # accepted (202 returned) before the DELETE was sent

                pending.append(asyncio.create_task(send()))
                if not deleted and time.perf_counter() >= delete_at:
                    await delete()
                    deleted = True
                    turns = []  # the gateway starts over: whatever comes next is a new conversation
                await asyncio.sleep(rng.uniform(0.5, 1.5))
            if not deleted:  # the machine was too slow to reach the planned moment: delete at the end
                await delete()
                deleted = True
            await asyncio.gather(*pending)

        await asyncio.gather(*[user_loop(u) for u in range(users)])
    return receipts, before, in_flight_at_delete


def storm_phase(work: Path, users: int, seconds: float) -> dict:
    stack = Stack(work / "storm")
    try:
        t0 = time.perf_counter()
        receipts, before, in_flight = asyncio.run(storm_load(stack, users, seconds))
        r = stack.client()
        deadline = time.perf_counter() + 300
        while any(json_status(r, rc) != "done" for rc in receipts.values()):
            if time.perf_counter() > deadline:
                raise RuntimeError("forget receipts did not complete")
            time.sleep(0.5)
        receipts_s = time.perf_counter() - t0
        stack.wait_drained()
        resurrected = 0
        for u, markers in before.items():
            paths = TenantPaths.for_user(stack.data, f"storm-{u}")
            text = paths.transcript("doomed").read_text() if paths.transcript("doomed").exists() else ""
            db = paths.memory / "chunks.sqlite3"
            if db.exists():
                conn = sqlite3.connect(db)
                text += "\n".join(t for (t,) in conn.execute("SELECT text FROM chunks"))
                conn.close()
            resurrected += any(m in text for m in markers)
        blob = b"".join(p.read_bytes() for p in stack.data.rglob("*") if p.is_file())
        doomed_markers = [m for ms in before.values() for m in ms]
        bytes_found = sum(m.encode() in blob for m in doomed_markers)
        return {"users": users, "deletes": len(receipts), "markers_before": len(doomed_markers), "in_flight": in_flight,
                "resurrections": resurrected, "marker_bytes": bytes_found, "receipts_s": receipts_s}
    finally:
        stack.stop()


def json_status(r: redis.Redis, receipt: str) -> str:
    import json

    raw = r.hget(f"recall:deletion:{receipt}", "record")
    return json.loads(raw)["status"] if raw else "missing"


def _current_block(name: str) -> str:
    """The block between a benchmark's markers as docs/benchmarks.md holds it now, markers included."""
    import re

    found = re.search(rf"<!-- {name}:start -->.*?<!-- {name}:end -->", DOC.read_text(), flags=re.S) if DOC.exists() else None
    return found.group(0) if found else ""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=int, default=120)
    ap.add_argument("--rate", type=float, default=4)
    ap.add_argument("--seconds", type=float, default=45)
    ap.add_argument("--storm-users", type=int, default=100)
    ap.add_argument("--storm-seconds", type=float, default=12)
    ap.add_argument("--tenants", type=int, default=300, help="read side: tenants, each with its own memory")
    ap.add_argument("--conversations", type=int, default=4, help="read side: conversations per tenant")
    ap.add_argument("--clients", type=int, default=16, help="read side: concurrent MCP clients")
    ap.add_argument("--read-seconds", type=float, default=60, help="read side: load per configuration")
    ap.add_argument("--sessions", type=int, default=8, help="read side: open sessions each client keeps (LRU)")
    ap.add_argument("--zipf", type=float, default=1.1, help="read side: tenant i is called with weight 1/(i+1)^zipf")
    ap.add_argument("--only", choices=["write", "read"], help="run one side (its part of the doc section is rewritten)")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="recall-chaos-bench-"))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path) -> None:
    command = "python -m bench.chaos_bench " + " ".join(sys.argv[1:])
    read_body = ""
    if args.only != "write":
        read_body, _ = read_phase(work, args.tenants, args.conversations, args.clients, args.read_seconds, args.zipf,
                                  args.sessions)
        print(read_body)
        if args.only == "read":
            if not args.no_doc:
                write_section("chaos-read-bench", command, read_body)
            return
    t0 = time.perf_counter()
    steady = [steady_phase(work, args.users, args.rate, args.seconds, faults) for faults in (False, True)]
    storm = storm_phase(work, args.storm_users, args.storm_seconds)
    total = time.perf_counter() - t0
    fault_table = table(
        ["run", "users", "conversations accepted", "retried answers (503 / connection errors)", "lost", "duplicated",
         "not findable", "ingest→searchable p50 (s)", "p95 (s)", "drain after load (s)"],
        [["baseline (no faults)" if not x["faults"] else "kill -9 indexer + kill -9 Redis", x["users"], x["accepted"],
          f"{x['stats'].get('http 503', 0)} / {x['stats'].get('connection errors', 0)}", x["lost"], x["duplicated"],
          x["not_findable"], f"{x['p50']:.2f}", f"{x['p95']:.2f}", f"{x['drain']:.1f}"] for x in steady])
    storm_table = table(
        ["users", "deletes", "markers accepted before their DELETE", "stream entries waiting at the DELETEs (sum)", "resurrections",
         "marker bytes anywhere (data dir + Redis files)", "all receipts done after (s)"],
        [[storm["users"], storm["deletes"], storm["markers_before"], storm["in_flight"], storm["resurrections"],
          storm["marker_bytes"], f"{storm['receipts_s']:.1f}"]])
    body = (f"Steady load: {args.rate:g} new two-turn conversations/s from {args.users} users for {args.seconds:g} s, "
            f"one ingest, two indexers, embedded Redis (AOF everysec). Faults: {'; '.join(steady[1]['events'])}. "
            "The load generator retries 503s and connection errors like the gateway.\n\n" + fault_table +
            f"\n\nForget storm: {args.storm_users} users, each sending a new snapshot every 0.5-1.5 s for "
            f"{args.storm_seconds:g} s with a DELETE of the conversation in the middle.\n\n" + storm_table +
            f"\n\nWhole run of the write side: {total:.0f} s.")
    print(body)
    if not args.no_doc:
        # The read side keeps its own markers inside this section, so `--only read` rewrites it alone
        # and `--only write` keeps it.
        read_block = (f"<!-- chaos-read-bench:start -->\n{read_body}\n<!-- chaos-read-bench:end -->" if read_body
                      else _current_block("chaos-read-bench"))
        body += f"\n\n{read_block}" if read_block else ""
        write_section("chaos-bench", command, body)


if __name__ == "__main__":
    main()
