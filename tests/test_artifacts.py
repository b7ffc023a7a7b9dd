"""Memory artifacts (seed 004) through a real MCP client with real tokens, on SQLite and on a
real PostgreSQL server."""

from __future__ import annotations


import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from fastmcp.exceptions import ToolError

from services.recall.artifacts.artifact_store import ArtifactStore
from tests.conftest import call_recall, indexed_chunks, mint, post_conversation, recall_url, wait_until

REALM = "acme-integrations"


def token(user: str, role: str, also: dict[str, str] | None = None) -> str:
    return mint(user, realms={REALM: role, **(also or {})})


class Agent:
    def __init__(self, env, user: str, role: str, also: dict[str, str] | None = None) -> None:
        self.client = Client(f"{recall_url(env)}/mcp", auth=BearerAuth(token(user, role, also)))

    async def __aenter__(self) -> "Agent":
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.__aexit__(*exc)

    async def __call__(self, tool: str, **args):
        return (await self.client.call_tool(tool, args)).structured_content

    async def refused(self, rule: str, tool: str, **args) -> None:
        with pytest.raises(ToolError, match=rule):
            await self.client.call_tool(tool, args)


def artifact_index_texts(env, realm_id: str) -> list[str]:
    """Every chunk text of the realm's artifact index, read straight from its store."""
    import hashlib
    import sqlite3
    from pathlib import Path

    db = Path(env["RECALL_DATA_DIR"]) / ".artifacts" / hashlib.sha256(realm_id.encode()).hexdigest()[:24] / "memory" / "chunks.sqlite3"
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT text FROM chunks")]
    finally:
        conn.close()


def draft_args(path: str, kind: str, mode: str, body: str, targets: list[dict], **extra) -> dict:
    return dict(realm_id=REALM, artifact_path=path, artifact_kind=kind, write_mode=mode, body=body,
                summary=body[:60], source_ref="codex-thread:t-1", source_context={"agent": "codex", "task": "integration-research"},
                targets=targets, **extra)


async def test_seed_004_recipe_end_to_end(mcp_server):
    env = mcp_server
    contract = [{"target_kind": "entity", "target_id": "contract-7", "role": "primary"}]
    async with Agent(env, "researcher", "member") as researcher, Agent(env, "lead", "owner") as lead, \
            Agent(env, "reviewer", "member") as reviewer, Agent(env, "viewer", "reader") as viewer:
        await researcher("register_realm_entity", realm_id=REALM, entity_id="contract-7", title="Integration contract")

        # Step 4-5: a worklog draft, read back, submitted, accepted.
        wl = await researcher("create_memory_artifact_draft", **draft_args(
            "agents/integration-researcher/worklog", "worklog", "append",
            "Studied the contract structure and error handling. Found a version mismatch between 2.0 and 2.1.", contract))
        assert wl["status"] == "draft" and wl["author"] == "researcher"
        assert (await researcher("get_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"]))["body"].startswith("Studied")
        await reviewer.refused("draft_privacy", "get_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"])
        own = await researcher("get_own_memory_artifact_draft_by_path", realm_id=REALM,
                               artifact_path="agents/integration-researcher/worklog", agent_principal="researcher")
        assert own["artifact_id"] == wl["artifact_id"]
        assert (await lead("search_memory_artifacts", realm_id=REALM, query="version mismatch"))["artifacts"] == []
        await researcher("submit_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"])
        accepted = await lead("accept_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"])
        assert accepted["status"] == "accepted"

        # Step 6: the journal goes on; realm members append once it is accepted.
        await reviewer("append_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"],
                       body="Checked backward compatibility: 2.1 breaks handling of the retry field.",
                       source_ref="codex-thread:t-2", source_context={"task": "integration-follow-up"})
        await viewer.refused("Unknown tool", "append_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"],
                             body="x", source_ref="r", source_context={})

        # Step 7: a handoff anchored with the handoff_target role.
        ho = await researcher("create_memory_artifact_draft", **draft_args(
            "agents/integration-researcher/handoff", "handoff", "replace",
            "Done: contract mapped. Open: retry field semantics in 2.1. Next: confirm with the vendor.",
            [{"target_kind": "entity", "target_id": "contract-7", "role": "handoff_target"}]))
        await researcher("submit_memory_artifact", realm_id=REALM, artifact_id=ho["artifact_id"])
        await reviewer("accept_memory_artifact", realm_id=REALM, artifact_id=ho["artifact_id"])

        # Step 8: a new session finds memory by path and by object.
        by_path = await viewer("get_memory_artifact_by_path", realm_id=REALM, artifact_path="agents/integration-researcher/worklog")
        assert [e["body"][:7] for e in by_path["entries"]] == ["Checked"]
        found = (await viewer("search_memory_artifacts", realm_id=REALM, target_kind="entity", target_id="contract-7",
                              query="retry field compatibility"))["artifacts"]
        assert {a["artifact_id"] for a in found} == {wl["artifact_id"], ho["artifact_id"]}
        assert all("body" not in a for a in found), "search is a compact list"
        only_handoffs = (await viewer("search_memory_artifacts", realm_id=REALM, kind="handoff"))["artifacts"]
        assert [a["artifact_id"] for a in only_handoffs] == [ho["artifact_id"]]

        # Step 9: a decision replaced by a new version, then superseded directly by the owner.
        v1 = await researcher("create_memory_artifact_draft", **draft_args(
            "decisions/contract-7/version", "decision", "replace", "Decision: stay on contract version 2.0.", contract))
        await researcher("submit_memory_artifact", realm_id=REALM, artifact_id=v1["artifact_id"])
        await lead("accept_memory_artifact", realm_id=REALM, artifact_id=v1["artifact_id"])
        v2 = await researcher("create_memory_artifact_draft", **draft_args(
            "decisions/contract-7/version", "decision", "replace", "Decision: move to 2.1 once the retry fix ships.",
            contract, supersedes_artifact_id=v1["artifact_id"]))
        await researcher("submit_memory_artifact", realm_id=REALM, artifact_id=v2["artifact_id"])
        await lead("accept_memory_artifact", realm_id=REALM, artifact_id=v2["artifact_id"])
        assert (await viewer("get_memory_artifact", realm_id=REALM, artifact_id=v1["artifact_id"]))["status"] == "superseded"
        current = await viewer("get_memory_artifact_by_path", realm_id=REALM, artifact_path="decisions/contract-7/version")
        assert current["artifact_id"] == v2["artifact_id"]
        await researcher.refused("Unknown tool", "supersede_memory_artifact", realm_id=REALM, artifact_id=v2["artifact_id"],
                                 body="b", summary="s", source_ref="r", source_context={})
        v3 = await lead("supersede_memory_artifact", realm_id=REALM, artifact_id=v2["artifact_id"],
                        body="Decision: move to 2.1 now; the vendor shipped the fix.", summary="Move to 2.1",
                        source_ref="meeting:2026-11-20", source_context={"who": "lead"})
        assert v3["status"] == "accepted" and v3["supersedes_artifact_id"] == v2["artifact_id"]
        hits = (await viewer("search_memory_artifacts", realm_id=REALM, query="contract version decision"))["artifacts"]
        assert v3["artifact_id"] in {a["artifact_id"] for a in hits}
        assert not {v1["artifact_id"], v2["artifact_id"]} & {a["artifact_id"] for a in hits}, "superseded ones leave search"

        audit = (await viewer("list_memory_artifact_audit", realm_id=REALM, artifact_id=v2["artifact_id"]))["events"]
        assert [(e["event"], e["actor"]) for e in audit] == [
            ("created", "researcher"), ("submitted", "researcher"), ("accepted", "lead"), ("superseded", "lead")]
        assert [e["event"] for e in (await viewer("list_memory_artifact_audit", realm_id=REALM,
                                                  artifact_id=wl["artifact_id"]))["events"]] == \
            ["created", "submitted", "accepted", "appended"]


async def test_every_refusal_names_its_rule(mcp_server):
    env = mcp_server
    realm_target = [{"target_kind": "realm", "target_id": REALM, "role": "primary"}]
    async with Agent(env, "researcher", "member") as researcher, Agent(env, "other", "member", also={"side-project": "owner"}) as other, \
            Agent(env, "lead", "owner") as lead, Agent(env, "viewer", "reader", also={"side-project": "member"}) as viewer:
        # The viewer reads this realm and writes in another one: it sees the write tools, and this realm refuses them.
        await researcher.refused("write_mode", "create_memory_artifact_draft",
                                 **draft_args("agents/a/worklog", "worklog", "replace", "body", realm_target))
        await researcher.refused("write_mode", "create_memory_artifact_draft",
                                 **draft_args("agents/a/decision", "decision", "append", "body", realm_target))
        await researcher.refused("artifact_kind", "create_memory_artifact_draft",
                                 **draft_args("agents/a/x", "diary", "append", "body", realm_target))
        await researcher.refused("targets", "create_memory_artifact_draft", **draft_args(
            "agents/a/worklog", "worklog", "append", "body", [{"target_kind": "entity", "target_id": "no-such", "role": "primary"}]))
        await researcher.refused("targets", "create_memory_artifact_draft", **draft_args(
            "agents/a/worklog", "worklog", "append", "body", [{"target_kind": "realm", "target_id": "other-realm", "role": "primary"}]))
        await researcher.refused("targets", "create_memory_artifact_draft", **draft_args(
            "agents/a/worklog", "worklog", "append", "body", [{"target_kind": "conversation", "target_id": "not-mine", "role": "evidence"}]))
        await researcher.refused("artifact_path", "create_memory_artifact_draft",
                                 **draft_args("../../etc/passwd", "worklog", "append", "body", realm_target))
        await researcher.refused("realm_membership", "create_memory_artifact_draft",
                                 **{**draft_args("agents/a/worklog", "worklog", "append", "body", realm_target), "realm_id": "foreign"})
        await researcher.refused("realm_membership", "search_memory_artifacts", realm_id="foreign")
        await researcher.refused("agent_principal", "create_memory_artifact_draft",
                                 **draft_args("agents/a/worklog", "worklog", "append", "body", realm_target, agent_principal="lead"))
        await researcher.refused("agent_principal", "get_own_memory_artifact_draft_by_path", realm_id=REALM,
                                 artifact_path="agents/a/worklog", agent_principal="lead")
        await viewer.refused("realm_role", "create_memory_artifact_draft",
                             **draft_args("agents/v/worklog", "worklog", "append", "body", realm_target))

        wl = await researcher("create_memory_artifact_draft", **draft_args("agents/a/worklog", "worklog", "append", "body", realm_target))
        await other.refused("draft_privacy", "update_memory_artifact_draft", realm_id=REALM, artifact_id=wl["artifact_id"], body="x")
        await lead.refused("draft_privacy", "append_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"],
                           body="x", source_ref="r", source_context={})
        await researcher.refused("lifecycle", "accept_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"])
        await researcher("submit_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"])
        await other.refused("lifecycle", "append_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"],
                            body="x", source_ref="r", source_context={})  # a proposal under review takes no entries
        await researcher.refused("lifecycle", "update_memory_artifact_draft", realm_id=REALM, artifact_id=wl["artifact_id"], body="x")
        await viewer.refused("realm_role", "accept_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"])
        await lead("accept_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"])
        await other.refused("realm_role", "revoke_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"])
        await other.refused("realm_role", "supersede_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"],
                            body="b", summary="s", source_ref="r", source_context={})
        # A journal is continued, never replaced; an owner revokes it to start a new one.
        await lead.refused("journal", "supersede_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"], body="v2",
                           summary="v2", source_ref="r", source_context={})
        await lead("revoke_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"], reason="a new journal")
        await researcher.refused("lifecycle", "append_memory_artifact", realm_id=REALM, artifact_id=wl["artifact_id"],
                                 body="too late", source_ref="r", source_context={})
        dec = await researcher("create_memory_artifact_draft", **draft_args("agents/a/decision", "decision", "replace", "d", realm_target))
        await researcher.refused("write_mode", "append_memory_artifact", realm_id=REALM, artifact_id=dec["artifact_id"],
                                 body="x", source_ref="r", source_context={})
        revoked = await researcher("revoke_memory_artifact", realm_id=REALM, artifact_id=dec["artifact_id"], reason="wrong path")
        assert revoked["status"] == "revoked"
        await researcher.refused("lifecycle", "submit_memory_artifact", realm_id=REALM, artifact_id=dec["artifact_id"])


async def test_conversation_targets_link_to_the_callers_own_recall_memory(mcp_server):
    env = mcp_server
    post_conversation(env, "researcher", "conv-77", ["The vendor confirmed the retry fix for contract 7.", "noted"])
    post_conversation(env, "someone-else", "conv-88", ["private chat"])
    assert wait_until(lambda: indexed_chunks(env, "researcher") == 2 and indexed_chunks(env, "someone-else") == 1, 30)
    async with Agent(env, "researcher", "member") as researcher:
        made = await researcher("create_memory_artifact_draft", **draft_args(
            "agents/r/dossier", "dossier", "replace", "Vendor confirmation of the retry fix (see the conversation).",
            [{"target_kind": "conversation", "target_id": "conv-77", "role": "evidence"}]))
        assert made["targets"][0]["target_id"] == "conv-77"
        await researcher.refused("targets", "create_memory_artifact_draft", **draft_args(
            "agents/r/dossier", "dossier", "replace", "b", [{"target_kind": "conversation", "target_id": "conv-88", "role": "evidence"}]))


async def test_conversation_recall_and_artifact_search_never_mix(mcp_server):
    env = mcp_server
    post_conversation(env, "researcher", "chat-1", ["Chat only: the PELICAN-9 rollout slipped a week.", "ok"])
    assert wait_until(lambda: indexed_chunks(env, "researcher") == 2, 30)
    async with Agent(env, "researcher", "member") as researcher, Agent(env, "lead", "owner") as lead:
        art = await researcher("create_memory_artifact_draft", **draft_args(
            "agents/r/worklog", "worklog", "append", "Artifact only: the OSPREY-4 migration plan is ready.",
            [{"target_kind": "realm", "target_id": REALM, "role": "primary"}]))
        await researcher("submit_memory_artifact", realm_id=REALM, artifact_id=art["artifact_id"])
        await lead("accept_memory_artifact", realm_id=REALM, artifact_id=art["artifact_id"])
        assert (await researcher("search_memory_artifacts", realm_id=REALM, query="OSPREY-4 migration"))["artifacts"]
        found = (await researcher("search_memory_artifacts", realm_id=REALM, query="PELICAN-9 rollout slipped"))["artifacts"]
        assert {a["artifact_id"] for a in found} <= {art["artifact_id"]}, "only artifacts, never the chat"
    texts = artifact_index_texts(env, REALM)
    assert any("OSPREY-4" in t for t in texts), "the artifact is in the realm's index"
    assert not any("PELICAN-9" in t for t in texts), "the chat never enters the realm's index"
    out = await call_recall(env, token("researcher", "member"), "OSPREY-4 migration plan")
    assert "OSPREY" not in out
    assert "PELICAN-9" in await call_recall(env, token("researcher", "member"), "PELICAN-9 rollout")


def test_the_database_itself_refuses_a_second_accepted_version(artifacts_db_url):
    from services.recall.artifacts.artifact_store import Conflict

    store = ArtifactStore(artifacts_db_url)
    with store.transaction() as tx:
        for i in range(2):
            tx.q("INSERT INTO artifacts (artifact_id, realm_id, artifact_path, artifact_kind, write_mode, status, body, summary,"
                 " source_ref, source_context, author, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (f"a{i}", REALM, "p", "decision", "replace", "draft", "b", "s", "r", "{}", "x", 0.0, 0.0))
    with store.transaction() as tx:
        tx.q("UPDATE artifacts SET status = 'accepted' WHERE artifact_id = 'a0'")
    with pytest.raises(Conflict):
        with store.transaction() as tx:
            tx.q("UPDATE artifacts SET status = 'accepted' WHERE artifact_id = 'a1'")
