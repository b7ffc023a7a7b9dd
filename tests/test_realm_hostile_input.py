"""The realm surface under input a hostile or careless caller sends: each is a 4xx naming the
field (never a bare 500) and stores nothing, on SQLite and a real PostgreSQL. Real service,
real tokens, real MCP client and HTTP."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from fastmcp.exceptions import ToolError

from services.recall.artifacts.kind_schemas import parse_body
from services.recall.artifacts.models import MAX_TARGETS
from services.recall.artifacts.rules import RuleBroken
from tests.conftest import mint, recall_url

REALM = "acme-integrations"
REALM_TARGET = [{"target_kind": "realm", "target_id": REALM}]


def record(**overrides) -> dict:
    return {"memory_type": "fact", "title": "Contract 7 uses retry semantics of 2.1", "summary": "The vendor's 2.1.",
            "content": "Confirmed on the call.", "reality": "current_state", "targets": REALM_TARGET, **overrides}


@pytest.fixture
def realm_server(services, service_env, artifacts_db_url):
    serve = services("serve", RECALL_ARTIFACTS_DB_URL=artifacts_db_url)
    return service_env, serve


async def test_hostile_agent_memory_requests_are_a_4xx_naming_the_field_and_store_nothing(realm_server):
    env, serve = realm_server
    owner = mint("lead", realms={REALM: "owner"})
    http = httpx.Client(base_url=f"{recall_url(env)}/realms/{REALM}", timeout=30, headers={"authorization": f"Bearer {owner}"})

    def raw(text: str) -> httpx.Response:  # JSON as written, escapes included
        return http.post("/memory", content=text.encode(), headers={"content-type": "application/json"})

    lone_surrogate = json.dumps(record()).replace("Confirmed on the call.", "Confirmed \\ud800 on the call.")
    many_targets = [{"target_kind": "realm", "target_id": REALM, "role": r} for r in ("primary", "related")] * (MAX_TARGETS // 2 + 1)
    for resp, status, field in [
        (raw(lone_surrogate), 422, "content"),  # was a bare 500: UTF-8 cannot encode it, on either database
        (http.post("/memory", json=record(valid_until="9999-12-31T23:59:59-23:59")), 422, "valid_until"),  # year 10000 in UTC: a 500
        (http.post("/memory", json=record(valid_from="0001-01-01T00:00:00+23:59")), 422, "valid_from"),
        (http.post("/memory", json=record(targets=many_targets)), 422, "targets"),
        (http.get("/memory", params={"q": "retry " * 200}), 422, "q"),
        (http.get("/memory", params={"target_id": "x" * 201}), 422, "target_id"),
        (http.get("/memory", params={"tag": "t" * 41}), 422, "tag"),
        (raw("[" * 100_000 + "]" * 100_000), 422, "body"),
        # Starlette reads a byte that is not UTF-8 as U+FFFD: "caf\ufffd" was stored as the reason.
        (http.delete("/memory/some-record?reason=caf%E9"), 422, "reason"),
        (http.get("/memory?q=caf%E9"), 422, "q"),
        (http.get("/memory/rec%FF"), 422, "record_id"),
        (raw('{"title": ' * 2000 + "1" + "}" * 2000), 422, "body"),
    ]:
        assert resp.status_code == status and resp.json()["error"] == field, (field, resp.status_code, resp.text[:300])
    assert http.get("/memory", params={"valid_now": "false"}).json() == {"records": [], "next_offset": None}

    made = http.post("/memory", json=record(valid_until="9999-12-31T23:59:59Z", title="Контракт 7 ✓ 合同",
                                            content="Emoji 🦜 and RTL \u202eevil\u202c text are stored as sent.")).json()
    assert http.get(f"/memory/{made['record_id']}").json()["title"] == "Контракт 7 ✓ 合同"
    assert [r["record_id"] for r in http.get("/memory", params={"q": "контракт 合同"}).json()["records"]] == [made["record_id"]]
    refused = http.delete(f"/memory/{made['record_id']}", params={"reason": "r" * 1001})
    assert refused.status_code == 422 and refused.json()["error"] == "reason", refused.text
    assert http.get(f"/memory/{made['record_id']}").json()["status"] == "active"
    assert "Exception in ASGI" not in serve.output() and "Traceback" not in serve.output()


@pytest.mark.parametrize("body", ["[" * 5000 + "]" * 5000, '{"realm": ' + "9" * 5000 + "}", '{"realm": 7}'])
def test_a_constitution_body_too_deep_too_long_a_number_or_of_the_wrong_shape_is_refused_naming_the_body(body):
    """Nested past Python's stack or holding an integer of over 4,300 digits, a body escaped as an
    unexpected error ("internal error, logged as incident …") from every draft tool."""
    with pytest.raises(RuleBroken) as refused:
        parse_body("constitution", body)
    assert refused.value.rule == "body"


async def test_a_record_of_one_realm_is_not_reached_through_another(realm_server):
    env, _ = realm_server
    both = mint("lead", realms={REALM: "owner", "other-realm": "owner"})
    http = httpx.Client(base_url=recall_url(env), timeout=30, headers={"authorization": f"Bearer {both}"})
    made = http.post(f"/realms/{REALM}/memory", json=record()).json()
    for method, path in [("GET", f"/realms/other-realm/memory/{made['record_id']}"),
                         ("PATCH", f"/realms/other-realm/memory/{made['record_id']}"),
                         ("DELETE", f"/realms/other-realm/memory/{made['record_id']}"),
                         ("GET", f"/realms/other-realm/memory/{made['record_id']}/audit")]:
        resp = http.request(method, path, json={"summary": "x"} if method == "PATCH" else None)
        assert resp.status_code == 404 and resp.json()["error"] == "not_found", (method, path, resp.text)
    assert http.get(f"/realms/other-realm/memory").json()["records"] == []
    stranger = mint("eve", realms={"other-realm": "owner"})
    resp = httpx.get(f"{recall_url(env)}/realms/{REALM}/memory/{made['record_id']}", headers={"authorization": f"Bearer {stranger}"})
    assert resp.status_code == 403 and resp.json()["error"] == "realm_membership"
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(stranger)) as client:
        with pytest.raises(ToolError, match="realm_membership"):
            await client.call_tool("get_agent_memory", {"realm_id": REALM, "record_id": made["record_id"]})


async def test_more_targets_than_the_limit_are_refused_by_every_realm_tool(realm_server):
    env, _ = realm_server
    owner = mint("lead", realms={REALM: "owner"})
    targets = [{"target_kind": "realm", "target_id": REALM, "role": "related"}] * (MAX_TARGETS + 1)
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(owner)) as client:
        with pytest.raises(ToolError, match="targets"):
            await client.call_tool("create_memory_artifact_draft", {
                "realm_id": REALM, "artifact_path": "decisions/retry", "artifact_kind": "decision", "write_mode": "replace",
                "body": "b", "summary": "s", "source_ref": "r", "source_context": {}, "targets": targets})
        assert (await client.call_tool("search_memory_artifacts", {"realm_id": REALM, "status": "proposed"})).structured_content["artifacts"] == []


async def test_concurrent_people_changing_one_record_each_get_an_answer_and_the_audit_tells_it(realm_server):
    """Twenty changes and a retirement of one record at once: each is applied whole or refused
    by name (never a 500), and the audit holds exactly the applied ones, in order."""
    env, serve = realm_server
    owner = mint("lead", realms={REALM: "owner"})
    async with httpx.AsyncClient(base_url=f"{recall_url(env)}/realms/{REALM}", timeout=60,
                                 headers={"authorization": f"Bearer {owner}"}) as http:
        made = (await http.post("/memory", json=record())).json()
        rid = made["record_id"]
        answers = await asyncio.gather(*[http.patch(f"/memory/{rid}", json={"summary": f"s{n}", "tags": [f"t{n}"]})
                                         for n in range(20)], http.delete(f"/memory/{rid}"))
        codes = [a.status_code for a in answers]
        assert set(codes) <= {200, 409, 422} and codes[-1] == 200, [a.text for a in answers if a.status_code not in (200, 409, 422)]
        applied = sum(1 for a in answers[:-1] if a.status_code == 200)
        refused = [a.json()["error"] for a in answers[:-1] if a.status_code != 200]
        assert set(refused) <= {"lifecycle", "concurrency"}
        events = (await http.get(f"/memory/{rid}/audit", params={"limit": 100})).json()["events"]
        assert [e["event"] for e in events] == ["created", *["updated"] * applied, "retired"]
        final = (await http.get(f"/memory/{rid}")).json()
        assert final["status"] == "retired" and len(final["tags"]) == 1
    assert "Traceback" not in serve.output()


def test_a_sqlite_database_locked_by_another_process_answers_503_database_not_500(tmp_path, embedder):
    """A SQLite file whose write lock another process held past the busy timeout (`recall memory`,
    a backup tool) made every realm call a bare 500 / unnamed tool error."""
    import sqlite3

    from services.recall.agent_memory.memory_store import MemoryStore
    from services.recall.agent_memory.models import RecordInput
    from services.recall.agent_memory.service import AgentMemoryService
    from services.recall.artifacts.artifact_search import ArtifactSearch
    from services.recall.artifacts.artifact_store import ArtifactStore, StoreUnavailable
    from services.recall.artifacts.models import Role
    from services.recall.artifacts.service import ArtifactService, Caller
    from shared.engine.api import Engine

    url = f"sqlite:///{tmp_path / 'artifacts.sqlite3'}"
    store = ArtifactStore(url)
    store.sqlite_busy_s = 0.3
    memory = AgentMemoryService(MemoryStore(store), ArtifactService(store, ArtifactSearch(tmp_path, Engine(embedder=embedder)),
                                                                    tmp_path), tmp_path)
    alice = Caller("alice", {REALM: Role.MEMBER})
    data = RecordInput.model_validate(record(targets=REALM_TARGET))
    memory.create(alice, REALM, data)
    other = sqlite3.connect(tmp_path / "artifacts.sqlite3", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreUnavailable):
            memory.create(alice, REALM, data)
    finally:
        other.execute("ROLLBACK")
    assert len(memory.search(alice, REALM)) == 1
    memory.create(alice, REALM, data)
    assert len(memory.search(alice, REALM)) == 2
