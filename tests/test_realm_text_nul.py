"""A NUL character (U+0000) in what an agent or a person sends to the realm surface: PostgreSQL
text cannot hold it, so on PostgreSQL every such call was an unnamed 'Error calling tool' (MCP)
or a bare 500 (HTTP) with an error log, while SQLite stored it. Now both databases refuse it
the same way, naming the field. Real service, real tokens, real MCP client and HTTP."""

from __future__ import annotations

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from fastmcp.exceptions import ToolError

from tests.conftest import mint, recall_url

REALM = "acme-integrations"
REALM_TARGET = [{"target_kind": "realm", "target_id": REALM}]


def draft(**overrides) -> dict:
    return {"realm_id": REALM, "artifact_path": "decisions/retry", "artifact_kind": "decision", "write_mode": "replace",
            "body": "Retry twice.", "summary": "Retry policy.", "source_ref": "task:7", "source_context": {},
            "targets": REALM_TARGET, **overrides}


def record(**overrides) -> dict:
    return {"memory_type": "fact", "title": "Contract 7 uses retry semantics of 2.1", "summary": "The vendor's 2.1.",
            "content": "Confirmed on the call.", "reality": "current_state", "targets": REALM_TARGET, **overrides}


async def test_a_nul_character_in_any_realm_argument_is_refused_naming_the_field_on_both_databases(
        services, service_env, artifacts_db_url):
    serve = services("serve", RECALL_ARTIFACTS_DB_URL=artifacts_db_url)
    env = service_env
    owner = mint("lead", realms={REALM: "owner"})
    calls = [
        ("register_realm_entity", {"realm_id": REALM, "entity_id": "contract\x007", "title": "Contract"}, "entity_id"),
        ("create_memory_artifact_draft", draft(body="Retry\x00 twice."), "body"),
        ("create_memory_artifact_draft", draft(source_context={"agent": {"stage\x00": "x"}}), "source_context.agent"),
        ("create_memory_artifact_draft", draft(targets=[{"target_kind": "entity", "target_id": "c\x00"}]), "targets.0.target_id"),
        ("get_memory_artifact", {"realm_id": REALM, "artifact_id": "\x00"}, "artifact_id"),
        ("search_memory_artifacts", {"realm_id": REALM, "target_id": "contract\x007"}, "target_id"),
        ("search_agent_memory", {"realm_id": REALM, "query": "retry\x00"}, "query"),
        ("get_agent_memory", {"realm_id": REALM, "record_id": "\x00"}, "record_id"),
    ]
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(owner)) as client:
        for tool, args, field in calls:
            with pytest.raises(ToolError, match=rf"^invalid {field}: .*NUL"):
                await client.call_tool(tool, args)
        # Nothing was stored, and the same calls without the NUL work.
        assert (await client.call_tool("search_memory_artifacts", {"realm_id": REALM})).structured_content == \
            {"artifacts": [], "next_offset": None}
        await client.call_tool("register_realm_entity", {"realm_id": REALM, "entity_id": "contract-7", "title": "Contract"})
        await client.call_tool("create_memory_artifact_draft", draft())

    http = httpx.Client(base_url=f"{recall_url(env)}/realms/{REALM}", timeout=30, headers={"authorization": f"Bearer {owner}"})
    for method, path, kwargs, field in [("POST", "/memory", {"json": record(title="Contract\x007")}, "title"),
                                        ("POST", "/memory", {"json": record(tags=["a\x00"])}, "tags.0"),
                                        ("GET", "/memory", {"params": {"q": "retry\x00"}}, "q"),
                                        ("GET", "/memory/%00", {}, "record_id"),
                                        ("DELETE", "/memory/abc", {"params": {"reason": "\x00"}}, "reason")]:
        resp = http.request(method, path, **kwargs)
        assert resp.status_code == 422, (field, resp.status_code, resp.text)
        assert resp.json()["error"] == field and "NUL" in resp.json()["detail"], resp.text
    assert http.get("/memory").json() == {"records": [], "next_offset": None}
    assert http.post("/memory", json=record()).status_code == 201
    assert httpx.get(f"{recall_url(env)}/healthz", timeout=10).status_code == 200
    assert "Error calling tool" not in serve.output() and "Exception in ASGI" not in serve.output()
