"""The agent population never contradicts itself (round 32's realm review), on SQLite and a real
PostgreSQL: an agent leaves the registry by its status, never by losing its entry (which made it
a person with its token's full rights); a constitution keeps the roles registered agents hold; an
agent is admitted only to a role with a charter; and a realm whose constitution was written by
hand gets the rest from init_population instead of two errors pointing at each other."""

from __future__ import annotations

import json

import pytest

from services.recall.artifacts.kind_schemas import CONSTITUTION_PATH, REGISTRY_PATH, Charter, Constitution, RolePolicy, dump
from services.recall.artifacts.models import DraftInput, Role, Status
from services.recall.artifacts.service import ArtifactService, Caller
from services.recall.population.defaults import BASE_ROLES, CHARTERS
from services.recall.population.service import PopulationService
from tests.conftest import realm_draft, refused


REALM = "acme"
OWNER = Caller("lead", {REALM: Role.OWNER})
OWNER_2 = Caller("lead2", {REALM: Role.OWNER})
ALICE = Caller("alice", {REALM: Role.MEMBER})


def draft(path: str, kind: str, body: str, supersedes: str | None = None) -> DraftInput:
    return realm_draft(REALM, path, kind, body, supersedes)


def admitted(service: ArtifactService, **roles: str) -> PopulationService:
    """An initialised realm with these agents (principal=role) admitted."""
    population = PopulationService(service)
    population.init_population(OWNER, REALM)
    for principal, role in roles.items():
        service.accept(OWNER, REALM, population.propose_admission(ALICE, REALM, principal, role, "n").artifact_id)
    return population


def current(service: ArtifactService, path: str) -> tuple[str, dict]:
    artifact = service.get_by_path(OWNER, REALM, path)
    return artifact.artifact_id, json.loads(artifact.body)


def test_a_registry_version_that_drops_an_agent_is_refused_naming_it_and_the_agent_stays_bound(service):
    population = admitted(service, **{"researcher-b": "researcher", "review-bot-2": "reviewer"})
    registry_id, body = current(service, REGISTRY_PATH)
    body["agents"] = [a for a in body["agents"] if a["principal"] != "review-bot-2"]
    for a in body["agents"]:
        a["status"] = "suspended"  # the report's edit: suspend one, remove the other

    message = refused("body", service.supersede, OWNER, REALM, registry_id, json.dumps(body), "remove review-bot-2", "r", {}, None)
    assert "'review-bot-2'" in message and "'suspended' or 'retired'" in message, message
    refused("body", service.create_draft, ALICE, REALM, draft(REGISTRY_PATH, "agent_registry", json.dumps(body), registry_id))
    assert service.get_by_path(OWNER, REALM, REGISTRY_PATH).artifact_id == registry_id

    # Still registered, it is still bound: a reviewer writes no decision, and the dry run agrees.
    bot = Caller("review-bot-2", {REALM: Role.MEMBER})
    refused("constitution", service.create_draft, bot, REALM, draft("decisions/rogue", "decision", "rogue decision"))
    assert not population.check(bot, REALM, "create_draft", artifact_kind="decision")["allowed"]

    # The way out the docs give: its status.
    _, body = current(service, REGISTRY_PATH)
    for a in body["agents"]:
        a["status"] = "retired" if a["principal"] == "review-bot-2" else a["status"]
    service.supersede(OWNER, REALM, registry_id, json.dumps(body), "retire review-bot-2", "r", {}, None)
    assert refused("constitution", service.create_draft, bot, REALM, draft("agents/x/worklog", "worklog", "w")).endswith("retired in the registry")
    assert population.check(bot, REALM, "start")["reasons"] == ["review-bot-2 is retired in the registry"]


def test_a_constitution_that_drops_a_role_registered_agents_hold_is_refused_naming_them(service):
    admitted(service, **{"review-bot": "reviewer", "researcher-a": "researcher"})
    constitution_id, body = current(service, CONSTITUTION_PATH)
    without_reviewer = {**body, "roles": {"researcher": body["roles"]["researcher"]}}
    message = refused("body", service.supersede, OWNER, REALM, constitution_id, json.dumps(without_reviewer), "s", "r", {}, None)
    assert "'review-bot' (reviewer, active)" in message and "researcher-a" not in message, message

    # A draft written before an agent took the role is checked again when it is accepted.
    _, registry = current(service, REGISTRY_PATH)
    registry["agents"] = [{**a, "status": "retired"} if a["principal"] == "review-bot" else a for a in registry["agents"]]
    service.supersede(OWNER, REALM, current(service, REGISTRY_PATH)[0], json.dumps(registry), "retire", "r", {}, None)
    proposal = service.create_draft(OWNER, REALM, draft(CONSTITUTION_PATH, "constitution", json.dumps(without_reviewer),
                                                        constitution_id))
    service.submit(OWNER, REALM, proposal.artifact_id)
    population = PopulationService(service)
    service.accept(OWNER_2, REALM, population.propose_admission(ALICE, REALM, "review-bot-3", "reviewer", "n").artifact_id)
    assert "'review-bot-3' (reviewer, active)" in refused("body", service.accept, OWNER_2, REALM, proposal.artifact_id)

    # Once no agent that is not retired holds it, the role may go.
    _, registry = current(service, REGISTRY_PATH)
    registry["agents"] = [{**a, "status": "retired"} if a["role"] == "reviewer" else a for a in registry["agents"]]
    service.supersede(OWNER, REALM, current(service, REGISTRY_PATH)[0], json.dumps(registry), "retire", "r", {}, None)
    assert service.supersede(OWNER, REALM, constitution_id, json.dumps(without_reviewer), "s", "r", {}, None).status is Status.ACCEPTED


def test_an_agent_is_admitted_only_to_a_role_with_an_accepted_charter(service):
    population = admitted(service)
    constitution_id, body = current(service, CONSTITUTION_PATH)
    body["roles"]["bot"] = {"description": "a bot", "may": ["start", "create_draft"], "may_write_kinds": ["worklog"]}
    service.supersede(OWNER, REALM, constitution_id, json.dumps(body), "add bot", "r", {}, None)

    dry = population.check(ALICE, REALM, "admit", principal="x-bot", agent_role="bot")
    assert not dry["allowed"] and "no accepted charter at 'population/charters/bot'" in dry["reasons"][0], dry
    assert "population/charters/bot" in refused("admission", population.propose_admission, ALICE, REALM, "x-bot", "bot", "n")
    registry_id, registry = current(service, REGISTRY_PATH)
    registry["agents"].append({"principal": "x-bot", "role": "bot", "proposed_by": "lead", "proposed_at": "2026-12-04T00:00:00Z"})
    assert "has no accepted charter" in refused("body", service.supersede, OWNER, REALM, registry_id, json.dumps(registry),
                                                "admit x-bot", "r", {}, None)

    charter = Charter(**{**CHARTERS["researcher"].model_dump(), "role": "bot"})
    made = service.create_draft(OWNER, REALM, draft("population/charters/bot", "charter", dump(charter)))
    service.submit(OWNER, REALM, made.artifact_id)
    service.accept(OWNER_2, REALM, made.artifact_id)
    service.accept(OWNER, REALM, population.propose_admission(ALICE, REALM, "x-bot", "bot", "n").artifact_id)
    assert population.check(Caller("x-bot", {REALM: Role.MEMBER}), REALM, "start")["allowed"]


def test_init_population_completes_a_realm_whose_constitution_was_written_by_hand(service):
    population = PopulationService(service)
    handwritten = Constitution(title="Fresh", roles={"researcher": BASE_ROLES["researcher"],
                                                     "bot": RolePolicy(description="a bot", may=["start"])})
    made = service.create_draft(OWNER, REALM, draft(CONSTITUTION_PATH, "constitution", dump(handwritten)))
    service.submit(OWNER, REALM, made.artifact_id)
    service.accept(OWNER, REALM, made.artifact_id)

    # Both roads lead to init_population, which now does what is missing (it said "already has a constitution").
    assert "init_population" in refused("population", population.list_agents, ALICE, REALM)
    assert "init_population" in refused("population", population.propose_admission, ALICE, REALM, "bot-1", "researcher", "n")
    done = population.init_population(OWNER, REALM)
    assert [(c["artifact_kind"], c["artifact_path"]) for c in done["created"]] == \
        [("agent_registry", REGISTRY_PATH), ("charter", "population/charters/researcher")]
    assert done["roles_without_charter"] == ["bot"]
    assert service.get_by_path(OWNER, REALM, CONSTITUTION_PATH).artifact_id == made.artifact_id, "the hand-written one stays"
    assert population.list_agents(ALICE, REALM)["agents"] == []
    service.accept(OWNER, REALM, population.propose_admission(ALICE, REALM, "bot-1", "researcher", "n").artifact_id)
    assert "already has a constitution and a registry" in refused("population", population.init_population, OWNER, REALM)
