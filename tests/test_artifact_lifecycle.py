"""Memory artifact changes that were let through or failed unnamed (review8a), on SQLite and a
real PostgreSQL: every path that writes an artifact checks its fields as creation does, and two
people doing the same thing at once get an answer, never an unnamed error."""

from __future__ import annotations

import concurrent.futures

import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth
from fastmcp.exceptions import ToolError

from services.recall.artifacts.models import Role
from services.recall.artifacts.rules import RuleBroken
from services.recall.artifacts.service import Caller
from services.recall.population.service import PopulationService
from tests.conftest import mint, recall_url

REALM = "acme-integrations"
REALM_TARGET = [{"target_kind": "realm", "target_id": REALM, "role": "primary"}]


@pytest.fixture
def realm_server(services, service_env, artifacts_db_url):
    services("serve", RECALL_ARTIFACTS_DB_URL=artifacts_db_url)
    return service_env


class Agent:
    def __init__(self, env, user: str, role: str) -> None:
        self.client = Client(f"{recall_url(env)}/mcp", auth=BearerAuth(mint(user, realms={REALM: role})))

    async def __aenter__(self) -> "Agent":
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.__aexit__(*exc)

    async def __call__(self, tool: str, **args):
        return (await self.client.call_tool(tool, {"realm_id": REALM, **args})).structured_content

    async def refused(self, field: str, tool: str, **args) -> None:
        with pytest.raises(ToolError, match=field):
            await self.client.call_tool(tool, {"realm_id": REALM, **args})


def draft(path: str, kind: str = "decision", body: str = "Decision: stay on 2.0.") -> dict:
    return dict(artifact_path=path, artifact_kind=kind, write_mode="append" if kind == "worklog" else "replace", body=body,
                summary=body[:60], source_ref="codex-thread:t-1", source_context={"agent": "codex"}, targets=REALM_TARGET)


async def test_every_write_checks_the_fields_creation_checks(realm_server):
    """update_memory_artifact_draft took an empty body or a 5,000-character summary, an update
    changing nothing was audited as `updated`, and supersede_memory_artifact and
    append_memory_artifact took an empty summary or source_ref (the seed makes them required)."""
    async with Agent(realm_server, "researcher", "member") as researcher, Agent(realm_server, "lead", "owner") as lead:
        d = await researcher("create_memory_artifact_draft", **draft("decisions/contract-7/version"))
        aid = d["artifact_id"]
        await researcher.refused("body", "update_memory_artifact_draft", artifact_id=aid, body="")
        await researcher.refused("summary", "update_memory_artifact_draft", artifact_id=aid, summary="s" * 5000)
        await researcher.refused("source_ref", "update_memory_artifact_draft", artifact_id=aid, source_ref="")
        await researcher.refused("fields: nothing to change", "update_memory_artifact_draft", artifact_id=aid)
        # The draft's own values again (targets in another order): nothing changes, nothing is audited.
        same = draft("decisions/contract-7/version")
        await researcher.refused("fields: nothing to change", "update_memory_artifact_draft", artifact_id=aid,
                                 body=same["body"], summary=same["summary"], source_ref=same["source_ref"],
                                 source_context=same["source_context"], targets=list(reversed(REALM_TARGET)))
        assert [e["event"] for e in (await researcher("list_memory_artifact_audit", artifact_id=aid))["events"]] == ["created"]
        assert (await researcher("get_memory_artifact", artifact_id=aid))["body"] == "Decision: stay on 2.0."

        await researcher("submit_memory_artifact", artifact_id=aid)
        await lead("accept_memory_artifact", artifact_id=aid)
        await lead.refused("summary", "supersede_memory_artifact", artifact_id=aid, body="v2", summary="",
                           source_ref="r", source_context={})
        await lead.refused("source_ref", "supersede_memory_artifact", artifact_id=aid, body="v2", summary="v2",
                           source_ref="", source_context={})
        await lead.refused("body", "supersede_memory_artifact", artifact_id=aid, body="", summary="v2",
                           source_ref="r", source_context={})
        assert (await lead("get_memory_artifact", artifact_id=aid))["status"] == "accepted"

        wl = await researcher("create_memory_artifact_draft", **draft("agents/researcher/worklog", "worklog", "Started."))
        await researcher.refused("source_ref", "append_memory_artifact", artifact_id=wl["artifact_id"], body="more",
                                 source_ref="", source_context={})
        for blank in ("  ", "\n\t ", "\u00a0\u2003"):  # a whitespace entry was stored
            await researcher.refused("body", "append_memory_artifact", artifact_id=wl["artifact_id"], body=blank,
                                     source_ref="r", source_context={})
        assert (await researcher("get_memory_artifact", artifact_id=wl["artifact_id"]))["entries"] == []
        # A path no artifact can have is a mistake to name, not an absence (it answered not_found).
        for tool in ("get_memory_artifact_by_path", "get_own_memory_artifact_draft_by_path"):
            await researcher.refused("artifact_path: not an artifact path", tool, artifact_path="../etc")
        await researcher.refused("not_found", "get_memory_artifact_by_path", artifact_path="notes/never-written")


def test_two_agents_registering_one_object_at_once_both_succeed(service):
    """On PostgreSQL the check-then-insert let the slower of two registrations hit the primary
    key: an unnamed tool error for an agent that did nothing wrong."""
    callers = [Caller(f"agent-{i}", {REALM: Role.MEMBER}) for i in range(12)]
    for round_ in range(5):
        entity = f"contract-{round_}"
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(callers)) as pool:
            results = list(pool.map(lambda c: service.register_entity(c, REALM, entity, "Contract", "contract"), callers))
        assert sum(r["created"] for r in results) == 1, results


def test_two_owners_initialising_the_population_at_once_get_one_population(service):
    """The second of two simultaneous init_population calls hit the one-accepted-version index:
    an unnamed error instead of "already has a constitution"."""
    population = PopulationService(service)
    owners = [Caller(f"owner-{i}", {REALM: Role.OWNER}) for i in range(6)]

    def init(owner: Caller) -> str:
        try:
            population.init_population(owner, REALM)
            return "initialised"
        except RuleBroken as exc:
            return exc.rule

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(owners)) as pool:
        outcomes = list(pool.map(init, owners))
    assert sorted(outcomes) == ["initialised"] + ["population"] * (len(owners) - 1), outcomes
    assert population.list_agents(owners[0], REALM)["agents"] == []


async def test_a_reviewer_finds_what_waits_for_review_and_history_only_when_asked(realm_server):
    """Search returned accepted artifacts only, and nothing else listed proposals: a reviewer
    could accept only what someone told it the id of. Superseded and revoked versions are still
    out of the default search, and come back when asked for."""
    async with Agent(realm_server, "researcher", "member") as researcher, Agent(realm_server, "reviewer", "member") as reviewer, \
            Agent(realm_server, "lead", "owner") as lead, Agent(realm_server, "viewer", "reader") as viewer:
        v1 = await researcher("create_memory_artifact_draft", **draft("decisions/contract-7/version", body="Decision: stay on 2.0."))
        await researcher("submit_memory_artifact", artifact_id=v1["artifact_id"])
        mine = await researcher("create_memory_artifact_draft", **draft("agents/researcher/worklog", "worklog", "Draft notes."))
        listed = (await reviewer("search_memory_artifacts", status="proposed"))["artifacts"]
        assert [(a["artifact_id"], a["status"]) for a in listed] == [(v1["artifact_id"], "proposed")], "never a draft"
        assert (await reviewer("search_memory_artifacts", status="proposed", query="STAY 2.0"))["artifacts"]
        assert (await reviewer("search_memory_artifacts", status="proposed", query="move"))["artifacts"] == []
        await reviewer.refused("status", "search_memory_artifacts", status="draft")
        assert (await reviewer("search_memory_artifacts"))["artifacts"] == [], "the default is the accepted memory"

        await reviewer("accept_memory_artifact", artifact_id=v1["artifact_id"])
        v2 = await lead("supersede_memory_artifact", artifact_id=v1["artifact_id"], body="Decision: move to 2.1.",
                        summary="Move to 2.1", source_ref="meeting:1", source_context={})
        gone = await researcher("create_memory_artifact_draft", **draft("decisions/contract-8/version", body="Decision: drop 8."))
        await researcher("submit_memory_artifact", artifact_id=gone["artifact_id"])
        await researcher("revoke_memory_artifact", artifact_id=gone["artifact_id"], reason="wrong contract")

        default = (await viewer("search_memory_artifacts", query="decision"))["artifacts"]
        assert [a["artifact_id"] for a in default] == [v2["artifact_id"]]
        history = (await viewer("search_memory_artifacts", status="superseded", target_kind="realm", target_id=REALM))["artifacts"]
        assert [a["artifact_id"] for a in history] == [v1["artifact_id"]]
        revoked = (await viewer("search_memory_artifacts", status="revoked"))["artifacts"]
        assert [a["artifact_id"] for a in revoked] == [gone["artifact_id"]]
        assert mine["artifact_id"] not in {a["artifact_id"] for s in ("proposed", "superseded", "revoked")
                                           for a in (await viewer("search_memory_artifacts", status=s))["artifacts"]}


def test_accepting_and_withdrawing_one_proposal_at_once_lands_exactly_one(service):
    """The artifact's row is locked by every transition: of an acceptance and a withdrawal racing
    on one proposal exactly one lands, and the audit tells that one story."""
    from services.recall.artifacts.models import DraftInput, Target

    author, owner = Caller("researcher", {REALM: Role.MEMBER}), Caller("lead", {REALM: Role.OWNER})
    outcomes = []
    for i in range(8):
        made = service.create_draft(author, REALM, DraftInput(
            artifact_path=f"decisions/d{i}", artifact_kind="decision", write_mode="replace", body=f"Decision {i}.",
            summary="s", source_ref="r", source_context={}, targets=[Target(target_kind="realm", target_id=REALM)]))
        service.submit(author, REALM, made.artifact_id)

        def act(fn) -> str:
            try:
                return fn().status.value
            except RuleBroken as exc:
                return exc.rule

        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            accepted = pool.submit(act, lambda: service.accept(owner, REALM, made.artifact_id))
            revoked = pool.submit(act, lambda: service.revoke(author, REALM, made.artifact_id, "withdrawn"))
            pair = (accepted.result(), revoked.result())
        final = service.get(owner, REALM, made.artifact_id).status.value
        events = [e["event"] for e in service.audit(owner, REALM, made.artifact_id)]
        # Accepted first: a member may not revoke accepted memory. Withdrawn first: nothing to accept.
        assert pair in {("accepted", "realm_role"), ("lifecycle", "revoked")}, pair
        assert final == ("accepted" if pair[0] == "accepted" else "revoked")
        assert events[:2] == ["created", "submitted"] and events[2:] == [final], events
        outcomes.append(final)
    assert set(outcomes) <= {"accepted", "revoked"}


async def test_search_pages_through_everything_without_overlap(realm_server):
    """limit stopped at 100 and nothing came after it: past the newest 100 artifacts or records
    a realm's memory could not be listed at all."""
    import httpx

    async with Agent(realm_server, "researcher", "member") as researcher, Agent(realm_server, "lead", "owner") as lead:
        made = []
        for i in range(12):
            d = await researcher("create_memory_artifact_draft", **draft(f"decisions/d{i}", body=f"Decision {i} on the retry field."))
            await researcher("submit_memory_artifact", artifact_id=d["artifact_id"])
            if i < 11:
                await lead("accept_memory_artifact", artifact_id=d["artifact_id"])
                made.append(d["artifact_id"])
        for extra in ({}, {"query": "retry field decision"}):
            seen, offset = [], 0
            while offset is not None:
                page = await researcher("search_memory_artifacts", limit=5, offset=offset, **extra)
                seen += [a["artifact_id"] for a in page["artifacts"]]
                offset = page["next_offset"]
            assert sorted(seen) == sorted(made) and len(seen) == len(set(seen)), extra
        proposed = await researcher("search_memory_artifacts", status="proposed", limit=1, offset=0)
        assert len(proposed["artifacts"]) == 1 and proposed["next_offset"] == 1
        assert (await researcher("search_memory_artifacts", status="proposed", limit=1, offset=1))["next_offset"] is None
        await researcher.refused("offset", "search_memory_artifacts", offset=-1)

    alice = httpx.Client(base_url=f"{recall_url(realm_server)}/realms/{REALM}", timeout=30,
                         headers={"authorization": f"Bearer {mint('alice', realms={REALM: 'member'})}"})
    rids = [alice.post("/memory", json={"memory_type": "fact", "reality": "current_state", "title": f"Fact {i}",
                                        "summary": "s", "content": "c", "targets": REALM_TARGET}).json()["record_id"]
            for i in range(7)]
    seen, offset = [], 0
    while offset is not None:
        page = alice.get("/memory", params={"limit": 3, "offset": offset}).json()
        seen += [r["record_id"] for r in page["records"]]
        offset = page["next_offset"]
    assert sorted(seen) == sorted(rids) and len(seen) == len(set(seen))
    assert alice.get("/memory", params={"offset": 10_001}).json()["error"] == "offset"
    async with Agent(realm_server, "agent", "reader") as agent:
        page = await agent("search_agent_memory", limit=5, offset=5)
        assert len(page["records"]) == 2 and page["next_offset"] is None


async def test_memory_anchors_to_a_template_or_a_diagram_that_exists(realm_server):
    """Seed 004, step 2: a target is the realm, a template, an object or a diagram; only the
    realm and objects could be named."""
    async with Agent(realm_server, "researcher", "member") as researcher, Agent(realm_server, "lead", "owner") as lead:
        await researcher("register_realm_entity", entity_id="integration-view", title="Integration view", entity_kind="diagram")
        await researcher("register_realm_entity", entity_id="contract-template", title="Contract template", entity_kind="template")
        targets = [{"target_kind": "diagram", "target_id": "integration-view", "role": "primary"},
                   {"target_kind": "template", "target_id": "contract-template", "role": "related"}]
        made = await researcher("create_memory_artifact_draft", **{**draft("dossiers/integration-view"), "targets": targets})
        await researcher("submit_memory_artifact", artifact_id=made["artifact_id"])
        await lead("accept_memory_artifact", artifact_id=made["artifact_id"])
        found = (await researcher("search_memory_artifacts", target_kind="diagram", target_id="integration-view"))["artifacts"]
        assert [a["artifact_id"] for a in found] == [made["artifact_id"]]
        # A diagram is not a template, and an unregistered one is not a target at all.
        await researcher.refused("targets: template 'integration-view' does not exist", "create_memory_artifact_draft",
                                 **{**draft("dossiers/x"), "targets": [{"target_kind": "template", "target_id": "integration-view"}]})
        await researcher.refused("targets: diagram 'nowhere'", "create_memory_artifact_draft",
                                 **{**draft("dossiers/x"), "targets": [{"target_kind": "diagram", "target_id": "nowhere"}]})


async def test_one_realms_artifacts_and_records_never_show_or_change_through_another(realm_server):
    """A token naming two realms reaches each realm's memory only through that realm's id: an
    artifact or record id of realm B given with realm A is unknown there, for every tool."""
    import httpx

    other = "side-project"
    token = mint("researcher", realms={REALM: "owner", other: "owner"})
    async with Client(f"{recall_url(realm_server)}/mcp", auth=BearerAuth(token)) as client:
        async def call(tool: str, **args):
            return (await client.call_tool(tool, args)).structured_content

        b = await call("create_memory_artifact_draft", **{**draft("decisions/b"), "realm_id": other,
                                                          "targets": [{"target_kind": "realm", "target_id": other}]})
        await call("submit_memory_artifact", realm_id=other, artifact_id=b["artifact_id"])
        await call("init_population", realm_id=other, separate_author_and_reviewer=False)
        await call("accept_memory_artifact", realm_id=other, artifact_id=b["artifact_id"])
        aid = b["artifact_id"]
        for tool, args in [("get_memory_artifact", {}), ("list_memory_artifact_audit", {}), ("submit_memory_artifact", {}),
                           ("accept_memory_artifact", {}), ("revoke_memory_artifact", {}),
                           ("update_memory_artifact_draft", {"body": "x"}),
                           ("append_memory_artifact", {"body": "x", "source_ref": "r", "source_context": {}}),
                           ("supersede_memory_artifact", {"body": "x", "summary": "s", "source_ref": "r", "source_context": {}})]:
            with pytest.raises(ToolError, match="not_found"):
                await client.call_tool(tool, {"realm_id": REALM, "artifact_id": aid, **args})
        with pytest.raises(ToolError, match="not_found"):
            await client.call_tool("get_memory_artifact_by_path", {"realm_id": REALM, "artifact_path": "decisions/b"})
        for status in ("accepted", "proposed", "superseded", "revoked"):
            assert (await call("search_memory_artifacts", realm_id=REALM, status=status))["artifacts"] == []
        assert (await call("search_memory_artifacts", realm_id=REALM, query="Decision stay"))["artifacts"] == []
        assert (await call("get_memory_artifact", realm_id=other, artifact_id=aid))["status"] == "accepted"

        http = httpx.Client(base_url=f"{recall_url(realm_server)}/realms", timeout=30, headers={"authorization": f"Bearer {token}"})
        rid = http.post(f"/{other}/memory", json={"memory_type": "fact", "reality": "current_state", "title": "B only",
                                                  "summary": "s", "content": "c",
                                                  "targets": [{"target_kind": "realm", "target_id": other}]}).json()["record_id"]
        for method, path, kwargs in [("GET", f"/{REALM}/memory/{rid}", {}), ("PATCH", f"/{REALM}/memory/{rid}", {"json": {"title": "x"}}),
                                     ("DELETE", f"/{REALM}/memory/{rid}", {}), ("GET", f"/{REALM}/memory/{rid}/audit", {})]:
            assert http.request(method, path, **kwargs).status_code == 404, (method, path)
        assert http.get(f"/{REALM}/memory").json()["records"] == []
        with pytest.raises(ToolError, match="not_found"):
            await client.call_tool("get_agent_memory", {"realm_id": REALM, "record_id": rid})
        assert http.get(f"/{other}/memory/{rid}").json()["title"] == "B only"
