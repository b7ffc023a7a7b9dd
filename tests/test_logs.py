"""Logs are JSON without colour codes, carry hashed user ids, and never message or query text (unless debugging)."""

from __future__ import annotations

import json

import pytest

from shared.tenant_paths import user_hash
from tests.conftest import call_recall, indexed_chunks, mint, post_conversation, recall_url, wait_until

USER = "ursula@example.com"


async def test_logs_carry_hashed_users_and_no_text(services, service_env):
    ingest, indexer = services("ingest"), services("indexer")
    recall = services("serve")
    post_conversation(service_env, USER, "c1", ["The SECRETWORD-ALPHA plan is confidential.", "ok"])
    assert wait_until(lambda: indexed_chunks(service_env, USER) == 2, 30)
    assert "SECRETWORD-ALPHA" in await call_recall(service_env, mint(USER), "QUERYWORD-BETA SECRETWORD-ALPHA")
    logs = ingest.output() + indexer.output() + recall.output()
    assert "SECRETWORD" not in logs and "QUERYWORD" not in logs and USER not in logs
    events = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    assert any(e.get("event") == "recall" and e.get("user_hash") == user_hash(USER) for e in events)
    assert any(e.get("event") == "ingest.accepted" and e.get("user_hash") == user_hash(USER) for e in events)


async def test_debug_mode_adds_the_query_to_recall_logs(services, service_env):
    recall = services("serve", RECALL_DEBUG="true")
    await call_recall(service_env, mint(USER), "QUERYWORD-GAMMA")
    assert "QUERYWORD-GAMMA" in recall.output()


def test_json_logs_carry_no_ansi_colour_codes(services):
    ingest = services("ingest")
    lines = [line for line in ingest.output().splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]  # every line is one JSON object
    assert any(e.get("event", "").startswith("Uvicorn running on") for e in events), "uvicorn's own lines are there"
    assert all("color_message" not in e for e in events)
    assert not any("\x1b" in line or "\\u001b" in line for line in lines), lines


async def test_refused_realm_calls_write_no_error_lines(services, service_env):
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth
    from fastmcp.exceptions import ToolError

    recall = services("serve")
    token = mint("reader-1", realms={"plant-7": "reader"})
    async with Client(f"{recall_url(service_env)}/mcp", auth=BearerAuth(token)) as client:
        for tool, args in [("get_memory_artifact", {"realm_id": "plant-7", "artifact_id": "f" * 32}),
                           ("get_memory_artifact", {"realm_id": "elsewhere", "artifact_id": "f" * 32}),
                           ("search_memory_artifacts", {"realm_id": "plant-7", "limit": 0})]:
            with pytest.raises(ToolError):
                await client.call_tool(tool, args)
    events = [json.loads(line) for line in recall.output().splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("level") in ("error", "critical")], "a refusal is routine: alerts see faults only"
