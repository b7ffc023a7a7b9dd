"""AgentMemory (issue 14, section 1): people write records over the recall service's HTTP API
(or `recall memory`), agents search and read them over MCP; real tokens, a real MCP client,
SQLite and a real PostgreSQL."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
from datetime import datetime, timedelta, timezone

import httpx
from fastmcp import Client
from fastmcp.client.auth import BearerAuth

from tests.conftest import BIN, call_recall, indexed_chunks, mint, post_conversation, recall_url, wait_until

REALM = "acme-integrations"
CITE = re.compile(r"^  cite: session_id=(\S+) turn_uuid=(\S+)$", re.M)


def iso(delta_days: float) -> str:
    return (datetime.now(timezone.utc) + timedelta(days=delta_days)).isoformat()


class Person:
    """Someone of the realm using the HTTP API with their bearer token."""

    def __init__(self, env, user: str, role: str) -> None:
        self.http = httpx.Client(base_url=f"{recall_url(env)}/realms/{REALM}", timeout=30,
                                 headers={"authorization": f"Bearer {mint(user, realms={REALM: role})}"})

    def __getattr__(self, method: str):
        return getattr(self.http, method)


async def mcp(env, user: str, role: str, tool: str, **args) -> dict:
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(mint(user, realms={REALM: role}))) as client:
        return (await client.call_tool(tool, args)).structured_content


def record(**overrides) -> dict:
    return {"memory_type": "fact", "title": "Contract 7 uses retry semantics of 2.1",
            "summary": "The vendor's 2.1 changes the retry field.", "content": "Confirmed by the vendor on the call.",
            "reality": "current_state", "targets": [{"target_kind": "entity", "target_id": "contract-7", "role": "primary"}],
            "tags": ["contract-7", "vendor"], **overrides}


async def test_people_write_agents_search_and_read_with_provenance(mcp_server):
    env = mcp_server
    await mcp(env, "lead", "owner", "register_realm_entity", realm_id=REALM, entity_id="contract-7", title="Integration contract")
    post_conversation(env, "alice", "call-notes", ["Vendor call: they confirmed the retry fix ships in 2.1.", "noted"])
    assert wait_until(lambda: indexed_chunks(env, "alice") == 2, 30)
    answer = await call_recall(env, mint("alice"), "vendor retry fix")
    session_id, turn_uuid = CITE.search(answer).groups()

    alice = Person(env, "alice", "member")
    made = alice.post("/memory", json=record(citations=[{"session_id": session_id, "turn_uuid": turn_uuid}],
                                      valid_from=iso(-1), valid_until=iso(30)))
    assert made.status_code == 201, made.text
    fact = made.json()
    assert fact["author"] == "alice" and fact["valid_now"] and fact["citations"][0]["status"] == "shown"
    old = alice.post("/memory", json=record(memory_type="hypothesis", reality="hypothesis", title="Retry bug is in the proxy",
                                     tags=["proxy"], valid_until=iso(-0.5), valid_from=iso(-3))).json()
    goal = alice.post("/memory", json=record(memory_type="decision", reality="target_state", title="Move to 2.1",
                                      summary="Target: run on 2.1.", content="Plan the migration.", targets=[{"target_kind": "realm", "target_id": REALM}], tags=[])).json()

    # Agents (any realm role) search with filters; expired records are hidden by default.
    def ids(found: dict) -> set[str]:
        return {r["record_id"] for r in found["records"]}

    assert ids(await mcp(env, "agent-1", "reader", "search_agent_memory", realm_id=REALM)) == {fact["record_id"], goal["record_id"]}
    assert ids(await mcp(env, "agent-1", "reader", "search_agent_memory", realm_id=REALM, valid_now=False)) == \
        {fact["record_id"], goal["record_id"], old["record_id"]}
    assert ids(await mcp(env, "agent-1", "reader", "search_agent_memory", realm_id=REALM, memory_type="decision")) == {goal["record_id"]}
    assert ids(await mcp(env, "agent-1", "reader", "search_agent_memory", realm_id=REALM, reality="current_state")) == {fact["record_id"]}
    assert ids(await mcp(env, "agent-1", "reader", "search_agent_memory", realm_id=REALM, tag="vendor")) == {fact["record_id"]}
    assert ids(await mcp(env, "agent-1", "reader", "search_agent_memory", realm_id=REALM, target_kind="entity",
                         target_id="contract-7")) == {fact["record_id"]}
    assert ids(await mcp(env, "agent-1", "reader", "search_agent_memory", realm_id=REALM, query="retry VENDOR")) == {fact["record_id"]}
    compact = (await mcp(env, "agent-1", "reader", "search_agent_memory", realm_id=REALM, tag="vendor"))["records"][0]
    assert "content" not in compact and compact["valid_until"].endswith("Z")

    # Reading: the cited passage's date and text only for the author; others see it withheld, without ids.
    seen_by_agent = await mcp(env, "agent-1", "reader", "get_agent_memory", realm_id=REALM, record_id=fact["record_id"])
    assert seen_by_agent["content"] == "Confirmed by the vendor on the call."
    assert seen_by_agent["citations"] == [{"status": "withheld",
                                           "reason": "the cited passages belong to the author's own conversation memory"}]
    seen_by_alice = await mcp(env, "alice", "member", "get_agent_memory", realm_id=REALM, record_id=fact["record_id"])
    cited = seen_by_alice["citations"][0]
    assert cited["status"] == "shown" and cited["session_id"] == session_id and cited["date"].startswith("2026-10-08T10:")
    assert cited["text"] in answer

    # Every change is audited; a retired record leaves search but stays readable.
    changed = alice.patch(f"/memory/{goal['record_id']}", json={"summary": "Move to 2.1 after the fix ships.", "tags": ["plan"]})
    assert changed.status_code == 200 and changed.json()["tags"] == ["plan"]
    assert Person(env, "lead", "owner").delete(f"/memory/{goal['record_id']}", params={"reason": "superseded by the plan"}).status_code == 200
    assert goal["record_id"] not in ids(await mcp(env, "agent-1", "reader", "search_agent_memory", realm_id=REALM))
    audit = alice.get(f"/memory/{goal['record_id']}/audit").json()["events"]
    assert [(e["event"], e["actor"]) for e in audit] == [("created", "alice"), ("updated", "alice"), ("retired", "lead")]
    assert audit[1]["detail"] == {"fields": ["summary", "tags"]} and audit[2]["at"].endswith("Z")
    listed = alice.get("/memory", params={"tag": "vendor"}).json()["records"]
    assert [r["record_id"] for r in listed] == [fact["record_id"]]


async def test_http_refusals_name_the_rule_or_field(mcp_server):
    env = mcp_server
    alice, viewer = Person(env, "alice", "member"), Person(env, "viewer", "reader")
    realm_target = [{"target_kind": "realm", "target_id": REALM}]
    assert httpx.post(f"{recall_url(env)}/realms/{REALM}/memory", json=record()).status_code == 401
    assert httpx.get(f"{recall_url(env)}/realms/{REALM}/memory", headers={"authorization": "Bearer forged"}).status_code == 401
    refused = viewer.post("/memory", json=record(targets=realm_target))
    assert refused.status_code == 403 and refused.json()["error"] == "realm_role"
    other_realm = httpx.get(f"{recall_url(env)}/realms/elsewhere/memory", headers=alice.http.headers)
    assert other_realm.status_code == 403 and other_realm.json()["error"] == "realm_membership"
    for bad, field in [(record(), "targets"), (record(targets=realm_target, memory_type="rumour"), "memory_type"),
                       (record(targets=realm_target, valid_from=iso(1), valid_until=iso(0)), "valid_until"),
                       (record(targets=realm_target, valid_until="2026-13-01"), "valid_until"),
                       (record(targets=realm_target, citations=[{"session_id": "nope", "turn_uuid": "t"}]), "citations"),
                       (record(targets=realm_target, tags=["Not A Tag"]), "tags.0"), ({**record(), "title": ""}, "title")]:
        resp = alice.post("/memory", json=bad)
        assert resp.status_code == 422 and field in resp.json()["detail"], (field, resp.text)
    assert alice.post("/memory", content=b"{not json").status_code == 422
    for missing in ("targets", "title"):  # named as the error, not only in its detail (it was `error: "body"`)
        resp = alice.post("/memory", json={k: v for k, v in record(targets=realm_target).items() if k != missing})
        assert resp.status_code == 422 and resp.json()["error"] == missing, resp.text
    made = alice.post("/memory", json=record(targets=realm_target, valid_until=iso(30))).json()
    for patch, field in [({"summary": made["summary"]}, "fields"),  # the record's own value: an audited no-op
                         ({"valid_from": None, "tags": list(reversed(made["tags"]))}, "fields"),
                         ({"valid_from": iso(60)}, "valid_from")]:  # after valid_until: the field the patch gave
        resp = alice.patch(f"/memory/{made['record_id']}", json=patch)
        assert resp.status_code == 422 and resp.json()["error"] == field, (patch, resp.text)
    assert [e["event"] for e in alice.get(f"/memory/{made['record_id']}/audit").json()["events"]] == ["created"]
    assert alice.get("/memory/no-such-record").status_code == 404
    assert alice.get("/memory", params={"limit": 0}).status_code == 422
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(mint("agent", realms={REALM: "member"}))) as client:
        names = {t.name for t in await client.list_tools()}
    assert {"search_agent_memory", "get_agent_memory"} <= names
    assert not {n for n in names if "agent_memory" in n} - {"search_agent_memory", "get_agent_memory"}, "agents only read"


async def test_a_body_nested_too_deeply_or_too_large_is_4xx_naming_the_body_never_500(mcp_server):
    """A deeply nested body raised RecursionError in the JSON parser (a bare 500), and any size
    was read into memory before validation."""
    alice = Person(mcp_server, "alice", "member")
    nested = alice.post("/memory", content=b"[" * 100_000 + b"]" * 100_000, headers={"content-type": "application/json"})
    assert nested.status_code == 422 and nested.json()["error"] == "body", nested.text
    huge = alice.post("/memory", content=b'{"title": "' + b"a" * (2**20 + 1) + b'"}', headers={"content-type": "application/json"})
    assert huge.status_code == 413 and huge.json()["error"] == "body_size", huge.text
    assert alice.post("/memory", json=record(targets=[{"target_kind": "realm", "target_id": REALM}])).status_code == 201


async def test_a_body_in_another_encoding_or_with_a_huge_integer_is_refused_saying_so(mcp_server):
    """These read "the request body must be a JSON object" (UTF-16 and a BOM were even taken:
    json.loads guesses encodings), which sent the caller hunting in a valid object."""
    import codecs

    alice = Person(mcp_server, "alice", "member")
    body = json.dumps(record(targets=[{"target_kind": "realm", "target_id": REALM}]))
    json_type = {"content-type": "application/json"}
    for raw, said in [(body.encode("utf-16"), "UTF-16LE"), (codecs.BOM_UTF8 + body.encode(), "byte order mark")]:
        resp = alice.post("/memory", content=raw, headers=json_type)
        assert resp.status_code == 415 and resp.json()["error"] == "body_encoding" and said in resp.json()["detail"], resp.text
    gzipped = alice.post("/memory", content=gzip.compress(body.encode()), headers={**json_type, "content-encoding": "gzip"})
    assert gzipped.status_code == 415 and gzipped.json()["error"] == "body_encoding", gzipped.text
    assert "Content-Encoding 'gzip' is not accepted" in gzipped.json()["detail"]
    huge = alice.post("/memory", content=body[:-1].encode() + b', "n": ' + b"9" * 5000 + b"}", headers=json_type)
    assert huge.status_code == 422 and "5,000 digits" in huge.json()["detail"], huge.text
    assert "set_int_max_str_digits" not in huge.text
    assert alice.post("/memory", content=body.encode(), headers=json_type).status_code == 201


def test_operators_write_with_the_recall_memory_cli(tmp_path, service_env, artifacts_db_url):
    env = {**service_env, "RECALL_ARTIFACTS_DB_URL": artifacts_db_url}
    (tmp_path / "rec.json").write_text(json.dumps(record(targets=[{"target_kind": "realm", "target_id": REALM}])))

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "recall"), "memory", *args], env=env, capture_output=True, text=True, timeout=120)

    added = cli("add", "--realm", REALM, "--as", "ops-jane", "--file", str(tmp_path / "rec.json"))
    assert added.returncode == 0, added.stderr
    rid = json.loads(added.stdout)["record_id"]
    assert [r["record_id"] for r in json.loads(cli("list", "--realm", REALM, "--tag", "vendor").stdout)] == [rid]
    assert cli("retire", "--realm", REALM, "--as", "ops-jane", rid, "--reason", "wrong").returncode == 0
    assert [(e["event"], e["actor"]) for e in json.loads(cli("audit", "--realm", REALM, rid).stdout)] == \
        [("created", "operator:ops-jane"), ("retired", "operator:ops-jane")]
    (tmp_path / "bad.json").write_text(json.dumps(record(memory_type="rumour")))
    bad = cli("add", "--realm", REALM, "--as", "ops-jane", "--file", str(tmp_path / "bad.json"))
    assert bad.returncode == 2 and "memory_type" in bad.stderr
