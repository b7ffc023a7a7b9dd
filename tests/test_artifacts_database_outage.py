"""The artifacts database (PostgreSQL) going away under a running recall service, and two
people racing on one AgentMemory record: real PostgreSQL clusters started and stopped by the
test, the real service, real tokens, the real HTTP API and a real MCP client."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from fastmcp.exceptions import ToolError

from shared.child_process import free_port
from shared.engine.index_run import index_tree
from shared.tenant_paths import TenantPaths
from tests.conftest import _pg_bin, as_postgres, call_recall, mint, recall_url, write_conversation

REALM = "acme-integrations"


class PgCluster:
    """A PostgreSQL cluster of this test alone, so stopping it disturbs no other test."""

    def __init__(self) -> None:
        self.initdb, self.pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        if not self.initdb or not self.pg_ctl:
            pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
        self.base = Path(tempfile.mkdtemp(prefix="recall-pg-outage-", dir="/tmp"))
        self.as_user = as_postgres(self.base)
        self.data, self.port = self.base / "data", free_port()
        subprocess.run([*self.as_user, self.initdb, "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True)
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-l", str(self.base / "log"), "-w", "start", "-o",
                        f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 -F"], check=True, capture_output=True)

    def stop(self) -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"], capture_output=True)

    def remove(self) -> None:
        subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture
def pg_cluster() -> Iterator[PgCluster]:
    cluster = PgCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.remove()


def record(title: str) -> dict:
    return {"memory_type": "fact", "title": title, "summary": "What the vendor confirmed.",
            "content": "Confirmed on the call.", "reality": "current_state",
            "targets": [{"target_kind": "realm", "target_id": REALM}], "tags": ["vendor"]}


async def search_tool(env, token: str) -> list[str]:
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(token)) as client:
        found = await client.call_tool("search_agent_memory", {"realm_id": REALM, "limit": 100})
    return [r["title"] for r in found.structured_content["records"]]


async def test_database_outage_is_a_clear_503_and_the_service_recovers_when_postgresql_returns(
        services, service_env, pg_cluster):
    """A stopped PostgreSQL was a bare 500 (HTTP) / an unnamed tool error (MCP), and after it
    came back every worker thread kept its dead connection: the realm surface stayed broken
    until the service was restarted."""
    services("serve", RECALL_ARTIFACTS_DB_URL=pg_cluster.url)
    env = service_env
    token = mint("alice", realms={REALM: "member"})
    http = httpx.Client(base_url=f"{recall_url(env)}/realms/{REALM}", timeout=30,
                        headers={"authorization": f"Bearer {token}"})
    # Enough calls that every worker thread of the service holds a connection of its own.
    for i in range(12):
        assert http.post("/memory", json=record(f"before the outage {i}")).status_code == 201
        assert len(await search_tool(env, token)) == i + 1

    pg_cluster.stop()
    for _ in range(8):
        down = http.get("/memory")
        assert down.status_code == 503, down.text
        assert down.json()["error"] == "database", down.text
        assert "retry" in down.json()["detail"]
        with pytest.raises(ToolError, match="database is unavailable"):
            await search_tool(env, token)
    assert httpx.get(f"{recall_url(env)}/healthz", timeout=10).status_code == 200

    pg_cluster.start()
    for i in range(12):  # every worker thread answers again, without a restart of the service
        listed = http.get("/memory", params={"limit": 100})
        assert listed.status_code == 200, listed.text
        assert len(listed.json()["records"]) == 12
        assert len(await search_tool(env, token)) == 12
    assert http.post("/memory", json=record("after the outage")).status_code == 201


async def test_recall_starts_and_answers_conversations_while_the_artifacts_database_is_down(
        services, service_env, pg_cluster, embedder):
    """The service created the artifact tables at start, so with PostgreSQL down (maintenance,
    failover) a restarted replica died before listening: conversation recall, which needs no
    artifacts database, was down with it. Now it starts, says so in one log line, answers
    conversations, and the realm surface works once PostgreSQL is back (tables made then)."""
    paths = TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), "alice")
    write_conversation(paths.src, "vendor-call", ["The vendor confirmed the MT-4471 retry fix ships in 2.1.", "noted"])
    index_tree(paths.root, paths.src, embedder)
    pg_cluster.stop()
    serve = services("serve", RECALL_ARTIFACTS_DB_URL=pg_cluster.url)
    env = service_env
    assert "recall.artifacts_db_unavailable" in serve.output()
    assert "MT-4471" in await call_recall(env, mint("alice"), "MT-4471 retry fix")
    token = mint("alice", realms={REALM: "member"})
    http = httpx.Client(base_url=f"{recall_url(env)}/realms/{REALM}", timeout=30, headers={"authorization": f"Bearer {token}"})
    assert http.get("/memory").status_code == 503
    with pytest.raises(ToolError, match="database is unavailable"):
        await search_tool(env, token)

    pg_cluster.start()
    assert http.post("/memory", json=record("after the database came up")).status_code == 201
    assert await search_tool(env, token) == ["after the database came up"]


def test_two_people_retiring_or_changing_one_record_at_once_never_both_win(pg_cluster, tmp_path, embedder):
    """On PostgreSQL a record was read without a row lock: two retirements racing both passed
    the 'already retired' check (two 'retired' audit events), and a change racing a retirement
    changed a retired record. The first to lock the row wins; the other is refused by the rule."""
    import psycopg

    from services.recall.agent_memory.memory_store import MemoryStore
    from services.recall.agent_memory.models import RecordFields, RecordInput
    from services.recall.agent_memory.service import AgentMemoryService
    from services.recall.artifacts.artifact_search import ArtifactSearch
    from services.recall.artifacts.artifact_store import ArtifactStore
    from services.recall.artifacts.models import Role
    from services.recall.artifacts.rules import RuleBroken
    from services.recall.artifacts.service import ArtifactService, Caller
    from shared.engine.api import Engine

    store = ArtifactStore(pg_cluster.url)
    artifacts = ArtifactService(store, ArtifactSearch(tmp_path, Engine(embedder=embedder)), tmp_path)
    memory = AgentMemoryService(MemoryStore(store), artifacts, tmp_path)
    alice, bob = Caller("alice", {REALM: Role.MEMBER}), Caller("bob", {REALM: Role.OWNER})

    def race(first, second) -> tuple[str, list[object]]:
        """Both operations read the record, then wait on its row lock (held by a third
        connection) and go on together once it is released."""
        rid = memory.create(alice, REALM, RecordInput.model_validate(record("raced")))["record_id"]
        outcomes: list[object] = []
        with psycopg.connect(pg_cluster.url) as blocker:
            blocker.execute("SELECT 1 FROM agent_memory_records WHERE record_id = %s FOR UPDATE", (rid,))
            threads = [threading.Thread(target=lambda op=op: outcomes.append(_outcome(op, rid))) for op in (first, second)]
            for t in threads:
                t.start()
            with psycopg.connect(pg_cluster.url, autocommit=True) as watch:
                assert _wait_for_lock_waiters(watch, 2), "both operations should wait on the record's row lock"
            blocker.rollback()
        for t in threads:
            t.join(30)
        return rid, outcomes

    rid, outcomes = race(lambda rid: memory.retire(alice, REALM, rid, "first"),
                         lambda rid: memory.retire(bob, REALM, rid, "second"))
    assert sorted(type(o).__name__ for o in outcomes) == ["RuleBroken", "dict"], outcomes
    assert [e["event"] for e in memory.audit(alice, REALM, rid)] == ["created", "retired"]

    rid, outcomes = race(lambda rid: memory.retire(bob, REALM, rid, "gone"),
                         lambda rid: memory.update(alice, REALM, rid, RecordFields(title="changed meanwhile")))
    events = [e["event"] for e in memory.audit(alice, REALM, rid)]
    assert events in (["created", "retired"], ["created", "updated", "retired"]), events
    assert any(isinstance(o, RuleBroken) for o in outcomes) == (events == ["created", "retired"]), outcomes


def test_postgresql_stopping_in_the_middle_of_a_change_is_a_clean_unavailable(pg_cluster, tmp_path, embedder):
    """A change waiting inside its transaction when PostgreSQL shuts down (its backend is
    terminated) ends as StoreUnavailable (503 / 'database is unavailable'), not a driver error."""
    import psycopg

    from services.recall.agent_memory.memory_store import MemoryStore
    from services.recall.agent_memory.models import RecordInput
    from services.recall.agent_memory.service import AgentMemoryService
    from services.recall.artifacts.artifact_search import ArtifactSearch
    from services.recall.artifacts.artifact_store import ArtifactStore, StoreUnavailable
    from services.recall.artifacts.models import Role
    from services.recall.artifacts.service import ArtifactService, Caller
    from shared.engine.api import Engine

    store = ArtifactStore(pg_cluster.url)
    memory = AgentMemoryService(MemoryStore(store), ArtifactService(store, ArtifactSearch(tmp_path, Engine(embedder=embedder)),
                                                                    tmp_path), tmp_path)
    alice = Caller("alice", {REALM: Role.MEMBER})
    rid = memory.create(alice, REALM, RecordInput.model_validate(record("retired as PostgreSQL stops")))["record_id"]
    outcomes: list[object] = []
    blocker = psycopg.connect(pg_cluster.url)
    blocker.execute("SELECT 1 FROM agent_memory_records WHERE record_id = %s FOR UPDATE", (rid,))
    waiting = threading.Thread(target=lambda: outcomes.append(_outcome(lambda r: memory.retire(alice, REALM, r, "x"), rid)))
    waiting.start()
    with psycopg.connect(pg_cluster.url, autocommit=True) as watch:
        assert _wait_for_lock_waiters(watch, 1)
    pg_cluster.stop()
    waiting.join(30)
    blocker.close()
    assert isinstance(outcomes[0], StoreUnavailable), outcomes
    pg_cluster.start()
    assert memory.retire(alice, REALM, rid, "again")["status"] == "retired"


def test_a_partitioned_postgresql_connection_is_given_up_in_seconds_not_tcp_minutes(pg_cluster):
    """A partition leaves no one to close the connection; only the kernel's timers end it.
    Checked on the live socket (the timers cannot be shown without cutting a network here)."""
    import socket

    from services.recall.artifacts.artifact_store import TCP_USER_TIMEOUT_MS, ArtifactStore

    store = ArtifactStore(pg_cluster.url)
    conn = store._connection()
    sock = socket.socket(fileno=os.dup(conn.pgconn.socket))
    try:
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == TCP_USER_TIMEOUT_MS
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
    finally:
        sock.close()
        conn.close()


def _outcome(op, rid: str) -> object:
    try:
        return op(rid)
    except Exception as exc:  # the refusal is the result under test
        return exc


def _wait_for_lock_waiters(conn, count: int, timeout: float = 20.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'").fetchone()[0]
        if waiting >= count:
            return True
        time.sleep(0.02)
    return False
