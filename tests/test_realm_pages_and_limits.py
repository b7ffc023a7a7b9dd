"""Every list of the realm surface comes a page at a time, and every stored text has a size
limit, on SQLite and a real PostgreSQL: an audit trail, a journal's entries, AgentMemory's
audit and the agent registry were returned whole (a worklog kept for a year came back with
every entry on each read and each append), and a body as large as MCP's 4 MiB request was
stored and carried back by every read."""

from __future__ import annotations

import gzip
import json
import time

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from fastmcp.exceptions import ToolError

from services.recall.agent_memory.memory_store import MemoryStore
from services.recall.agent_memory.models import RecordFields, RecordInput
from services.recall.agent_memory.service import AgentMemoryService
from services.recall.artifacts.artifact_search import INDEXED_CHARS, ArtifactSearch
from services.recall.artifacts.artifact_store import ArtifactStore
from services.recall.artifacts.kind_schemas import REGISTRY_PATH, AgentRegistry, RegistryEntry, dump
from services.recall.artifacts.models import DraftInput, Role, Target
from services.recall.artifacts.rules import RuleBroken
from services.recall.artifacts.service import ArtifactService, Caller
from services.recall.artifacts.text_limits import DEFAULT_MAX_TEXT_BYTES, TextTooLarge, max_body_bytes
from services.recall.population.service import PopulationService
from services.recall.settings import RecallSettings
from shared.engine.api import Engine
from tests.conftest import mint, recall_url

REALM = "acme-integrations"
OWNER = Caller("lead", {REALM: Role.OWNER})
MEMBER = Caller("member-1", {REALM: Role.MEMBER})
LIMIT = 4096


@pytest.fixture
def service(artifacts_db_url, tmp_path, embedder) -> ArtifactService:
    made = ArtifactService(ArtifactStore(artifacts_db_url), ArtifactSearch(tmp_path, Engine(embedder=embedder)), tmp_path,
                           max_text_bytes=LIMIT)
    made.register_entity(MEMBER, REALM, "contract-7", "Contract 7", "contract")
    return made


def draft(path: str, body: str, kind: str = "dossier", **extra) -> DraftInput:
    return DraftInput(artifact_path=path, artifact_kind=kind, write_mode="append" if kind == "worklog" else "replace",
                      body=body, summary=body[:60], source_ref="r", source_context=extra.pop("source_context", {}),
                      targets=[Target(target_kind="entity", target_id="contract-7")], **extra)


def walk(read, limit: int) -> list:
    """Every item of a paged list, following next_offset; pages must never overlap."""
    items, offset, pages = [], 0, 0
    while offset is not None:
        page, offset = read(offset, limit)
        assert len(page) <= limit
        items += page
        pages += 1
        assert pages < 1000
    return items


def test_a_journals_entries_and_its_audit_come_a_page_at_a_time(service):
    wl = service.create_draft(MEMBER, REALM, draft("agents/a/worklog", "Worklog of contract 7.", "worklog"))
    for n in range(45):
        appended = service.append(MEMBER, REALM, wl.artifact_id, f"step {n}", "r", {})
        assert len(appended.entries) <= 20, "an append answers with a page, not the whole journal"
    service.submit(MEMBER, REALM, wl.artifact_id)
    service.accept(OWNER, REALM, wl.artifact_id)

    first = service.get(MEMBER, REALM, wl.artifact_id)
    assert (len(first.entries), first.entries_total, first.entries_next_offset) == (20, 45, 20)

    def entries(offset, limit):
        got = service.get(MEMBER, REALM, wl.artifact_id, entries_offset=offset, entries_limit=limit)
        return got.entries, got.entries_next_offset
    assert [e.seq for e in walk(entries, 7)] == list(range(1, 46))
    by_path = service.get_by_path(MEMBER, REALM, "agents/a/worklog", entries_offset=40, entries_limit=100)
    assert [e.body for e in by_path.entries] == [f"step {n}" for n in range(40, 45)] and by_path.entries_next_offset is None
    assert service.search(MEMBER, REALM, None, None, "worklog", None)[0]["entries"] == 45

    def audit(offset, limit):
        page = service.audit(MEMBER, REALM, wl.artifact_id, limit, offset)
        return page, offset + len(page) if len(page) == limit else None
    assert [e["event"] for e in walk(audit, 10)] == ["created", *["appended"] * 45, "submitted", "accepted"]

    for bad, field in [({"entries_limit": 101}, "entries_limit"), ({"entries_limit": 0}, "entries_limit"),
                       ({"entries_offset": -1}, "entries_offset")]:
        with pytest.raises(RuleBroken, match=f"^{field}:"):
            service.get(MEMBER, REALM, wl.artifact_id, **bad)
    with pytest.raises(RuleBroken, match="^limit:"):
        service.audit(MEMBER, REALM, wl.artifact_id, 101)


def test_agent_memory_audit_comes_a_page_at_a_time(service):
    memory = AgentMemoryService(MemoryStore(service.store), service, service.data_dir)
    made = memory.create(MEMBER, REALM, RecordInput(memory_type="fact", title="t", summary="s", content="c",
                                                    reality="current_state",
                                                    targets=[Target(target_kind="entity", target_id="contract-7")]))
    for n in range(12):
        memory.update(MEMBER, REALM, made["record_id"], RecordFields(summary=f"s{n}"))

    def audit(offset, limit):
        page = memory.audit(MEMBER, REALM, made["record_id"], limit, offset)
        return page, offset + len(page) if len(page) == limit else None
    assert [e["event"] for e in walk(audit, 5)] == ["created", *["updated"] * 12]
    with pytest.raises(RuleBroken, match="^offset:"):
        memory.audit(MEMBER, REALM, made["record_id"], 10, -5)


def test_the_agent_registry_is_listed_a_page_at_a_time(service):
    population = PopulationService(service)
    population.init_population(OWNER, REALM)
    registry = service.get_by_path(OWNER, REALM, REGISTRY_PATH)
    service.max_text_bytes = DEFAULT_MAX_TEXT_BYTES  # 25 entries are ~5 KB of JSON
    agents = AgentRegistry(agents=[RegistryEntry(principal=f"bot-{n:02}", role="researcher", proposed_by="lead",
                                                 proposed_at="2026-12-01T00:00:00Z") for n in range(25)])
    service.supersede(OWNER, REALM, registry.artifact_id, dump(agents), "25 agents", "r", {}, None)

    listed = population.list_agents(MEMBER, REALM)
    assert (len(listed["agents"]), listed["agents_total"], listed["next_offset"]) == (20, 25, 20)

    def page(offset, limit):
        got = population.list_agents(MEMBER, REALM, None, limit, offset)
        return got["agents"], got["next_offset"]
    assert [a["principal"] for a in walk(page, 6)] == [f"bot-{n:02}" for n in range(25)]
    with pytest.raises(RuleBroken, match="^limit:"):
        population.list_agents(MEMBER, REALM, None, 500)


def test_a_text_over_the_limit_is_refused_naming_its_field_and_nothing_is_stored(service):
    two_bytes_each = "я" * (LIMIT // 2 + 1)  # fewer characters than the limit, more bytes
    with pytest.raises(TextTooLarge, match="^body: 4,098 bytes of UTF-8, over the limit of 4,096"):
        service.create_draft(MEMBER, REALM, draft("dossiers/big", two_bytes_each))
    with pytest.raises(RuleBroken, match="not_found"):
        service.own_draft_by_path(MEMBER, REALM, "dossiers/big", None)
    with pytest.raises(TextTooLarge, match="^source_context:"):
        service.create_draft(MEMBER, REALM, draft("dossiers/big", "fine", source_context={"notes": "x" * LIMIT}))
    deep: dict = {}
    for _ in range(40):
        deep = {"d": deep}
    with pytest.raises(RuleBroken, match="^source_context: nested more than 32 levels"):
        service.create_draft(MEMBER, REALM, draft("dossiers/big", "fine", source_context=deep))
    with pytest.raises(RuleBroken, match="^source_context: holds a number JSON cannot carry"):
        service.create_draft(MEMBER, REALM, draft("dossiers/big", "fine", source_context={"score": float("nan")}))
    with pytest.raises(RuleBroken, match="^source_context: holds a number JSON cannot carry"):
        service.create_draft(MEMBER, REALM, draft("dossiers/big", "fine", source_context={"id": 10**5000}))

    at_limit = service.create_draft(MEMBER, REALM, draft("agents/a/worklog", "я" * (LIMIT // 2), "worklog"))
    with pytest.raises(TextTooLarge, match="^body:"):
        service.append(MEMBER, REALM, at_limit.artifact_id, "x" * (LIMIT + 1), "r", {})
    with pytest.raises(TextTooLarge, match="^body:"):
        service.update_draft(MEMBER, REALM, at_limit.artifact_id, {"body": "x" * (LIMIT + 1)})
    service.submit(MEMBER, REALM, at_limit.artifact_id)
    service.accept(OWNER, REALM, at_limit.artifact_id)
    with pytest.raises(TextTooLarge, match="^body:"):
        service.supersede(OWNER, REALM, at_limit.artifact_id, "x" * (LIMIT + 1), "s", "r", {}, None)
    kept = service.get(MEMBER, REALM, at_limit.artifact_id)
    assert kept.body == "я" * (LIMIT // 2) and kept.entries_total == 0 and kept.status.value == "accepted"

    memory = AgentMemoryService(MemoryStore(service.store), service, service.data_dir)
    with pytest.raises(TextTooLarge, match="^content:"):
        memory.create(MEMBER, REALM, RecordInput(memory_type="fact", title="t", summary="s", content="€" * 2000,
                                                 reality="current_state",
                                                 targets=[Target(target_kind="entity", target_id="contract-7")]))
    assert memory.search(MEMBER, REALM) == []


def test_a_huge_flat_source_context_is_refused_naming_it_after_bounded_work(service):
    """Two million numbers (MCP's 4 MiB request): every one was walked and written out as JSON
    (~1 s of CPU) before the refusal; now the walk stops once there are more values than bytes."""
    huge = draft("dossiers/big", "fine", source_context={"scores": list(range(2_000_000))})
    started = time.process_time()
    with pytest.raises(TextTooLarge, match=r"^source_context: more than 4,096 values, each at least a byte of JSON, over the limit"):
        service.create_draft(MEMBER, REALM, huge)
    assert time.process_time() - started < 0.1
    with pytest.raises(RuleBroken, match="not_found"):
        service.own_draft_by_path(MEMBER, REALM, "dossiers/big", None)


def test_the_default_text_limit_holds_what_search_reads_and_the_http_limit_carries_it():

    assert RecallSettings.model_fields["realm_max_text_bytes"].default == DEFAULT_MAX_TEXT_BYTES
    assert 3 * INDEXED_CHARS <= DEFAULT_MAX_TEXT_BYTES, "the indexed prefix in any BMP script (CJK: 3 bytes) fits"
    # The largest record, every byte of its content escaped as \\u00XX, still reaches the service.
    worst = json.dumps({"memory_type": "fact", "title": "t" * 200, "summary": "s" * 1000, "content": "\x01" * DEFAULT_MAX_TEXT_BYTES,
                        "reality": "current_state", "tags": ["t" * 40] * 20,
                        "targets": [{"target_kind": "entity", "target_id": "e" * 200}] * 20,
                        "citations": [{"session_id": "s" * 128, "turn_uuid": "u" * 200}] * 20})
    assert len(worst.encode()) <= max_body_bytes(DEFAULT_MAX_TEXT_BYTES)
    assert max_body_bytes(512 * 1024) >= 6 * 512 * 1024


@pytest.fixture
def realm_server(services, service_env, artifacts_db_url):
    services("serve", RECALL_ARTIFACTS_DB_URL=artifacts_db_url, RECALL_REALM_MAX_TEXT_BYTES=str(LIMIT))
    return service_env


async def test_over_http_and_mcp_a_large_text_is_a_4xx_naming_its_field_and_lists_page(realm_server):
    env = realm_server
    member = mint("member-1", realms={REALM: "member"})
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(member)) as mcp:
        await mcp.call_tool("register_realm_entity", {"realm_id": REALM, "entity_id": "contract-7", "title": "Contract 7"})
        base = {"realm_id": REALM, "artifact_path": "agents/a/worklog", "artifact_kind": "worklog", "write_mode": "append",
                "summary": "s", "source_ref": "r", "source_context": {},
                "targets": [{"target_kind": "entity", "target_id": "contract-7"}]}
        with pytest.raises(ToolError, match=r"^body: 8,192 bytes of UTF-8, over the limit of 4,096 \(RECALL_REALM_MAX_TEXT_BYTES\)"):
            await mcp.call_tool("create_memory_artifact_draft", {**base, "body": "ж" * 4096})
        made = (await mcp.call_tool("create_memory_artifact_draft", {**base, "body": "fine"})).structured_content
        for n in range(3):
            await mcp.call_tool("append_memory_artifact", {"realm_id": REALM, "artifact_id": made["artifact_id"],
                                                           "body": f"e{n}", "source_ref": "r", "source_context": {}})
        page = (await mcp.call_tool("get_memory_artifact", {"realm_id": REALM, "artifact_id": made["artifact_id"],
                                                            "entries_offset": 1, "entries_limit": 1})).structured_content
        assert ([e["body"] for e in page["entries"]], page["entries_total"], page["entries_next_offset"]) == (["e1"], 3, 2)
        audit = (await mcp.call_tool("list_memory_artifact_audit", {"realm_id": REALM, "artifact_id": made["artifact_id"],
                                                                    "limit": 2, "offset": 2})).structured_content
        assert [e["event"] for e in audit["events"]] == ["appended", "appended"] and audit["next_offset"] == 4
        with pytest.raises(ToolError, match="entries_limit"):
            await mcp.call_tool("get_memory_artifact", {"realm_id": REALM, "artifact_id": made["artifact_id"], "entries_limit": 101})
        with pytest.raises(ToolError, match="limit"):
            await mcp.call_tool("list_memory_artifact_audit", {"realm_id": REALM, "artifact_id": made["artifact_id"], "limit": 101})

    http = httpx.Client(base_url=f"{recall_url(env)}/realms/{REALM}", timeout=30, headers={"authorization": f"Bearer {member}"})
    record = {"memory_type": "fact", "title": "t", "summary": "s", "reality": "current_state",
              "targets": [{"target_kind": "entity", "target_id": "contract-7"}]}
    big = http.post("/memory", json={**record, "content": "€" * 2000})
    assert big.status_code == 413 and big.json()["error"] == "content", big.text
    assert http.get("/memory").json()["records"] == []
    made = http.post("/memory", json={**record, "content": "fine"}).json()
    for n in range(3):
        assert http.patch(f"/memory/{made['record_id']}", json={"summary": f"s{n}"}).status_code == 200
    page = http.get(f"/memory/{made['record_id']}/audit", params={"limit": 2, "offset": 1}).json()
    assert [e["event"] for e in page["events"]] == ["updated", "updated"] and page["next_offset"] == 3
    for params, field in [({"limit": 101}, "limit"), ({"limit": "many"}, "limit"), ({"offset": -1}, "offset"),
                          ({"page": 2}, "page")]:
        refused = http.get(f"/memory/{made['record_id']}/audit", params=params)
        assert refused.status_code == 422 and refused.json()["error"] == field, refused.text


def test_citations_of_one_conversation_read_it_once_and_never_under_the_write_lock(service, monkeypatch):
    """Twenty citations of one long conversation read it twenty times, and a change's citations
    and every shown record's passages were read inside the transaction (on SQLite the database's
    write lock, held for all other writers while the disk was read)."""
    from services.recall.agent_memory import citations
    from shared.tenant_paths import TenantPaths
    from tests.conftest import write_conversation

    write_conversation(TenantPaths.for_user(service.data_dir, MEMBER.principal).transcript("call").parent, "call",
                       [f"turn {n} " + "talk " * 2000 for n in range(40)])
    reads: list[bool] = []
    real = citations.read_transcript

    def read_and_note(path):
        with service.store.transaction():  # no other transaction is open: it would wait on (SQLite) or hold the lock
            pass
        reads.append(True)
        return real(path)
    monkeypatch.setattr(citations, "read_transcript", read_and_note)
    memory = AgentMemoryService(MemoryStore(service.store), service, service.data_dir)
    cited = [{"session_id": "call", "turn_uuid": f"call-{n}"} for n in range(20)]
    made = memory.create(MEMBER, REALM, RecordInput(memory_type="fact", title="t", summary="s", content="c",
                                                    reality="current_state", citations=cited,
                                                    targets=[Target(target_kind="entity", target_id="contract-7")]))
    assert [c["status"] for c in made["citations"]] == ["shown"] * 20
    assert len(reads) == 2  # once to check, once to show
    memory.update(MEMBER, REALM, made["record_id"], RecordFields.model_validate({"citations": cited[:5]}))
    memory.get(MEMBER, REALM, made["record_id"])
    assert len(reads) == 5


def test_next_offset_is_never_an_offset_the_next_call_refuses():
    # A full page ending past the offset bound pointed at a page every list refuses (offset out of
    # range): a client following next_offset ended on an error instead of the last page.
    from services.recall.artifacts.service import MAX_OFFSET, MAX_TRAIL_OFFSET
    from services.recall.artifacts.tools import next_offset

    assert next_offset([0] * 10, 10, 0) == 10 and next_offset([0] * 9, 10, 0) is None
    assert next_offset([0] * 100, 100, MAX_OFFSET - 100) == MAX_OFFSET  # still a valid offset
    assert next_offset([0] * 100, 100, MAX_OFFSET - 50) is None
    assert next_offset([0] * 100, 100, MAX_OFFSET - 50, MAX_TRAIL_OFFSET) == MAX_OFFSET + 50
    assert next_offset([0] * 100, 100, MAX_TRAIL_OFFSET, MAX_TRAIL_OFFSET) is None


def test_a_source_context_within_the_limit_is_stored_within_it(service):
    # The limit is checked on the context's UTF-8 JSON; it was stored ASCII-escaped, a parrot
    # (4 bytes) as 12 ("\ud83e\udd9c"): up to three times the limit on disk and in every read.
    context = {"notes": "🦜" * 1000}
    assert len(json.dumps(context, ensure_ascii=False).encode()) <= LIMIT
    made = service.create_draft(MEMBER, REALM, draft("agents/a/worklog", "fine", "worklog", source_context=context))
    service.append(MEMBER, REALM, made.artifact_id, "an entry", "r", context)
    with service.store.transaction() as tx:
        stored = [r[0] for r in tx.q("SELECT source_context FROM artifacts WHERE artifact_id = ?", (made.artifact_id,))]
        stored += [r[0] for r in tx.q("SELECT source_context FROM artifact_entries WHERE artifact_id = ?", (made.artifact_id,))]
    assert len(stored) == 2 and all(len(s.encode()) <= LIMIT and json.loads(s) == context for s in stored)
    got = service.get(MEMBER, REALM, made.artifact_id)
    assert got.source_context == context and got.entries[0].source_context == context


@pytest.mark.parametrize("authorization", [None, "Bearer not-a-token"])
def test_a_caller_without_a_valid_token_is_refused_before_its_body_is_read(realm_server, authorization):
    """Bodies were buffered (up to a MiB) before the token was looked at: 1,500 stalled callers
    without a token took a replica from 362 MB to 1.75 GB (a security review's trial)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(recall_url(realm_server))
    with socket.create_connection((url.hostname, url.port), timeout=10) as conn:
        head = ["POST /mcp HTTP/1.1", f"Host: {url.hostname}", "Content-Type: application/json",
                "Accept: application/json, text/event-stream", "Content-Length: 1000000"]
        if authorization:
            head.append(f"Authorization: {authorization}")
        conn.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + b'{"jsonrpc": "2.0", ')  # and then nothing
        conn.settimeout(5)
        answer = conn.recv(4096).decode(errors="replace")
    assert answer.startswith("HTTP/1.1 401"), answer[:200]


async def test_an_mcp_request_larger_than_any_tool_call_is_refused_413_before_it_is_read_whole(realm_server):
    """The MCP SDK reads and parses bodies of up to 4 MiB; no tool argument can use more than
    a realm write at its text limit, so the service stops reading there."""
    env = realm_server
    member = mint("member-1", realms={REALM: "member"})
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "recall_my_conversations", "arguments": {"query": "q" * max_body_bytes(LIMIT)}}}
    body = json.dumps(call).encode()
    headers = {"authorization": f"Bearer {member}", "content-type": "application/json",
               "accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=recall_url(env), timeout=30, headers=headers) as http:
        declared = http.post("/mcp", content=body)
        streamed = http.post("/mcp", content=iter([body[i:i + 65536] for i in range(0, len(body), 65536)]))  # chunked
    for refused in (declared, streamed):
        assert refused.status_code == 413 and refused.json()["error"] == "body_size", refused.text
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(member)) as mcp:
        answer = await mcp.call_tool("recall_my_conversations", {"query": "contract 7"})
    assert answer.content[0].text


def test_an_mcp_request_sent_compressed_is_refused_415_naming_the_encoding(realm_server):
    """A gzip body got the MCP SDK's JSON-RPC "Parse error: expected value at line 1 column 1"."""
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    headers = {"authorization": f"Bearer {mint('member-1', realms={REALM: 'member'})}", "content-type": "application/json",
               "accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=recall_url(realm_server), timeout=30, headers=headers) as http:
        refused = http.post("/mcp", content=gzip.compress(json.dumps(call).encode()), headers={"content-encoding": "gzip"})
        listed = http.post("/mcp", content=json.dumps(call).encode())
    assert refused.status_code == 415, refused.text
    assert refused.json() == {"error": "body_encoding", "detail": "Content-Encoding 'gzip' is not accepted: send the body uncompressed"}
    assert listed.status_code == 200 and "recall_my_conversations" in listed.text
