"""Population rules at the service level, on SQLite and a real PostgreSQL: schemas of the
population kinds, their fixed places, and the registry's word on an agent's actions."""

from __future__ import annotations

import json

import pytest

from services.recall.artifacts.artifact_search import ArtifactSearch
from services.recall.artifacts.artifact_store import ArtifactStore
from services.recall.artifacts.models import DraftInput, Role, Target
from services.recall.artifacts.rules import RuleBroken
from services.recall.artifacts.service import ArtifactService, Caller
from services.recall.population.service import PopulationService
from shared.engine.api import Engine

REALM = "acme-integrations"
OWNER = Caller("lead", {REALM: Role.OWNER})
PERSON = Caller("coordinator", {REALM: Role.MEMBER})
AGENT = Caller("bot-1", {REALM: Role.MEMBER})


@pytest.fixture
def population(artifacts_db_url, tmp_path, embedder) -> PopulationService:
    artifacts = ArtifactService(ArtifactStore(artifacts_db_url), ArtifactSearch(tmp_path, Engine(embedder=embedder)), tmp_path)
    service = PopulationService(artifacts)
    service.init_population(OWNER, REALM)
    return service


def doc(path: str, kind: str, body: str, supersedes: str | None = None) -> DraftInput:
    return DraftInput(artifact_path=path, artifact_kind=kind, write_mode="append" if kind == "worklog" else "replace",
                      body=body, summary="s", source_ref="r", source_context={},
                      targets=[Target(target_kind="realm", target_id=REALM)], supersedes_artifact_id=supersedes)


def test_population_bodies_and_places_are_checked(population):
    arts = population.artifacts
    registry = arts.get_by_path(OWNER, REALM, "population/registry")
    with pytest.raises(RuleBroken, match="body: the body of an artifact of kind agent_registry must be JSON"):
        arts.create_draft(PERSON, REALM, doc("population/registry", "agent_registry", "not json", registry.artifact_id))
    with pytest.raises(RuleBroken, match=r"body: agent_registry body: agents.0.role"):
        arts.create_draft(PERSON, REALM, doc("population/registry", "agent_registry", json.dumps(
            {"agents": [{"principal": "x", "role": "Not A Role", "proposed_by": "p", "proposed_at": "2026-11-30T00:00:00Z"}]}),
            registry.artifact_id))
    with pytest.raises(RuleBroken, match="artifact_path: a constitution lives at 'population/constitution'"):
        arts.create_draft(OWNER, REALM, doc("rules/constitution", "constitution", "{}"))
    with pytest.raises(RuleBroken, match="artifact_path: population/ holds only"):
        arts.create_draft(PERSON, REALM, doc("population/notes", "worklog", "b"))
    with pytest.raises(RuleBroken, match="population: realm 'acme-integrations' already has a constitution"):
        population.init_population(OWNER, REALM)
    with pytest.raises(RuleBroken, match="realm_role: init_population is for realm owners"):
        population.init_population(PERSON, "acme-integrations")


def test_a_suspended_agent_is_refused_everything_and_may_not_start(population):
    arts = population.artifacts
    proposal = population.propose_admission(PERSON, REALM, "bot-1", "researcher", "needed")
    arts.accept(OWNER, REALM, proposal.artifact_id)
    assert population.check(AGENT, REALM, "start")["allowed"]
    mine = arts.create_draft(AGENT, REALM, doc("agents/bot-1/worklog", "worklog", "started"))

    registry = arts.get_by_path(OWNER, REALM, "population/registry")
    body = json.loads(registry.body)
    body["agents"][0]["status"] = "suspended"
    arts.supersede(OWNER, REALM, registry.artifact_id, json.dumps(body), "suspend bot-1", "r", {}, None)

    check = population.check(PERSON, REALM, "start", principal="bot-1")
    assert not check["allowed"] and check["reasons"] == ["bot-1 is suspended in the registry"]
    with pytest.raises(RuleBroken, match="constitution: bot-1 is suspended in the registry"):
        arts.submit(AGENT, REALM, mine.artifact_id)
    with pytest.raises(RuleBroken, match="constitution: bot-1 is suspended"):
        arts.create_draft(AGENT, REALM, doc("agents/bot-1/handoff", "handoff", "h"))
    # People are governed by their realm role alone.
    assert arts.create_draft(PERSON, REALM, doc("agents/coordinator/worklog", "worklog", "w")).status.value == "draft"


def test_charter_paths_are_checked_when_written_and_fit_any_principal(population):
    """A charter source such as agents/{name}/worklog was accepted and then broke
    list_population_agents for the whole realm (KeyError); a charter could sit at another role's
    path; and an agent whose principal is an e-mail address got paths no artifact can have."""
    arts = population.artifacts
    current = arts.get_by_path(OWNER, REALM, "population/charters/researcher")
    charter = json.loads(current.body)
    for field, bad in [("sources", ["agents/{name}/worklog"]), ("sources", ["agents/{0}/worklog"]),
                       ("handoff_path", "Agents/{principal}/Handoff"), ("must_read", ["../constitution"])]:
        with pytest.raises(RuleBroken, match=f"body: charter body: {field}"):
            arts.supersede(OWNER, REALM, current.artifact_id, json.dumps({**charter, field: bad}), "s", "r", {}, None)
    with pytest.raises(RuleBroken, match="artifact_path: the charter of role 'reviewer' lives at 'population/charters/reviewer'"):
        arts.supersede(OWNER, REALM, current.artifact_id, json.dumps({**charter, "role": "reviewer"}), "s", "r", {}, None)
    # A charter for a role the constitution does not have was accepted (a realm trial's `ghost`).
    with pytest.raises(RuleBroken, match=r"body: charter body: role 'ghost' is not one of the constitution's roles"):
        arts.create_draft(OWNER, REALM, doc("population/charters/ghost", "charter", json.dumps({**charter, "role": "ghost"})))

    mail = Caller("Bot.One@acme.example", {REALM: Role.MEMBER})
    arts.accept(OWNER, REALM, population.propose_admission(PERSON, REALM, mail.principal, "researcher", "n").artifact_id)
    me = population.list_agents(mail, REALM, principal=mail.principal)["agents"][0]
    assert me["handoff_path"] == "agents/bot.one-acme.example/handoff"
    # A principal in another script could never be admitted ("not a valid principal").
    arts.accept(OWNER, REALM, population.propose_admission(PERSON, REALM, "Ünïcode-bot", "researcher", "n").artifact_id)
    unicode_bot = Caller("Ünïcode-bot", {REALM: Role.MEMBER})
    assert population.list_agents(unicode_bot, REALM, principal="Ünïcode-bot")["agents"][0]["handoff_path"] == \
        "agents/n-code-bot/handoff"
    worklog = arts.create_draft(mail, REALM, doc(me["sources"][1]["artifact_path"], "worklog", "started"))
    arts.submit(mail, REALM, worklog.artifact_id)
    arts.accept(OWNER, REALM, worklog.artifact_id)
    sources = population.list_agents(mail, REALM, principal=mail.principal)["agents"][0]["sources"]
    assert [s["artifact_id"] for s in sources] == [None, worklog.artifact_id]


def test_a_suspended_agent_neither_edits_its_drafts_nor_registers_objects_nor_supersedes(population):
    """The constitution bound create, append, submit, accept and revoke, but a suspended agent
    still edited its drafts, registered objects and (as a realm owner) replaced accepted memory."""
    arts = population.artifacts
    bot_owner = Caller("bot-2", {REALM: Role.OWNER})
    for principal in ("bot-1", "bot-2"):
        arts.accept(OWNER, REALM, population.propose_admission(PERSON, REALM, principal, "researcher", "n").artifact_id)
    mine = arts.create_draft(AGENT, REALM, doc("agents/bot-1/handoff", "handoff", "h"))
    decision = arts.create_draft(PERSON, REALM, doc("decisions/d", "decision", "d"))
    arts.submit(PERSON, REALM, decision.artifact_id)
    arts.accept(OWNER, REALM, decision.artifact_id)
    # Active, a researcher may not accept, so it may not replace accepted memory in one step either.
    with pytest.raises(RuleBroken, match="constitution: role researcher may .*not accept"):
        arts.supersede(bot_owner, REALM, decision.artifact_id, "d2", "s", "r", {}, None)

    registry = arts.get_by_path(OWNER, REALM, "population/registry")
    body = json.loads(registry.body)
    for agent in body["agents"]:
        agent["status"] = "suspended"
    arts.supersede(OWNER, REALM, registry.artifact_id, json.dumps(body), "suspend", "r", {}, None)
    with pytest.raises(RuleBroken, match="constitution: bot-1 is suspended"):
        arts.update_draft(AGENT, REALM, mine.artifact_id, {"body": "changed while suspended"})
    with pytest.raises(RuleBroken, match="constitution: bot-1 is suspended"):
        arts.register_entity(AGENT, REALM, "contract-9", "Contract 9", "contract")
    with pytest.raises(RuleBroken, match="constitution: bot-2 is suspended"):
        arts.supersede(bot_owner, REALM, decision.artifact_id, "d2", "s", "r", {}, None)
    assert arts.get(AGENT, REALM, mine.artifact_id).body == "h"
    # Its own draft, which nobody else sees, it may still withdraw (it stayed forever).
    assert arts.revoke(AGENT, REALM, mine.artifact_id, "withdrawn while suspended").status.value == "revoked"
    assert arts.update_draft(PERSON, REALM, arts.create_draft(PERSON, REALM, doc("notes/n", "dossier", "x")).artifact_id,
                             {"body": "people are governed by their realm role"}).body.startswith("people")


def test_the_accepted_constitution_and_registry_are_replaced_never_revoked(population):
    """Revoking the accepted registry left registered agents bound by nothing: a suspended agent
    got every right back."""
    arts = population.artifacts
    arts.accept(OWNER, REALM, population.propose_admission(PERSON, REALM, "bot-1", "researcher", "n").artifact_id)
    registry = arts.get_by_path(OWNER, REALM, "population/registry")
    body = json.loads(registry.body)
    body["agents"][0]["status"] = "suspended"
    registry = arts.supersede(OWNER, REALM, registry.artifact_id, json.dumps(body), "suspend bot-1", "r", {}, None)
    for path in ("population/registry", "population/constitution"):
        with pytest.raises(RuleBroken, match="population: the accepted .* is replaced with a new version, never revoked"):
            arts.revoke(OWNER, REALM, arts.get_by_path(OWNER, REALM, path).artifact_id, "reset")
    with pytest.raises(RuleBroken, match="constitution: bot-1 is suspended"):
        arts.create_draft(AGENT, REALM, doc("agents/bot-1/worklog", "worklog", "w"))
    # A proposal of either can still be withdrawn, and a charter revoked (its role then may not start).
    proposal = population.propose_admission(PERSON, REALM, "bot-3", "researcher", "n")
    assert arts.revoke(PERSON, REALM, proposal.artifact_id, "not needed").status.value == "revoked"
    charter = arts.get_by_path(OWNER, REALM, "population/charters/reviewer")
    assert arts.revoke(OWNER, REALM, charter.artifact_id, "role retired").status.value == "revoked"


def test_an_admission_whose_working_paths_are_a_registered_agents_is_refused_as_an_admission_and_by_the_dry_run(
        population):
    """'Bot-1' and 'bot@1' write to bot-1's worklog and handoff: the dry run allowed them and the
    proposal's refusal was named body, a field the caller never gave."""
    population.artifacts.accept(OWNER, REALM, population.propose_admission(PERSON, REALM, "bot-1", "researcher", "n").artifact_id)
    for principal in ("Bot-1", "bot@1"):
        check = population.check(PERSON, REALM, "admit", principal, agent_role="researcher")
        assert not check["allowed"] and any("are those of 'bot-1'" in r for r in check["reasons"]), check
        with pytest.raises(RuleBroken, match=rf"^admission: {principal}'s working paths \(\{{principal}} = 'bot-1'\) are "
                                             r"those of 'bot-1'; admit it under another principal$"):
            population.propose_admission(PERSON, REALM, principal, "researcher", "n")
    assert population.check(PERSON, REALM, "admit", "bot-2", agent_role="researcher")["allowed"]


def table_reads(store, table: str, action) -> int:
    """How many statements of `action` read `table`: SQLite traced, PostgreSQL by its own
    statistics (scans of the table), flushed after the action."""
    if not store.pg:
        statements: list[str] = []
        conn = store._connection()
        conn.set_trace_callback(statements.append)
        try:
            action()
        finally:
            conn.set_trace_callback(None)
        return sum(table in sql for sql in statements)

    def scans() -> int:
        with store.transaction() as tx:
            tx.q("SELECT pg_stat_force_next_flush()")
        with store.transaction() as tx:
            return tx.q("SELECT COALESCE(seq_scan, 0) + COALESCE(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = ?",
                        (table,))[0][0]
    before = scans()
    action()
    return scans() - before


def test_listing_agents_reads_no_journal_entries(population):
    """Each agent's sources (its worklog, a journal) were read with their first page of entries,
    and its charter with its targets and entry count, although a listing shows ids and summaries."""
    arts = population.artifacts
    arts.accept(OWNER, REALM, population.propose_admission(PERSON, REALM, AGENT.principal, "researcher", "n").artifact_id)
    worklog = arts.create_draft(AGENT, REALM, doc(f"agents/{AGENT.principal}/worklog", "worklog", "started"))
    arts.submit(AGENT, REALM, worklog.artifact_id)
    arts.accept(OWNER, REALM, worklog.artifact_id)
    for i in range(5):
        arts.append(AGENT, REALM, worklog.artifact_id, f"step {i}", "r", {})
    listed: list[dict] = []
    reads = table_reads(population.store, "artifact_entries", lambda: listed.append(population.list_agents(PERSON, REALM)))
    [agent] = listed[0]["agents"]
    assert [s["artifact_id"] for s in agent["sources"]] == [None, worklog.artifact_id]
    assert agent["charter_id"] == arts.get_by_path(PERSON, REALM, "population/charters/researcher").artifact_id
    assert reads == 0


def test_a_realms_claim_that_grants_nothing_is_logged_for_the_operator():
    """A token whose realms claim named a role that does not exist (or was a list) showed the
    caller only `recall_my_conversations`, and nothing told anyone why."""
    from structlog.testing import capture_logs

    from shared.tenant_paths import user_hash

    with capture_logs() as logs:
        for claim in ({REALM: "admin"}, [REALM], {REALM: "owner"}):
            Caller.from_claims({"sub": "gw-user", "realms": claim})
    ignored = [e for e in logs if e["event"] == "token.realms_ignored"]
    assert [(e["claim_type"], e["entries_ignored"]) for e in ignored] == [("dict", 1), ("list", 0)]
    assert all(e["user_hash"] == user_hash("gw-user") and "gw-user" not in str(e) for e in ignored)
