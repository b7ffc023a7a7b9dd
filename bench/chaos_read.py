"""The read side of the load and fault suite (issue 11): many tenants, skewed traffic, many MCP
clients, a reader cache smaller than the tenant count, and forget drops racing searches.

    .venv/bin/python -m bench.chaos_bench --only read [--tenants 300] [--clients 16] [--read-seconds 60]

Every tenant gets its own small memory (a few filler conversations plus one conversation holding
a fact only that tenant has: a locker code), indexed by the real engine with the default
embedder before anything is measured. A real `recall serve` (embedded engine) answers; the
load is `clients` concurrent agents, each looping for `read_seconds`: pick a tenant (Zipf-like:
a few hot, many cold), open an MCP session over streamable HTTP with that tenant's real JWT,
ask for the fact, close. Since every tenant has a memory holding the fact:

- "unavailable" or "no memory" is FALSE (counted, must be 0);
- an MCP error (tool error), an HTTP error status or any other exception is an error (must be 0);
- "busy, try again" is the admission queue's soft answer (counted, allowed);
- an answer holding another tenant's locker code is a leak (must be 0).

Configurations (same tenants, a fresh server each): the default reader cache (256 readers, so
300 tenants already evict cold ones); RECALL_READER_CACHE=8 (nearly every call evicts a reader
another search may hold) with forget announcements on Redis dropping hot tenants' readers
while their searches run; and RECALL_READER_CACHE_BYTES=1 MiB (about 100 of these small
memories) while index runs add and forget conversations of (mostly hot) tenants, each forget announced, so
readers catch up, map new snapshots and get dropped under the searches. The recall
process's RSS, fds and threads are sampled after a warm-up pass over every tenant (before),
during the load (peak) and 2 s after it (after).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.report import ms, pct, table
from bench.stack_processes import hs256_token
from shared.child_process import free_port, stop, wait_healthy
from shared.recall_answer_format import BUSY, NO_MEMORY, NOTHING, UNAVAILABLE
from shared.tenant_paths import TenantPaths, user_hash

SECRET = "chaos-bench-secret-0123456789abcdef0123"
CODE = re.compile(r"LK-\d{6}")
FILLER = [
    ["Morning. The North plant board shows conveyor C-12 running fine.", "Good. I will keep an eye on C-12 today."],
    ["Can you remind me to order gloves for the cleanroom?", "Noted: gloves for the cleanroom, size M and L."],
    ["The QC check on batch B-7 found a 1.2% defect rate.", "Logged the 1.2% defect rate for batch B-7."],
    ["Who covers the night shift on Friday?", "Dmitri covers the Friday night shift this week."],
    ["Please draft a note about the fire drill next Tuesday.", "Draft: fire drill next Tuesday at 10:00, assembly point B."],
]


@dataclass(frozen=True)
class Tenant:
    user: str
    pump: str  # the identifier the agent asks about
    code: str  # the fact: only this tenant's memory holds it

    @property
    def query(self) -> str:
        return f"spare impeller for pump {self.pump} locker"


def build_tenants(data: Path, n: int, conversations: int, seed: int = 11) -> tuple[list[Tenant], float]:
    """Index one small memory per tenant with the real engine (one index run each)."""
    from bench.corpus import Conversation, conversation_lines
    from datetime import datetime, timedelta, timezone
    from shared.engine.embedder import shared_embedder
    from shared.engine.index_run import index_tree

    embedder = shared_embedder()
    rng = random.Random(seed)
    codes = rng.sample(range(100000, 999999), n)
    t0 = time.perf_counter()
    tenants = []
    for i in range(n):
        t = Tenant(f"chaos-reader-{i:03d}", f"PX-{i:04d}", f"LK-{codes[i]}")
        paths = TenantPaths.for_user(data, t.user)
        paths.src.mkdir(parents=True, exist_ok=True)
        started = datetime(2026, 10, 1, tzinfo=timezone.utc) + timedelta(days=i % 30)
        convs = [Conversation(f"fact-{i}", started, [
            f"Where did we put the spare impeller for pump {t.pump}?",
            f"The spare impeller for pump {t.pump} is in locker {t.code}, second shelf.",
        ])]
        for j in range(conversations - 1):
            convs.append(Conversation(f"filler-{j}", started - timedelta(days=j + 1), FILLER[(i + j) % len(FILLER)]))
        for c in convs:
            (paths.src / f"{c.conversation_id}.funes.jsonl").write_text(conversation_lines(c))
        index_tree(paths.root, paths.src, embedder)
        tenants.append(t)
    return tenants, time.perf_counter() - t0


def zipf_weights(n: int, s: float) -> list[float]:
    """Tenant i (0-based) is called with weight 1/(i+1)^s: a few hot tenants, a long cold tail."""
    return [1.0 / (i + 1) ** s for i in range(n)]


@dataclass
class Outcomes:
    latencies: list[float] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=lambda: {k: 0 for k in (
        "found", "busy", "unavailable", "no_memory", "nothing", "missed", "leak", "mcp_error", "http_error",
        "exception")})
    per_tenant: dict[str, int] = field(default_factory=dict)
    found_tenants: set[str] = field(default_factory=set)
    samples: list[str] = field(default_factory=list)  # the first few errors, for the log

    def note(self, kind: str, detail: str = "") -> None:
        self.counts[kind] += 1
        if detail and len(self.samples) < 10:
            self.samples.append(f"{kind}: {detail[:300]}")

    @property
    def calls(self) -> int:
        return len(self.latencies)

    @property
    def errors(self) -> int:
        return self.counts["mcp_error"] + self.counts["http_error"] + self.counts["exception"]


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status behind an exception, however the MCP client wrapped it."""
    stack = [exc]
    while stack:
        e = stack.pop()
        if isinstance(e, httpx.HTTPStatusError):
            return e.response.status_code
        stack += list(getattr(e, "exceptions", ())) + [x for x in (e.__cause__, e.__context__) if x is not None]
    return None


def classify(text: str, tenant: Tenant, out: Outcomes) -> str:
    codes = set(CODE.findall(text))
    if codes - {tenant.code}:
        out.note("leak", f"{tenant.user} saw {sorted(codes - {tenant.code})}")
    if tenant.code in codes:
        kind = "found"
        out.found_tenants.add(tenant.user)
    elif text.startswith(BUSY[:30]):
        kind = "busy"
    elif text == UNAVAILABLE:
        kind = "unavailable"
    elif text == NO_MEMORY:
        kind = "no_memory"
    elif text == NOTHING:
        kind = "nothing"
    else:
        kind = "missed"
    out.note(kind, "" if kind in ("found", "busy") else f"{tenant.user}: {text[:200]}")
    return kind


def _note_failure(exc: BaseException, out: Outcomes) -> None:
    from fastmcp.exceptions import ToolError
    from mcp.shared.exceptions import MCPError

    status = _http_status(exc)
    if status:
        out.note("http_error", f"{status} {type(exc).__name__}: {exc}")
    elif isinstance(exc, (ToolError, MCPError)):
        out.note("mcp_error", f"{type(exc).__name__}: {exc}")
    else:
        out.note("exception", f"{type(exc).__name__}: {exc!r}")


class Agent:
    """One MCP client process's worth of sessions: an agent keeps a session per user it serves
    (the most recent `keep` open, like a gateway's connection pool), each with that user's token."""

    def __init__(self, url: str, tokens: dict[str, str], keep: int) -> None:
        self.url, self.tokens, self.keep = url, tokens, keep
        self.sessions: OrderedDict[str, object] = OrderedDict()
        self.opened = 0

    async def _session(self, user: str):
        from fastmcp import Client
        from fastmcp.client.auth import BearerAuth

        client = self.sessions.get(user)
        if client is None:
            client = Client(self.url, auth=BearerAuth(self.tokens[user]), timeout=120)
            await client.__aenter__()
            self.opened += 1
            self.sessions[user] = client
            while len(self.sessions) > self.keep:
                await self._close(next(iter(self.sessions)))
        self.sessions.move_to_end(user)
        return client

    async def _close(self, user: str) -> None:
        client = self.sessions.pop(user)
        try:
            await client.__aexit__(None, None, None)
        except Exception:  # noqa: BLE001 - a session that already failed has nothing left to close
            pass

    async def call(self, tenant: Tenant, out: Outcomes) -> str:
        """Ask for the tenant's fact; latency is the tool call alone (the session may be reused).
        Returns how the call was answered."""
        kind, t0 = "exception", time.perf_counter()
        try:
            client = await self._session(tenant.user)
            t0 = time.perf_counter()
            res = await client.call_tool("recall_my_conversations", {"query": tenant.query})
            out.latencies.append(time.perf_counter() - t0)
            kind = classify(res.content[0].text, tenant, out)
        except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the load
            out.latencies.append(time.perf_counter() - t0)
            _note_failure(exc, out)
            if tenant.user in self.sessions:
                await self._close(tenant.user)
        out.per_tenant[tenant.user] = out.per_tenant.get(tenant.user, 0) + 1
        return kind

    async def close(self) -> None:
        for user in list(self.sessions):
            await self._close(user)


async def load(url: str, tenants: list[Tenant], tokens: dict[str, str], clients: int, seconds: float,
               weights: list[float] | None, seed: int, keep: int = 8) -> tuple[Outcomes, int]:
    """`clients` agents calling back to back for `seconds` (weights None: every tenant once, the
    warm-up). Returns the outcomes and how many sessions were opened."""
    out = Outcomes()
    agents = [Agent(url, tokens, keep if weights is not None else 1) for _ in range(clients)]
    queue = list(tenants)
    stop_at = time.monotonic() + seconds

    async def run(i: int) -> None:
        agent, rng = agents[i], random.Random(seed * 1000 + i)
        try:
            while queue if weights is None else time.monotonic() < stop_at:
                t = queue.pop() if weights is None else rng.choices(tenants, weights)[0]
                if await agent.call(t, out) == "busy" and weights is None:
                    queue.insert(0, t)  # the warm-up must see every tenant's fact: "try again" later
        finally:
            await agent.close()

    await asyncio.gather(*[run(i) for i in range(clients)])
    return out, sum(a.opened for a in agents)


async def announce_forgets(redis_url: str, tenants: list[Tenant], weights: list[float], per_second: float,
                           seconds: float) -> int:
    """What an indexer publishes after a deletion: recall drops that tenant's reader (here the
    memory stays, so its next search must reopen it and still find the fact)."""
    import redis.asyncio as aioredis

    from shared.stream_schema import FORGET_CHANNEL

    rng = random.Random(5)
    client = aioredis.Redis.from_url(redis_url)
    sent = 0
    stop_at = time.monotonic() + seconds
    try:
        while time.monotonic() < stop_at:
            [t] = rng.choices(tenants, weights)  # mostly hot tenants: their readers are the ones in use
            await client.publish(FORGET_CHANNEL, json.dumps({"user_hash": user_hash(t.user)}))
            sent += 1
            await asyncio.sleep(1.0 / per_second)
    finally:
        await client.aclose()
    return sent


def write_churn(data: Path, tenants: list[Tenant], weights: list[float], redis_url: str, per_second: float,
                seconds: float, counts: dict[str, int]) -> None:
    """What indexers do meanwhile, through the same engine calls: a new conversation indexed, or
    one forgotten (file removed, purging index run, then the announcement recall drops readers
    on). The fact conversations are never touched, so every answer must still hold the fact."""
    from datetime import datetime, timezone

    import redis

    from bench.corpus import Conversation, conversation_lines
    from shared.engine.embedder import shared_embedder
    from shared.engine.index_run import index_tree
    from shared.stream_schema import FORGET_CHANNEL

    rng, embedder = random.Random(9), shared_embedder()
    client = redis.Redis.from_url(redis_url)
    stop_at, n = time.monotonic() + seconds, 0
    try:
        while time.monotonic() < stop_at:
            t = rng.choices(tenants, weights)[0]
            paths = TenantPaths.for_user(data, t.user)
            extra = sorted(paths.src.glob("extra-*.funes.jsonl"))
            if extra and rng.random() < 0.5:
                rng.choice(extra).unlink()
                index_tree(paths.root, paths.src, embedder, lock_wait_s=10, purge=True)
                client.publish(FORGET_CHANNEL, json.dumps({"user_hash": user_hash(t.user)}))
                counts["forgets"] += 1
            else:
                conv = Conversation(f"extra-{n}", datetime(2026, 11, 1, tzinfo=timezone.utc), [
                    f"Shift note {n}: conveyor C-{n % 50} restarted after the belt check.",
                    f"Noted: C-{n % 50} is back up, next check on Monday."])
                (paths.src / f"extra-{n}.funes.jsonl").write_text(conversation_lines(conv))
                index_tree(paths.root, paths.src, embedder, lock_wait_s=10)
                counts["index runs"] += 1
            n += 1
            time.sleep(1.0 / per_second)
    finally:
        client.close()


def metric(text: str, name: str, labels: str = "") -> float:
    """One sample of a Prometheus text exposition (`labels` exactly as exposed, e.g. '{reason="lru"}')."""
    for line in text.splitlines():
        if line.split(" ")[0] == name + labels:
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


@dataclass(frozen=True)
class ProcessSample:
    rss_mb: float
    fds: int
    threads: int

    @classmethod
    def of(cls, p: psutil.Process) -> "ProcessSample":
        return cls(p.memory_info().rss / 2**20, p.num_fds(), p.num_threads())


@dataclass(frozen=True)
class ReadConfig:
    name: str
    env: dict[str, str]
    forgets_per_s: float = 0.0  # forget announcements on Redis while the load runs
    writes_per_s: float = 0.0  # index runs (a new conversation, or a forgotten one) on mostly hot tenants


def run_config(cfg: ReadConfig, data: Path, work: Path, tenants: list[Tenant], clients: int, seconds: float,
               zipf_s: float, keep: int) -> dict:
    from shared.redis_server import EmbeddedRedis

    port = free_port()
    redis_server = EmbeddedRedis(work / f"redis-{port}") if cfg.forgets_per_s or cfg.writes_per_s else None
    if redis_server:
        redis_server.start()
    env = {**os.environ, "RECALL_USER_HASH_KEY": "",  # unkeyed: this process writes the tenants' paths
           "RECALL_DATA_DIR": str(data), "RECALL_JWT_SECRET": SECRET, "RECALL_RECALL_PORT": str(port),
           "RECALL_ENGINE": "embedded", "RECALL_LOG_LEVEL": "INFO", **cfg.env}  # INFO: one line per recall with its ms
    if redis_server:
        env["RECALL_REDIS_URL"] = redis_server.url
    log_path = work / f"serve-{port}.log"
    proc = subprocess.Popen([str(Path(sys.executable).parent / "recall"), "serve"], env=env,
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    tokens = {t.user: hs256_token(t.user, SECRET) for t in tenants}
    weights = zipf_weights(len(tenants), zipf_s)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/healthz", 120)
        server = psutil.Process(proc.pid)
        load0 = os.getloadavg()[0]
        warm, _ = asyncio.run(load(url, tenants, tokens, clients, 0, None, 0))  # every tenant answers once
        time.sleep(1.0)
        before = ProcessSample.of(server)
        metrics0 = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        peak, sampling = [before], True

        def sample() -> None:
            while sampling:
                peak.append(ProcessSample.of(server))
                time.sleep(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        cpu0 = sum(server.cpu_times()[:2])

        async def measured() -> tuple[tuple[Outcomes, int], int]:
            jobs = [load(url, tenants, tokens, clients, seconds, weights, 1, keep)]
            if cfg.forgets_per_s:
                jobs.append(announce_forgets(redis_server.url, tenants, weights, cfg.forgets_per_s, seconds))
            if cfg.writes_per_s:
                jobs.append(asyncio.to_thread(write_churn, data, tenants, weights, redis_server.url, cfg.writes_per_s,
                                              seconds, writes))
            done = await asyncio.gather(*jobs)
            return done[0], (done[1] if cfg.forgets_per_s else 0)

        writes = {"index runs": 0, "forgets": 0}
        t0 = time.perf_counter()
        (out, sessions), forgets = asyncio.run(measured())
        wall = time.perf_counter() - t0
        time.sleep(2.0)
        sampling = False
        sampler.join()
        cpu = sum(server.cpu_times()[:2]) - cpu0
        after = ProcessSample.of(server)
        metrics1 = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        load1 = os.getloadavg()[0]
        alive = proc.poll() is None
    finally:
        stop(proc)
        if redis_server:
            redis_server.stop()
    evictions = metric(metrics1, "recall_pool_evictions_total", '{reason="lru"}') - \
        metric(metrics0, "recall_pool_evictions_total", '{reason="lru"}')
    log_lines = log_path.read_text(errors="replace").splitlines()
    server_errors = [ln for ln in log_lines if '"level": "error"' in ln or "Traceback" in ln or '"recall.unavailable"' in ln]
    server_ms = server_latencies(log_lines)
    hot = sorted(out.per_tenant.values(), reverse=True)
    return {"name": cfg.name, "warm": warm, "out": out, "before": before, "after": after,
            "peak": max(peak, key=lambda s: s.rss_mb), "peak_fds": max(s.fds for s in peak),
            "peak_threads": max(s.threads for s in peak), "evictions": evictions, "forgets": forgets + writes["forgets"],
            "index_runs": writes["index runs"], "cpu": cpu,
            "wall": wall, "load": (load0, load1), "sessions": sessions, "server_ms": server_ms[len(warm.latencies):], "alive": alive, "server_errors": server_errors[:5],
            "tenants_called": len(out.per_tenant), "top10_share": sum(hot[:10]) / max(1, sum(hot))}


def server_latencies(log_lines: list[str]) -> list[float]:
    """Each recall's own duration (admission wait included) in seconds, in order, from the service's log."""
    out = []
    for line in log_lines:
        if '"event": "recall"' in line:
            out.append(json.loads(line)["ms"] / 1000)
    return out


def configs() -> list[ReadConfig]:
    return [
        ReadConfig("default cache (256 readers, 4 GiB)", {}),
        ReadConfig("8 readers + forget drops 5/s", {"RECALL_READER_CACHE": "8"}, forgets_per_s=5.0),
        ReadConfig("1 MiB cache + index runs and forgets 2/s", {"RECALL_READER_CACHE_BYTES": str(2**20)},
                   writes_per_s=2.0),
    ]


def read_phase(work: Path, n_tenants: int, conversations: int, clients: int, seconds: float, zipf_s: float,
               keep: int = 8) -> tuple[str, list[dict]]:
    data = work / "read-data"
    tenants, build_s = build_tenants(data, n_tenants, conversations)
    results = []
    for cfg in configs():
        r = run_config(cfg, data, work, tenants, clients, seconds, zipf_s, keep)
        results.append(r)
        o = r["out"]
        print(f"[{cfg.name}] calls {o.calls} {o.counts} warm {r['warm'].counts} samples {o.samples + r['warm'].samples}"
              f" server errors {r['server_errors']}", flush=True)
    answers, resources = [], []
    for r in results:
        o, w = r["out"], r["warm"]
        false = sum(x.counts[k] for x in (o, w) for k in ("unavailable", "no_memory"))
        answers.append([r["name"], o.calls, o.errors + w.errors, false, o.counts["busy"], o.counts["found"],
                        o.counts["nothing"] + o.counts["missed"], o.counts["leak"] + w.counts["leak"], r["sessions"],
                        r["tenants_called"], f"{r['top10_share']:.0%}", f"{len(w.found_tenants)} of {len(tenants)} / {w.calls} / {w.counts['busy']}"])
        resources.append([
            r["name"], ms(pct(o.latencies, 0.5)), ms(pct(o.latencies, 0.95)), ms(pct(o.latencies, 0.99)),
            ms(max(o.latencies)), ms(pct(r["server_ms"], 0.5)), ms(pct(r["server_ms"], 0.99)),
            f"{o.calls / r['wall']:.1f}", f"{r['cpu']:.0f}", f"{int(r['evictions'])}", r["index_runs"], r["forgets"],
            f"{r['before'].rss_mb:.0f} → {r['after'].rss_mb:.0f} (peak {r['peak'].rss_mb:.0f})",
            f"{r['before'].fds} → {r['after'].fds} (peak {r['peak_fds']})",
            f"{r['before'].threads} → {r['after'].threads} (peak {r['peak_threads']})",
            f"{r['load'][0]:.1f} / {r['load'][1]:.1f}"])
    body = (
        f"Read side: {n_tenants} tenants, each with its own memory ({conversations} conversations, one holding a fact only "
        f"it has; indexed by the real engine and default embedder in {build_s:.0f} s before the load), "
        f"a real `recall serve` (embedded engine, default admission: 4 searches at once, queue 32, wait 1 s, "
        f"timeout 10 s), {clients} concurrent MCP clients over streamable HTTP for {seconds:g} s, each asking for "
        f"the fact of a tenant drawn Zipf-like (weight 1/rank^{zipf_s:g}: a few hot tenants, a long cold tail) "
        f"with that tenant's real JWT; a client keeps its {keep} most recent sessions open and opens a new one for "
        "any other tenant. Before the load every tenant is called on a new session until it answers other than "
        "\"busy\" (warm-up; its errors, false answers and leaks count in the table too). False \"unavailable\" = \"unavailable\" or \"no "
        "memory\" answers (every tenant has a memory holding its fact); errors = MCP errors + HTTP errors + "
        "client exceptions; leak = an answer holding another tenant's fact.\n\n"
        + table(["configuration", "calls", "errors", "false unavailable", "busy (soft)", "found the fact",
                 "fact missed", "leaks", "sessions opened", "tenants called", "10 hottest tenants' share",
                 "warm-up: tenants whose fact was found / calls / busy"], answers)
        + "\n\nLatency is the tool call as the client sees it (session open excluded; the clients share the 2 "
        "cores with the server, so it includes their own queueing); server p50/p99 are the service's own "
        "duration per recall (admission wait included, from its log). RSS/fds/threads of the recall process: "
        "after the warm-up → 2 s after the load (peak during it). Load avg = the 1-minute load average at the "
        "start / end (2 cores, shared with other jobs).\n\n"
        + table(["configuration", "p50 (ms)", "p95 (ms)", "p99 (ms)", "max (ms)", "server p50 (ms)",
                 "server p99 (ms)", "calls/s", "server CPU (s)", "reader evictions", "index runs", "forget drops", "RSS MB", "fds",
                 "threads", "load avg"], resources))
    return body, results
