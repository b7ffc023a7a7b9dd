"""The artifacts database stops answering without closing anything (a network partition, a
frozen host, a failover still moving its address): a real PostgreSQL behind a TCP relay the
test freezes. The realm tools' database calls used the same worker threads as every tenant's
conversation search and waited on the silent socket for minutes (no timeout), so a handful
of them made recall_my_conversations answer "busy" for everyone (tested with more waiting calls
than the default executor has threads on any machine). Now the realm surface waits
in threads of its own, and its calls complete once the database answers again."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth

from shared.engine.index_run import index_tree
from shared.recall_answer_format import BUSY
from shared.tenant_paths import TenantPaths
from tests.conftest import call_recall, mint, recall_url, write_conversation

REALM = "acme-integrations"


class FreezableRelay:
    """A TCP relay to PostgreSQL; frozen, it keeps every connection open and forwards nothing."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.frozen = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                while self.frozen.is_set():
                    time.sleep(0.05)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.frozen.clear()
        self.listener.close()
        for s in self.sockets:
            s.close()


@pytest.fixture
def frozen_db_url(postgres_url):
    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    relay = FreezableRelay(int(postgres_url.rsplit(":", 1)[1].split("/")[0]))
    yield relay, f"postgresql://postgres@127.0.0.1:{relay.port}/{name}"
    relay.close()


async def test_a_silent_artifacts_database_never_starves_conversation_recall(services, service_env, frozen_db_url, embedder):
    relay, db_url = frozen_db_url
    paths = TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), "alice")
    write_conversation(paths.src, "vendor-call", ["The vendor confirmed the MT-4471 retry fix ships in 2.1.", "noted"])
    index_tree(paths.root, paths.src, embedder)
    services("serve", RECALL_ARTIFACTS_DB_URL=db_url, RECALL_TIMEOUT_S="5")
    env = service_env
    reader = mint("agent", realms={REALM: "reader"})

    async def search_realm():
        async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(reader), timeout=120) as client:
            return await client.call_tool("search_agent_memory", {"realm_id": REALM})

    assert "MT-4471" in await call_recall(env, mint("alice"), "MT-4471 retry fix")
    for _ in range(3):  # every realm thread holds its connection
        await asyncio.gather(*[search_realm() for _ in range(16)])

    relay.frozen.set()
    # More waiting calls than the default executor has threads on any machine (at most 32).
    stuck = [asyncio.create_task(search_realm()) for _ in range(40)]
    await asyncio.sleep(1.5)  # they all wait on the silent database now
    answer = await call_recall(env, mint("alice"), "MT-4471 retry fix")
    assert answer != BUSY and "MT-4471" in answer, answer

    assert not any(task.done() for task in stuck), "the realm calls were still waiting on the database"
    relay.frozen.clear()
    outcomes = await asyncio.wait_for(asyncio.gather(*stuck), 60)
    assert all(o.structured_content == {"records": [], "next_offset": None} for o in outcomes), outcomes
