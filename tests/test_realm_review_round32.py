"""What a team lead's review of the realm surface found over the wire (round 32), on SQLite and a
real PostgreSQL, with a real service, real tokens, a real MCP client and HTTP: registered agents
wrote AgentMemory over HTTP (a suspended one too); a retirement's reason sent in the body was
dropped; a bad validity period was blamed on the body; targets came back reordered; and ids of
any length came back whole in errors, 100-200 KB into an agent's context."""

from __future__ import annotations

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from fastmcp.exceptions import ToolError

from tests.conftest import mint, recall_url

REALM = "acme"
ON_REALM = [{"target_kind": "realm", "target_id": REALM}]
SHORT_ERROR = 1000  # characters: an error names the field and a prefix of the value, never the value


@pytest.fixture
def realm_server(services, service_env, artifacts_db_url):
    services("serve", RECALL_ARTIFACTS_DB_URL=artifacts_db_url)
    return service_env


def record(**overrides) -> dict:
    return {"memory_type": "decision", "reality": "decision", "title": "Retry policy", "summary": "Retry 3 times.",
            "content": "Agreed on the call.", "targets": ON_REALM, **overrides}


def http(env, user: str, role: str) -> httpx.Client:
    return httpx.Client(base_url=f"{recall_url(env)}/realms/{REALM}", timeout=30,
                        headers={"authorization": f"Bearer {mint(user, realms={REALM: role})}"})


async def mcp(env, user: str, role: str, tool: str, **args) -> dict:
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(mint(user, realms={REALM: role}))) as client:
        return (await client.call_tool(tool, args)).structured_content


async def mcp_error(env, user: str, role: str, tool: str, **args) -> str:
    with pytest.raises(ToolError) as caught:
        await mcp(env, user, role, tool, **args)
    return str(caught.value)


async def test_registered_agents_are_refused_every_agent_memory_write_and_people_keep_writing(realm_server):
    env = realm_server
    bot, alice = http(env, "researcher-b", "member"), http(env, "alice", "member")
    before = bot.post("/memory", json=record(title="Written before admission"))
    assert before.status_code == 201, before.text  # not yet an agent: a person
    await mcp(env, "lead", "owner", "init_population", realm_id=REALM)
    proposal = await mcp(env, "coordinator", "member", "propose_agent_admission", realm_id=REALM,
                         principal="researcher-b", agent_role="researcher")
    await mcp(env, "lead", "owner", "accept_memory_artifact", realm_id=REALM, artifact_id=proposal["artifact_id"])

    mine = alice.post("/memory", json=record())
    assert mine.status_code == 201, mine.text
    for response in (bot.post("/memory", json=record(title="Agent-written decision")),
                     bot.patch(f"/memory/{mine.json()['record_id']}", json={"summary": "Retry 9 times."}),
                     bot.patch(f"/memory/{before.json()['record_id']}", json={"summary": "changed"}),
                     bot.delete(f"/memory/{before.json()['record_id']}")):
        assert response.status_code == 403 and response.json()["error"] == "people_write", response.text
        assert "researcher-b" in response.json()["detail"]
    assert alice.patch(f"/memory/{mine.json()['record_id']}", json={"summary": "Retry 4 times."}).status_code == 200
    assert [r["author"] for r in alice.get("/memory").json()["records"]] == ["alice", "researcher-b"]


async def test_a_retirement_reason_in_the_body_is_kept_and_a_bad_period_names_valid_until(realm_server):
    env = realm_server
    alice = http(env, "alice", "member")
    ids = [alice.post("/memory", json=record(title=f"r{i}")).json()["record_id"] for i in range(3)]

    retired = alice.request("DELETE", f"/memory/{ids[0]}", json={"reason": "superseded by vendor 2.2"})
    assert retired.status_code == 200, retired.text
    assert alice.get(f"/memory/{ids[0]}/audit").json()["events"][-1]["detail"]["reason"] == "superseded by vendor 2.2"
    assert alice.delete(f"/memory/{ids[1]}", params={"reason": "in the query"}).status_code == 200
    assert alice.get(f"/memory/{ids[1]}/audit").json()["events"][-1]["detail"]["reason"] == "in the query"
    for body, params in [({"reason": "a"}, {"reason": "b"}), ({"why": "typo"}, {}), ({"reason": "r" * 1001}, {})]:
        answer = alice.request("DELETE", f"/memory/{ids[2]}", json=body, params=params)
        assert answer.status_code == 422 and answer.json()["error"] in ("reason", "why"), answer.text
    assert alice.get(f"/memory/{ids[2]}").json()["status"] == "active"

    late = alice.post("/memory", json=record(valid_from="2026-12-01T00:00:00Z", valid_until="2026-11-01T00:00:00Z"))
    assert late.status_code == 422 and late.json()["error"] == "valid_until", late.text
    changed = alice.patch(f"/memory/{ids[2]}", json={"valid_from": "2026-12-01T00:00:00Z", "valid_until": "2026-11-01T00:00:00Z"})
    assert changed.status_code == 422 and changed.json()["error"] == "valid_until", changed.text


async def test_targets_come_back_in_the_order_written(realm_server):
    env = realm_server
    await mcp(env, "lead", "owner", "register_realm_entity", realm_id=REALM, entity_id="billing-api", title="Billing API")
    targets = [{"target_kind": "entity", "target_id": "billing-api", "role": "evidence"},
               {"target_kind": "realm", "target_id": REALM, "role": "primary"},
               {"target_kind": "entity", "target_id": "billing-api", "role": "related"}]
    made = await mcp(env, "alice", "member", "create_memory_artifact_draft", realm_id=REALM, artifact_path="dossiers/billing",
                     artifact_kind="dossier", write_mode="replace", body="b", summary="s", source_ref="r", source_context={},
                     targets=targets)
    assert made["targets"] == targets
    again = await mcp(env, "alice", "member", "update_memory_artifact_draft", realm_id=REALM, artifact_id=made["artifact_id"],
                      targets=[targets[2], targets[0]])
    assert again["targets"] == [targets[2], targets[0]]
    assert (await mcp(env, "alice", "member", "get_memory_artifact", realm_id=REALM,
                      artifact_id=made["artifact_id"]))["targets"] == [targets[2], targets[0]]


# Every id or name a realm tool takes is bounded in its schema.
BOUNDED = {"realm_id", "artifact_id", "artifact_path", "supersedes_artifact_id", "agent_principal", "principal",
           "agent_role", "takes_over_from", "record_id", "entity_id", "target_id", "entity_kind", "title", "tag", "query"}


async def test_ids_and_names_are_bounded_and_never_echoed_back_whole(realm_server):
    env = realm_server
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(mint("lead", realms={REALM: "owner"}))) as client:
        tools = await client.list_tools()
    unbounded = [f"{tool.name}.{name}" for tool in tools if tool.name != "recall_my_conversations"  # not a realm tool
                 for name, schema in tool.input_schema["properties"].items() if name in BOUNDED and "maxLength" not in str(schema)]
    assert not unbounded, unbounded

    huge = "a" * 100_000
    await mcp(env, "lead", "owner", "init_population", realm_id=REALM)
    for user, role, tool, args in [
        ("lead", "owner", "supersede_memory_artifact", dict(realm_id=REALM, artifact_id=huge, body="b", summary="s",
                                                            source_ref="r", source_context={})),
        ("lead", "owner", "get_agent_memory", dict(realm_id=REALM, record_id=huge)),
        ("lead", "owner", "search_memory_artifacts", dict(realm_id="r" * 100_000)),
        ("lead", "owner", "check_population_rules", dict(realm_id=REALM, action="start", principal="p" * 100_000)),
        ("lead", "owner", "list_population_agents", dict(realm_id=REALM, principal="p" * 100_000)),
        ("alice", "member", "create_memory_artifact_draft", dict(
            realm_id=REALM, artifact_path="dossiers/x", artifact_kind="dossier", write_mode="replace", body="b", summary="s",
            source_ref="r", source_context={}, targets=ON_REALM, supersedes_artifact_id=huge)),
        ("alice", "member", "propose_agent_admission", dict(realm_id=REALM, principal="bot-1", agent_role="researcher",
                                                            takes_over_from=huge)),
    ]:
        message = await mcp_error(env, user, role, tool, **args)
        assert len(message) < SHORT_ERROR, (tool, len(message))

    lead = http(env, "lead", "owner")
    for path in (f"/memory/{'x' * 3000}", f"/memory/{'x' * 3000}/audit"):
        answer = lead.get(path)
        assert answer.status_code == 422 and answer.json()["error"] == "record_id" and len(answer.text) < SHORT_ERROR, answer.text
    answer = lead.delete(f"/memory/{'x' * 3000}")
    assert answer.status_code == 422 and len(answer.text) < SHORT_ERROR, answer.text
