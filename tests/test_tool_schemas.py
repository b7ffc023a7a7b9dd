"""Tools an agent can use from their schemas alone (issue 14, section 4): read over a real MCP
client with real tokens from a running recall service."""

from __future__ import annotations

import re

import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from fastmcp.exceptions import ToolError

from tests.conftest import mint, recall_url

REALM = "acme-integrations"
# Parameters whose values are a closed set: each must be a JSON-schema enum wherever it appears.
CLOSED_SETS = {"artifact_kind", "kind", "write_mode", "role", "target_kind", "memory_type", "reality", "action",
               "status"}
READ_TOOLS = {"get_memory_artifact", "get_memory_artifact_by_path", "search_memory_artifacts", "list_memory_artifact_audit"}
OWNER_TOOLS = {"supersede_memory_artifact"}
RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")


@pytest.fixture
def recall_server(services, service_env, tmp_path):
    services("serve", RECALL_ARTIFACTS_DB_URL=f"sqlite:///{tmp_path / 'artifacts.sqlite3'}")
    return service_env


async def listed(env, token: str) -> dict:
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(token)) as client:
        return {t.name: t for t in await client.list_tools()}


def resolve(schema: dict, defs: dict) -> dict:
    while "$ref" in schema:
        schema = {**defs[schema["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def alternatives(schema: dict, defs: dict) -> list[dict]:
    """The schema itself, or each branch of an optional/union (`anyOf`), resolved."""
    schema = resolve(schema, defs)
    return [resolve(s, defs) for s in schema["anyOf"]] if "anyOf" in schema else [schema]


def schema_defects(where: str, schema: dict, defs: dict, seen: set[str]) -> list[str]:
    """Every property (also inside nested objects and array items) has a description; every
    closed set is an enum (or a const)."""
    defects = []
    for name, prop in resolve(schema, defs).get("properties", {}).items():
        merged = resolve(prop, defs)
        if not merged.get("description"):
            defects.append(f"{where}.{name}: no description")
        branches = [b for b in alternatives(prop, defs) if b.get("type") != "null"]
        if name in CLOSED_SETS and not all("enum" in b or "const" in b for b in branches):
            defects.append(f"{where}.{name}: a closed set that is not an enum")
        for branch in branches:
            for nested in (branch, resolve(branch.get("items", {}), defs)):
                key = nested.get("title", "")
                if nested.get("properties") and key not in seen:
                    seen.add(key)
                    defects += schema_defects(f"{where}.{name}", nested, defs, seen)
    return defects


async def test_a_token_without_realms_sees_recall_my_conversations_alone(recall_server):
    assert set(await listed(recall_server, mint("plain-user"))) == {"recall_my_conversations"}


async def test_tools_are_listed_by_what_the_token_can_use(recall_server):
    reader = set(await listed(recall_server, mint("viewer", realms={REALM: "reader"})))
    member = set(await listed(recall_server, mint("researcher", realms={REALM: "member"})))
    owner = set(await listed(recall_server, mint("lead", realms={REALM: "owner"})))
    assert READ_TOOLS | {"recall_my_conversations"} <= reader
    assert not reader & {"create_memory_artifact_draft", "accept_memory_artifact", *OWNER_TOOLS}
    assert reader < member and "create_memory_artifact_draft" in member and not member & OWNER_TOOLS
    assert member < owner and OWNER_TOOLS <= owner
    async with Client(f"{recall_url(recall_server)}/mcp", auth=BearerAuth(mint("viewer", realms={REALM: "reader"}))) as c:
        with pytest.raises(ToolError, match="Unknown tool"):
            await c.call_tool("create_memory_artifact_draft", {"realm_id": REALM})


async def test_every_parameter_is_described_and_every_closed_set_is_an_enum(recall_server):
    tools = await listed(recall_server, mint("lead", realms={REALM: "owner"}))
    assert len(tools) >= 14
    defects = []
    for name, tool in tools.items():
        assert tool.description, f"{name} has no description"
        schema = tool.input_schema
        defects += schema_defects(name, schema, schema.get("$defs", {}), set())
    assert defects == []


def test_the_schema_check_catches_what_it_is_meant_to_catch():
    """The check above can fail: an undescribed parameter and a free-string closed set are caught."""
    bad = {"properties": {"query": {"type": "string"},
                          "write_mode": {"type": "string", "description": "append or replace"},
                          "targets": {"type": "array", "items": {"$ref": "#/$defs/T"}, "description": "d"}},
           "$defs": {"T": {"title": "T", "properties": {"role": {"type": "string", "description": "d"}}}}}
    assert schema_defects("t", bad, bad["$defs"], set()) == [
        "t.query: no description", "t.write_mode: a closed set that is not an enum", "t.targets.role: a closed set that is not an enum"]


async def test_limits_are_validated_and_times_are_rfc3339(recall_server):
    async with Client(f"{recall_url(recall_server)}/mcp", auth=BearerAuth(mint("lead", realms={REALM: "owner"}))) as c:
        for bad in (0, 101):
            with pytest.raises(ToolError, match="limit"):
                await c.call_tool("search_memory_artifacts", {"realm_id": REALM, "limit": bad})
        made = (await c.call_tool("create_memory_artifact_draft", {
            "realm_id": REALM, "artifact_path": "agents/lead/worklog", "artifact_kind": "worklog", "write_mode": "append",
            "body": "b", "summary": "s", "source_ref": "r", "source_context": {},
            "targets": [{"target_kind": "realm", "target_id": REALM, "role": "primary"}]})).structured_content
        assert RFC3339.fullmatch(made["created_at"]) and RFC3339.fullmatch(made["updated_at"])
        with pytest.raises(ToolError, match="write_mode"):
            await c.call_tool("create_memory_artifact_draft", {
                "realm_id": REALM, "artifact_path": "agents/lead/x", "artifact_kind": "worklog", "write_mode": "overwrite",
                "body": "b", "summary": "s", "source_ref": "r", "source_context": {},
                "targets": [{"target_kind": "realm", "target_id": REALM}]})
        audit = (await c.call_tool("list_memory_artifact_audit", {"realm_id": REALM, "artifact_id": made["artifact_id"]})).structured_content
        assert all(RFC3339.fullmatch(e["at"]) for e in audit["events"])
