"""A failure nothing in the services expected, injected for real into running services (a damaged
record in Redis, a table gone from the artifacts database): the caller gets a JSON error that
shows nothing of the internals; the failure is counted in the series the alerts watch
(RecallIngestUnexpectedErrors, RecallServiceUnexpectedErrors), and logged once, with the user
hash, the exception's type and where it was raised, never its message or the stored text."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import re
import sqlite3
import threading
import time
from pathlib import Path

import httpx
from fastmcp import Client
from fastmcp.client.auth import BearerAuth

from shared.stream_schema import deletion_key
from shared.tenant_paths import user_hash
from tests.conftest import INGEST_KEY, ingest_url, mint, recall_url, wait_until

# Planted in what the failure reads: in no answer and no log line afterwards.
PLANTED = "PLANTED-TEXT-MT4471-do-not-log"


def sample(url: str, series: str) -> float | None:
    """One sample of the service's /metrics (None: no such series)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    return float(found[1]) if found else None


def log_events(output: str, event: str) -> list[dict]:
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def test_an_unexpected_ingest_failure_is_a_json_500_counted_and_logged_without_its_text(services, service_env, r):
    proc = services("ingest")
    url, headers = ingest_url(service_env), {"x-ingest-key": INGEST_KEY}
    series = 'recall_ingest_requests_total{route="/deletions/{receipt}",status="500"}'
    assert sample(url, series) == 0, "at 0 from the start, so increase() sees the first one"
    assert sample(url, 'recall_ingest_requests_total{route="/turns",status="503"}') == 0, "so does RecallIngestErrors"
    receipt = httpx.delete(f"{url}/users/alice", headers=headers, timeout=10).json()["receipt"]
    # The receipt's record damaged in Redis (a hand edit, an incompatible older writer).
    r.hset(deletion_key(receipt), "record", json.dumps({"receipt": receipt, "status": PLANTED}))

    resp = httpx.get(f"{url}/deletions/{receipt}", headers=headers, timeout=10)
    assert resp.status_code == 500 and resp.headers["content-type"] == "application/json", resp.text
    body = resp.json()
    assert body["error"] == "internal error" and [f["field"] for f in body["fields"]] == ["server"]
    incident = re.search(r"incident ([0-9a-f]{12})$", body["fields"][0]["message"])[1]
    assert PLANTED not in resp.text and "ValidationError" not in resp.text
    assert sample(url, series) == 1
    assert sample(url, 'recall_ingest_requests_total{route="/deletions/{receipt}",status="200"}') is None

    assert wait_until(lambda: log_events(proc.output(), "ingest.unexpected_error"), 10), proc.output()[-3000:]
    [event] = log_events(proc.output(), "ingest.unexpected_error")
    assert event["level"] == "error" and event["incident"] == incident
    assert (event["route"], event["method"]) == ("/deletions/{receipt}", "GET")
    assert event["error"].endswith("ValidationError")
    assert any(re.fullmatch(r"services/ingest/app\.py:\d+ get_deletion", frame) for frame in event["at"]), event["at"]
    assert PLANTED not in proc.output() and "Exception in ASGI application" not in proc.output()
    # The service goes on: a forget of a user names that user's hash if it fails, and works here.
    again = httpx.delete(f"{url}/users/bob", headers=headers, timeout=10)
    assert again.status_code == 202 and sample(url, series) == 1


async def test_an_unexpected_recall_failure_is_counted_and_logged_on_both_surfaces(services, service_env):
    """AgentMemory over HTTP and over MCP, after a table of the artifacts database (SQLite)
    disappeared under the running service (a botched migration or restore)."""
    proc = services("serve")
    url = recall_url(service_env)
    realm = "acme"
    token = mint("alice", realms={realm: "member"})
    auth = {"Authorization": f"Bearer {token}"}
    assert sample(url, 'recall_unexpected_errors_total{surface="http"}') == 0
    assert sample(url, 'recall_unexpected_errors_total{surface="mcp"}') == 0
    made = httpx.post(f"{url}/realms/{realm}/memory", headers=auth, timeout=30, json={
        "memory_type": "fact", "title": "Proxy port", "summary": "The billing proxy listens on 8443.",
        "content": PLANTED, "reality": "current_state", "targets": [{"target_kind": "realm", "target_id": realm}]})
    assert made.status_code == 201, made.text
    record_id = made.json()["record_id"]
    with sqlite3.connect(Path(service_env["RECALL_DATA_DIR"]) / "artifacts.sqlite3") as db:
        db.execute("DROP TABLE agent_memory_tags")

    resp = httpx.get(f"{url}/realms/{realm}/memory/{record_id}", headers=auth, timeout=30)
    assert resp.status_code == 500 and resp.json()["error"] == "internal", resp.text
    assert PLANTED not in resp.text and "sqlite" not in resp.text.lower()
    async with Client(f"{url}/mcp", auth=BearerAuth(token)) as client:
        failed = await client.call_tool("get_agent_memory", {"realm_id": realm, "record_id": record_id}, raise_on_error=False)
        assert failed.is_error and re.fullmatch(r"internal error, logged as incident [0-9a-f]{12}", failed.content[0].text)
        # A refusal the tool meant is neither counted nor logged as unexpected.
        refused = await client.call_tool("get_agent_memory", {"realm_id": "other", "record_id": record_id},
                                         raise_on_error=False)
        assert refused.is_error and "internal error" not in refused.content[0].text
        unknown = await client.call_tool("forget_everything", {}, raise_on_error=False)  # fastmcp's own answer
        assert unknown.is_error and "Unknown tool" in unknown.content[0].text
    assert sample(url, 'recall_unexpected_errors_total{surface="http"}') == 1
    assert sample(url, 'recall_unexpected_errors_total{surface="mcp"}') == 1

    assert wait_until(lambda: len(log_events(proc.output(), "recall.unexpected_error")) == 2, 10), proc.output()[-3000:]
    http, tool = sorted(log_events(proc.output(), "recall.unexpected_error"), key=lambda e: e["surface"])
    assert (http["surface"], http["method"], http["route"]) == ("http", "GET", "/realms/{realm_id}/memory/{record_id}")
    assert (tool["surface"], tool["tool"]) == ("mcp", "get_agent_memory")
    for event in (http, tool):
        assert event["level"] == "error" and event["user_hash"] == user_hash("alice")
        assert event["error"] == "sqlite3.OperationalError" and event["at"], event
    assert http["incident"] in resp.text and tool["incident"] in failed.content[0].text
    out = proc.output()
    assert PLANTED not in out and "no such table" not in out, "no exception message, no stored text"
    assert "Exception in ASGI application" not in out
    # fastmcp's line for the failed call carried the traceback with the message; ours replaces it.
    assert not [line for line in out.splitlines() if '"exception"' in line]


class _DeepJWKS(http.server.BaseHTTPRequestHandler):
    """An identity provider whose JWKS is JSON nested 100,000 deep: fastmcp's verifier catches
    what it expects of a bad key set, not the RecursionError of parsing this one."""

    def do_GET(self) -> None:
        body = b"[" * 100_000 + b"]" * 100_000
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def _rs256_token_naming_a_key() -> str:
    """A token whose header names a key, so the verifier fetches the key set (its signature is never reached)."""
    part = lambda obj: base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()  # noqa: E731
    return f"{part({'alg': 'RS256', 'kid': 'k1', 'typ': 'JWT'})}.{part({'sub': 'alice'})}.c2ln"


def test_an_exception_while_a_bearer_token_is_verified_is_a_counted_json_500(services, service_env):
    jwks = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DeepJWKS)
    threading.Thread(target=jwks.serve_forever, daemon=True).start()
    try:
        proc = services("serve", RECALL_JWKS_URL=f"http://127.0.0.1:{jwks.server_port}/jwks", RECALL_JWT_ISSUER="https://idp.example/",
                        RECALL_JWT_AUDIENCE="recall")
        url = recall_url(service_env)
        resp = httpx.post(f"{url}/mcp", headers={"Authorization": f"Bearer {_rs256_token_naming_a_key()}",
                                                 "accept": "application/json, text/event-stream"},
                          json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, timeout=30)
    finally:
        jwks.shutdown()
    assert resp.status_code == 500 and resp.headers["content-type"] == "application/json", resp.text[:300]
    incident = re.search(r"incident ([0-9a-f]{12})$", resp.json()["detail"])[1]
    assert sample(url, 'recall_unexpected_errors_total{surface="http"}') == 1
    assert wait_until(lambda: log_events(proc.output(), "recall.unexpected_error"), 10), proc.output()[-3000:]
    [event] = log_events(proc.output(), "recall.unexpected_error")
    assert (event["incident"], event["error"], event["route"], event["user_hash"]) == (incident, "RecursionError", "before routing", None)
    assert "Exception in ASGI application" not in proc.output()


def test_a_caller_that_hangs_up_mid_request_is_not_an_unexpected_error(services, service_env):
    """A cancelled MCP call (or a gateway timing out) ends the connection before the body is
    read: that is counted as nothing, not as an incident that fires RecallServiceUnexpectedErrors."""
    import socket

    proc = services("serve")
    url = recall_url(service_env)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "recall_my_conversations", "arguments": {"query": "MT-4471"}}}).encode()
    for _ in range(3):  # the headers of a call, as the fastmcp client sends them, and then nothing
        with socket.create_connection(("127.0.0.1", int(service_env["RECALL_RECALL_PORT"])), timeout=5) as conn:
            conn.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                         b"accept: application/json, text/event-stream\r\nmcp-protocol-version: 2026-07-28\r\n"
                         b"mcp-method: tools/call\r\nmcp-name: recall_my_conversations\r\n"
                         + f"authorization: Bearer {mint('alice')}\r\ncontent-length: {len(body)}\r\n\r\n".encode())
            time.sleep(0.2)
    assert wait_until(lambda: httpx.get(f"{url}/healthz").status_code == 200, 10)
    time.sleep(0.5)  # the handlers see the hang-ups
    assert (sample(url, 'recall_unexpected_errors_total{surface="http"}') or 0) == 0
    assert not log_events(proc.output(), "recall.unexpected_error"), proc.output()[-2000:]


def test_a_stored_row_that_fails_validation_is_a_counted_500_not_the_callers_422(services, service_env):
    """A record's `reality` changed under the service (a hand edit, a restore from another
    version): it was answered 422 naming `reality`, as if the caller had sent it."""
    proc = services("serve")
    url, realm = recall_url(service_env), "acme"
    token = mint("alice", realms={realm: "member"})
    auth = {"Authorization": f"Bearer {token}"}
    made = httpx.post(f"{url}/realms/{realm}/memory", headers=auth, timeout=30, json={
        "memory_type": "fact", "title": "Proxy port", "summary": "The billing proxy listens on 8443.",
        "content": "port 8443", "reality": "current_state", "targets": [{"target_kind": "realm", "target_id": realm}]})
    assert made.status_code == 201, made.text
    record_id = made.json()["record_id"]
    with sqlite3.connect(Path(service_env["RECALL_DATA_DIR"]) / "artifacts.sqlite3") as db:
        db.execute("UPDATE agent_memory_records SET reality = ? WHERE record_id = ?", (PLANTED, record_id))

    resp = httpx.get(f"{url}/realms/{realm}/memory/{record_id}", headers=auth, timeout=30)
    assert resp.status_code == 500 and resp.json()["error"] == "internal", resp.text
    assert PLANTED not in resp.text and "reality" not in resp.text
    assert sample(url, 'recall_unexpected_errors_total{surface="http"}') == 1
    assert sample(url, 'recall_realm_calls_total{outcome="refused",surface="http"}') == 0


async def test_a_stored_row_that_fails_validation_is_an_internal_error_of_the_tool_counted_as_mcp(services, service_env):
    proc = services("serve")
    url, realm = recall_url(service_env), "acme"
    token = mint("alice", realms={realm: "member"})
    made = httpx.post(f"{url}/realms/{realm}/memory", headers={"Authorization": f"Bearer {token}"}, timeout=30, json={
        "memory_type": "fact", "title": "Proxy port", "summary": "The billing proxy listens on 8443.",
        "content": "port 8443", "reality": "current_state", "targets": [{"target_kind": "realm", "target_id": realm}]})
    record_id = made.json()["record_id"]
    with sqlite3.connect(Path(service_env["RECALL_DATA_DIR"]) / "artifacts.sqlite3") as db:
        db.execute("UPDATE agent_memory_records SET memory_type = ? WHERE record_id = ?", (PLANTED, record_id))
    async with Client(f"{url}/mcp", auth=BearerAuth(token)) as client:
        failed = await client.call_tool("get_agent_memory", {"realm_id": realm, "record_id": record_id}, raise_on_error=False)
    assert failed.is_error and re.fullmatch(r"internal error, logged as incident [0-9a-f]{12}", failed.content[0].text)
    assert sample(url, 'recall_unexpected_errors_total{surface="mcp"}') == 1
    assert sample(url, 'recall_realm_calls_total{outcome="refused",surface="mcp"}') == 0
    assert wait_until(lambda: log_events(proc.output(), "recall.unexpected_error"), 10), proc.output()[-3000:]
    [event] = log_events(proc.output(), "recall.unexpected_error")
    assert event["error"] == "services.recall.artifacts.artifact_store.DamagedRow" and event["tool"] == "get_agent_memory"
    assert PLANTED not in proc.output()


def test_the_indexers_http_routes_count_an_unexpected_failure(services, service_env, redis_url):
    """The running indexer exports the series at 0 (RecallServiceUnexpectedErrors sees its first
    failure); its app, with a route that fails added, answers a counted JSON 500 (no route of
    its own fails on demand)."""
    services("indexer")
    assert sample(f"http://127.0.0.1:{service_env['RECALL_INDEXER_PORT']}",
                  'recall_unexpected_errors_total{surface="indexer_http"}') == 0

    import redis.asyncio as aioredis
    from prometheus_client import REGISTRY
    from starlette.routing import Route

    from services.indexer.storage_probe import StorageProbe
    from services.indexer.worker import _http_app
    from shared.data_dir_identity import SharedDirWatch

    async def broken(request):
        raise LookupError(PLANTED)

    async def ask() -> httpx.Response:
        client = aioredis.Redis.from_url(redis_url)
        data_dir = Path(service_env["RECALL_DATA_DIR"])
        data_dir.mkdir(parents=True, exist_ok=True)
        app = _http_app(client, StorageProbe(client, data_dir, "test"), SharedDirWatch(client, data_dir, register=False))
        app.router.routes.append(Route("/broken", broken))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
                                     base_url="http://indexer") as http:
            ready = await http.get("/readyz")
            assert ready.status_code in (200, 503), ready.text
            return await http.get("/broken")

    before = REGISTRY.get_sample_value("recall_unexpected_errors_total", {"surface": "indexer_http"}) or 0
    resp = asyncio.run(ask())
    assert resp.status_code == 500 and resp.headers["content-type"] == "application/json", resp.text
    assert re.fullmatch(r"unexpected error, logged as incident [0-9a-f]{12}", resp.json()["detail"]) and PLANTED not in resp.text
    assert REGISTRY.get_sample_value("recall_unexpected_errors_total", {"surface": "indexer_http"}) == before + 1


async def test_a_tool_that_runs_out_of_time_reads_busy_and_is_counted_as_busy_not_unexpected():
    """fastmcp's own tool timeout, and a TimeoutError raised inside a tool: both are a loaded
    server, not a bug. They were "internal error, logged as incident …" (or fastmcp's bare
    "Error calling tool") and counted in recall_unexpected_errors_total, which pages."""
    from fastmcp import FastMCP
    from prometheus_client import REGISTRY

    from services.recall.unexpected_errors import TOOL_BUSY, UnexpectedToolErrors

    mcp = FastMCP("timeouts", mask_error_details=True)
    mcp.add_middleware(UnexpectedToolErrors())

    @mcp.tool(name="recall_my_conversations", timeout=0.2)
    async def slow_past_its_timeout() -> str:
        await asyncio.sleep(5)
        return "late"

    @mcp.tool
    async def a_realm_tool_waiting_on_something_that_times_out() -> str:
        return await asyncio.wait_for(asyncio.sleep(5), 0.05)

    def count(name: str, labels: dict) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0

    busy, unexpected = count("recall_busy_total", {"reason": "tool_timeout"}), count("recall_unexpected_errors_total", {"surface": "mcp"})
    realm_timeouts = count("recall_realm_calls_total", {"surface": "mcp", "outcome": "timeout"})
    async with Client(mcp) as client:
        for tool in ("recall_my_conversations", "a_realm_tool_waiting_on_something_that_times_out"):
            result = await client.call_tool(tool, {}, raise_on_error=False)
            assert result.is_error and result.content[0].text == TOOL_BUSY, (tool, result.content)
    # Each where its tool's calls are counted: RecallBusyAnswers divides by recall calls only.
    assert count("recall_busy_total", {"reason": "tool_timeout"}) == busy + 1
    assert count("recall_realm_calls_total", {"surface": "mcp", "outcome": "timeout"}) == realm_timeouts + 1
    assert count("recall_unexpected_errors_total", {"surface": "mcp"}) == unexpected


async def test_a_stored_constitution_that_fails_validation_is_an_internal_error_not_the_callers_refusal(services, service_env):
    """The realm's accepted constitution edited under the service: every caller was refused with
    "body: constitution body: …", as if their own call were wrong."""
    proc = services("serve")
    url, realm = recall_url(service_env), "acme"
    async with Client(f"{url}/mcp", auth=BearerAuth(mint("lead", realms={realm: "owner"}))) as client:
        await client.call_tool("init_population", {"realm_id": realm})
        with sqlite3.connect(Path(service_env["RECALL_DATA_DIR"]) / "artifacts.sqlite3") as db:
            db.execute("UPDATE artifacts SET body = ? WHERE artifact_path = 'population/constitution'",
                       (json.dumps({"roles": PLANTED}),))
        failed = await client.call_tool("list_population_agents", {"realm_id": realm}, raise_on_error=False)
    assert failed.is_error and re.fullmatch(r"internal error, logged as incident [0-9a-f]{12}", failed.content[0].text)
    assert sample(url, 'recall_unexpected_errors_total{surface="mcp"}') == 1
    assert wait_until(lambda: log_events(proc.output(), "recall.unexpected_error"), 10), proc.output()[-3000:]
    [event] = log_events(proc.output(), "recall.unexpected_error")
    assert event["error"] == "services.recall.artifacts.artifact_store.DamagedRow" and PLANTED not in proc.output()
