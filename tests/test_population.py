"""Seed 004's whole story as one test (issue 14, "done when"): a realm's population is
initialised, agents are admitted, start under their charters, keep a worklog through the
recipe's steps 1–9, hand off to a second agent, and read the people's AgentMemory — through a
real MCP client over HTTP with real tokens, on SQLite and on a real PostgreSQL."""

from __future__ import annotations

import json

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from fastmcp.exceptions import ToolError

from tests.conftest import mint, recall_url

REALM = "acme-integrations"
CONTRACT = [{"target_kind": "entity", "target_id": "contract-7", "role": "primary"}]


@pytest.fixture
def realm_server(services, service_env, artifacts_db_url):
    services("serve", RECALL_ARTIFACTS_DB_URL=artifacts_db_url)
    return service_env


class Session:
    """One MCP session of a principal with a real token (a new Session = a new agent session)."""

    def __init__(self, env, user: str, role: str) -> None:
        self.user = user
        self.client = Client(f"{recall_url(env)}/mcp", auth=BearerAuth(mint(user, realms={REALM: role})))

    async def __aenter__(self) -> "Session":
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.__aexit__(*exc)

    async def __call__(self, tool: str, **args):
        return (await self.client.call_tool(tool, {"realm_id": REALM, **args})).structured_content

    async def refused(self, rule: str, tool: str, **args) -> str:
        with pytest.raises(ToolError, match=rule) as exc:
            await self.client.call_tool(tool, {"realm_id": REALM, **args})
        return str(exc.value)

    async def start(self) -> dict:
        """What an agent does at start (seed 004, population): read the constitution, find itself in
        the registry, check that it may start, load its charter, locate its sources."""
        constitution = json.loads((await self("get_memory_artifact_by_path", artifact_path="population/constitution"))["body"])
        me = (await self("list_population_agents", principal=self.user))["agents"]
        assert len(me) == 1 and me[0]["status"] == "active", f"{self.user} is not registered"
        check = await self("check_population_rules", action="start")
        assert check["allowed"], check["reasons"]
        charter = await self("get_memory_artifact_by_path", artifact_path=me[0]["charter_path"])
        assert charter["artifact_id"] == me[0]["charter_id"]
        return {"constitution": constitution, "me": me[0], "charter": json.loads(charter["body"])}


def draft(path: str, kind: str, mode: str, body: str, targets: list[dict], **extra) -> dict:
    return dict(artifact_path=path, artifact_kind=kind, write_mode=mode, body=body, summary=body[:80],
                source_ref="codex-thread:s-1", source_context={"agent": "codex", "task": "integration-research"},
                targets=targets, **extra)


async def admit(proposer: Session, owner: Session, principal: str, role: str, **extra) -> dict:
    assert (await proposer("check_population_rules", action="admit", principal=principal, agent_role=role))["allowed"]
    proposal = await proposer("propose_agent_admission", principal=principal, agent_role=role, note="needed", **extra)
    assert proposal["status"] == "proposed" and proposal["artifact_kind"] == "agent_registry"
    return await owner("accept_memory_artifact", artifact_id=proposal["artifact_id"])


async def test_seed_004_whole_story(realm_server):
    env = realm_server
    async with Session(env, "lead", "owner") as lead, Session(env, "coordinator", "member") as coordinator:
        # Population: the owner initialises it (once); base roles, their charters, an empty registry.
        made = await lead("init_population")
        assert {c["artifact_path"] for c in made["created"]} == {
            "population/constitution", "population/registry", "population/charters/researcher", "population/charters/reviewer"}
        await lead.refused("population: realm 'acme-integrations' already has a constitution", "init_population")
        assert (await coordinator("list_population_agents"))["agents"] == []

        # Admission is a proposal an owner accepts; until then the agent may not start.
        assert not (await coordinator("check_population_rules", action="start", principal="integration-researcher"))["allowed"]
        proposal = await coordinator("propose_agent_admission", principal="integration-researcher", agent_role="researcher",
                                     note="researches contract 7")
        await coordinator.refused("realm_role: the agent_registry", "accept_memory_artifact", artifact_id=proposal["artifact_id"])
        stale = await coordinator("propose_agent_admission", principal="review-bot", agent_role="reviewer", note="reviews")
        await lead("accept_memory_artifact", artifact_id=proposal["artifact_id"])
        # The rival admission can never land now: it left the review queue, saying why.
        await lead.refused(r"lifecycle: .* revoked \(overtaken: ", "accept_memory_artifact", artifact_id=stale["artifact_id"])
        await admit(coordinator, lead, "review-bot", "reviewer")
        refusal = await coordinator.refused("admission", "propose_agent_admission", principal="review-bot", agent_role="reviewer")
        assert "already in the registry" in refusal
        assert "constitution's roles" in await coordinator.refused("admission", "propose_agent_admission",
                                                                    principal="x-bot", agent_role="wizard")
        # Step 2: the anchor object exists in the realm.
        await lead("register_realm_entity", entity_id="contract-7", title="Integration contract")

    # Step 1 + population: the researcher connects with its own token and starts under its charter.
    async with Session(env, "integration-researcher", "member") as researcher, Session(env, "review-bot", "member") as reviewer:
        state = await researcher.start()
        assert state["me"]["role"] == "researcher" and state["constitution"]["separate_author_and_reviewer"] is True
        assert "Append to your worklog after each step" in " ".join(state["charter"]["duties"])
        sources = {s["artifact_path"]: s for s in state["me"]["sources"]}
        worklog_path = "agents/integration-researcher/worklog"
        assert sources[worklog_path]["artifact_id"] is None, "nothing to restore yet"
        assert (await researcher("check_population_rules", action="create_draft", artifact_kind="worklog"))["allowed"]
        assert not (await researcher("check_population_rules", action="accept"))["allowed"]
        assert not (await reviewer("check_population_rules", action="create_draft", artifact_kind="decision"))["allowed"]

        # Steps 3-5: a worklog draft, re-read, submitted; the author may not accept it, the reviewer does.
        wl = await researcher("create_memory_artifact_draft", **draft(
            worklog_path, "worklog", "append", "Studied the contract structure and error handling. Found a version mismatch.", CONTRACT))
        assert (await researcher("get_memory_artifact", artifact_id=wl["artifact_id"]))["targets"] == CONTRACT
        await researcher("submit_memory_artifact", artifact_id=wl["artifact_id"])
        await researcher.refused("constitution: role researcher may .*, not accept", "accept_memory_artifact",
                                 artifact_id=wl["artifact_id"])
        assert (await reviewer("accept_memory_artifact", artifact_id=wl["artifact_id"]))["status"] == "accepted"
        # The constitution binds registered agents in real operations too, not only in the dry run.
        await reviewer.refused("constitution: role reviewer may write .*, not decision", "create_memory_artifact_draft",
                               **draft("decisions/contract-7/other", "decision", "replace", "d", CONTRACT))
        protocol = await reviewer("create_memory_artifact_draft", **draft(
            "reviews/contract-7/worklog", "review_protocol", "replace", "Checked targets and sources of the worklog.", CONTRACT))
        await reviewer("submit_memory_artifact", artifact_id=protocol["artifact_id"])
        await reviewer.refused("separation_of_duties", "accept_memory_artifact", artifact_id=protocol["artifact_id"])

    # A new session of the researcher restores its state from its charter's sources and goes on (step 6).
    async with Session(env, "integration-researcher", "member") as researcher, Session(env, "review-bot", "member") as reviewer:
        state = await researcher.start()
        sources = {s["artifact_path"]: s for s in state["me"]["sources"]}
        assert sources[worklog_path]["artifact_id"] == wl["artifact_id"]
        restored = await researcher("get_memory_artifact_by_path", artifact_path=worklog_path)
        assert restored["body"].startswith("Studied the contract")
        await researcher("append_memory_artifact", artifact_id=wl["artifact_id"],
                         body="Checked backward compatibility: 2.1 breaks handling of the retry field.",
                         source_ref="codex-thread:s-2", source_context={"task": "integration-follow-up"})

        # Step 9: a decision, replaced by a reviewed new version that names it; a stray draft is refused.
        dec_path = "decisions/contract-7/version"
        v1 = await researcher("create_memory_artifact_draft", **draft(dec_path, "decision", "replace", "Decision: stay on 2.0.", CONTRACT))
        await researcher("submit_memory_artifact", artifact_id=v1["artifact_id"])
        await reviewer("accept_memory_artifact", artifact_id=v1["artifact_id"])
        await researcher.refused(f"path has accepted version {v1['artifact_id']}; draft must supersede it",
                                 "create_memory_artifact_draft", **draft(dec_path, "decision", "replace", "Move to 2.1.", CONTRACT))
        current = await researcher("get_memory_artifact_by_path", artifact_path=dec_path)
        v2 = await researcher("create_memory_artifact_draft", **draft(
            dec_path, "decision", "replace", "Decision: move to 2.1 once the retry fix ships.", CONTRACT,
            supersedes_artifact_id=current["artifact_id"]))
        await researcher("submit_memory_artifact", artifact_id=v2["artifact_id"])
        await reviewer("accept_memory_artifact", artifact_id=v2["artifact_id"])
        assert (await researcher("get_memory_artifact", artifact_id=v1["artifact_id"]))["superseded_by_artifact_id"] == v2["artifact_id"]

        # Step 7: the handoff at the charter's handoff path, anchored as handoff_target.
        handoff_path = state["me"]["handoff_path"]
        ho = await researcher("create_memory_artifact_draft", **draft(
            handoff_path, "handoff", "replace",
            "Done: contract mapped, decision v2 accepted. Open: retry field semantics in 2.1. Next: confirm with the vendor.",
            [{"target_kind": "entity", "target_id": "contract-7", "role": "handoff_target"}]))
        own = await researcher("get_own_memory_artifact_draft_by_path", artifact_path=handoff_path, agent_principal="integration-researcher")
        assert own["artifact_id"] == ho["artifact_id"]
        await researcher("submit_memory_artifact", artifact_id=ho["artifact_id"])
        await reviewer("accept_memory_artifact", artifact_id=ho["artifact_id"])

    # The people's compact memory about the contract, written over HTTP.
    people = httpx.post(f"{recall_url(env)}/realms/{REALM}/memory", timeout=30,
                        headers={"authorization": f"Bearer {mint('lead', realms={REALM: 'owner'})}"},
                        json={"memory_type": "decision", "reality": "decision", "title": "Contract 7 moves to 2.1",
                              "summary": "Approved by the architecture board.", "content": "Board minutes 2026-11-20.",
                              "targets": CONTRACT, "tags": ["contract-7"]})
    assert people.status_code == 201, people.text

    # Handoff to a second agent, admitted to take over; it starts from the first one's handoff (step 8).
    async with Session(env, "lead", "owner") as lead, Session(env, "coordinator", "member") as coordinator:
        await admit(coordinator, lead, "integration-researcher-2", "researcher", takes_over_from="integration-researcher")
    async with Session(env, "integration-researcher-2", "member") as second, Session(env, "review-bot", "member") as reviewer:
        state = await second.start()
        inherited = {s["artifact_path"]: s for s in state["me"]["sources"] if s["of"] == "integration-researcher"}
        assert inherited[handoff_path]["artifact_id"] == ho["artifact_id"]
        handoff = await second("get_memory_artifact", artifact_id=inherited[handoff_path]["artifact_id"])
        assert "Next: confirm with the vendor" in handoff["body"]
        found = (await second("search_memory_artifacts", target_kind="entity", target_id="contract-7", query="retry field"))["artifacts"]
        assert {wl["artifact_id"], ho["artifact_id"], v2["artifact_id"]} <= {a["artifact_id"] for a in found}
        assert v1["artifact_id"] not in {a["artifact_id"] for a in found} and all("body" not in a for a in found)
        facts = (await second("search_agent_memory", target_kind="entity", target_id="contract-7", reality="decision"))["records"]
        assert [f["title"] for f in facts] == ["Contract 7 moves to 2.1"]
        await second("append_memory_artifact", artifact_id=inherited[worklog_path]["artifact_id"],
                     body="Took over from integration-researcher: vendor confirmed the retry fix.",
                     source_ref="codex-thread:s-3", source_context={"task": "integration-handover"})
        by_path = await reviewer("get_memory_artifact_by_path", artifact_path=worklog_path)
        assert [(e["author"], e["body"][:10]) for e in by_path["entries"]] == [
            ("integration-researcher", "Checked ba"), ("integration-researcher-2", "Took over ")]

        # Step 9's shortcut: an owner replaces the accepted decision directly (no review, audited).
    async with Session(env, "lead", "owner") as lead:
        v3 = await lead("supersede_memory_artifact", artifact_id=v2["artifact_id"], body="Decision: move to 2.1 now.",
                        summary="Move to 2.1 now", source_ref="meeting:2026-11-20", source_context={"who": "lead"})
        assert v3["supersedes_artifact_id"] == v2["artifact_id"] and v3["status"] == "accepted"
        assert [e["event"] for e in (await lead("list_memory_artifact_audit", artifact_id=v2["artifact_id"]))["events"]] == \
            ["created", "submitted", "accepted", "superseded"]
    async with Session(env, "integration-researcher-2", "member") as second:
        # The registry's history is reviewed memory too: every admission is a version, audited.
        registry = await second("get_memory_artifact_by_path", artifact_path="population/registry")
        assert [a["principal"] for a in json.loads(registry["body"])["agents"]] == [
            "integration-researcher", "review-bot", "integration-researcher-2"]
        audit = (await second("list_memory_artifact_audit", artifact_id=registry["artifact_id"]))["events"]
        assert [(e["event"], e["actor"]) for e in audit] == [("created", "coordinator"), ("submitted", "coordinator"),
                                                             ("accepted", "lead")]
