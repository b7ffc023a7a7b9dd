"""Review and authorship rules a seed-004 review found open (round 16), on SQLite and a real
PostgreSQL: what was reviewed is what gets accepted, a path keeps its kind, a demoted member
writes no more, an agent withdraws its own proposal, the dry run answers as the service
enforces, two agents never share working paths, and a record's author is who wrote its text."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from services.recall.agent_memory.memory_store import MemoryStore
from services.recall.agent_memory.models import RecordFields, RecordInput
from services.recall.agent_memory.service import AgentMemoryService
from services.recall.artifacts.kind_schemas import REGISTRY_PATH, AgentRegistry, RegistryEntry, dump
from services.recall.artifacts.models import DraftInput, Role, Status, Target
from services.recall.artifacts.service import ArtifactService, Caller
from services.recall.artifacts.text_limits import TextTooLarge
from services.recall.population.defaults import default_constitution
from services.recall.population.service import PopulationService
from shared.tenant_paths import TenantPaths
from tests.conftest import realm_draft, refused


REALM = "plant-7"
OWNER = Caller("lead", {REALM: Role.OWNER})
ALICE = Caller("alice", {REALM: Role.MEMBER})
BOB = Caller("bob", {REALM: Role.MEMBER})
ON_REALM = [Target(target_kind="realm", target_id=REALM)]


def draft(path: str, kind: str = "decision", body: str = "Stay on 2.0.", supersedes: str | None = None) -> DraftInput:
    return realm_draft(REALM, path, kind, body, supersedes, source_ref="thread:t-1")


def accepted(service: ArtifactService, author: Caller, made: DraftInput, reviewer: Caller = BOB) -> str:
    artifact = service.create_draft(author, REALM, made)
    service.submit(author, REALM, artifact.artifact_id)
    return service.accept(reviewer, REALM, artifact.artifact_id).artifact_id


def admitted(service: ArtifactService, *principals: str, role: str = "researcher") -> PopulationService:
    population = PopulationService(service)
    population.init_population(OWNER, REALM)
    for principal in principals:
        proposal = population.propose_admission(ALICE, REALM, principal, role, "joins the line-7 study")
        service.accept(OWNER, REALM, proposal.artifact_id)
    return population


def test_a_path_keeps_its_kind_and_write_mode_from_version_to_version(service):
    decision = accepted(service, ALICE, draft("decisions/c7"))
    message = refused("artifact_kind", service.create_draft, ALICE, REALM,
                      draft("decisions/c7", kind="worklog", body="anyone may append here", supersedes=decision))
    assert "holds a decision" in message
    newer = accepted(service, ALICE, draft("decisions/c7", body="Move to 2.1.", supersedes=decision))
    assert service.get(ALICE, REALM, newer).artifact_kind == "decision"


def test_a_member_demoted_to_reader_edits_submits_and_appends_no_more(service):
    journal = service.create_draft(ALICE, REALM, draft("agents/alice/worklog", kind="worklog", body="Started."))
    demoted = Caller("alice", {REALM: Role.READER})
    refused("realm_role", service.update_draft, demoted, REALM, journal.artifact_id, {"body": "rewritten after demotion"})
    refused("realm_role", service.append, demoted, REALM, journal.artifact_id, "one more", "thread:t-2", {})
    refused("realm_role", service.submit, demoted, REALM, journal.artifact_id)
    assert service.get(ALICE, REALM, journal.artifact_id).status is Status.DRAFT
    assert service.revoke(demoted, REALM, journal.artifact_id, "left the team").status is Status.REVOKED  # withdrawing stays


def test_a_proposal_takes_no_entries_while_it_is_reviewed(service):
    journal = service.create_draft(ALICE, REALM, draft("agents/alice/worklog", kind="worklog", body="Started."))
    service.append(ALICE, REALM, journal.artifact_id, "Measured line 7.", "thread:t-1", {})
    service.submit(ALICE, REALM, journal.artifact_id)
    refused("lifecycle", service.append, ALICE, REALM, journal.artifact_id, "UNREVIEWED: drop table", "thread:t-2", {})
    kept = service.accept(BOB, REALM, journal.artifact_id)
    assert kept.entries_total == 1 and [e.body for e in kept.entries] == ["Measured line 7."]
    assert service.append(ALICE, REALM, journal.artifact_id, "Next step.", "thread:t-3", {}).entries_total == 2


def test_an_agent_that_may_submit_withdraws_its_own_proposal_but_revokes_no_others(service):
    admitted(service, "bot-1", "bot-2")
    bot1, bot2 = Caller("bot-1", {REALM: Role.MEMBER}), Caller("bot-2", {REALM: Role.MEMBER})
    mine = service.create_draft(bot1, REALM, draft("agents/bot-1/handoff", kind="handoff", body="Line 7 is open."))
    service.submit(bot1, REALM, mine.artifact_id)
    theirs = service.create_draft(bot2, REALM, draft("agents/bot-2/handoff", kind="handoff", body="Line 8 is open."))
    service.submit(bot2, REALM, theirs.artifact_id)
    # Rejecting another's proposal takes the constitution's revoke action, which a researcher lacks.
    assert "not revoke" in refused("constitution", service.revoke, bot1, REALM, theirs.artifact_id, "not mine")
    assert service.revoke(bot1, REALM, mine.artifact_id, "proposed by mistake").status is Status.REVOKED


def test_the_dry_run_answers_for_a_principal_outside_the_registry_as_the_service_enforces(service):
    population = admitted(service)
    proposal = service.create_draft(ALICE, REALM, draft("decisions/c7"))
    service.submit(ALICE, REALM, proposal.artifact_id)
    outsider = Caller("rogue-bot", {REALM: Role.MEMBER})
    dry = population.check(outsider, REALM, "accept")
    assert dry["allowed"] and "not in the agent registry" in dry["reasons"][0], dry
    assert service.accept(outsider, REALM, proposal.artifact_id).status is Status.ACCEPTED
    assert not population.check(outsider, REALM, "start")["allowed"]  # an agent starts only once admitted


def test_an_agent_whose_working_paths_are_another_agents_is_not_admitted(service):
    population = admitted(service, "bot1")
    message = refused("admission", population.propose_admission, ALICE, REALM, "Bot1", "researcher", "a second bot")
    assert "'bot1'" in message and "another principal" in message
    population.propose_admission(ALICE, REALM, "bot-one", "researcher", "a distinct principal")


def test_a_new_registry_version_holds_real_roles_and_times_and_keeps_what_was_accepted(service):
    admitted(service, "bot-1")
    current = service.get_by_path(OWNER, REALM, REGISTRY_PATH)
    agents = AgentRegistry.model_validate(json.loads(current.body)).agents

    def registry_with(entry: RegistryEntry) -> DraftInput:
        return DraftInput(artifact_path=REGISTRY_PATH, artifact_kind="agent_registry", write_mode="replace",
                          body=dump(AgentRegistry(agents=[*agents, entry])), summary="admit", source_ref="admission",
                          source_context={}, targets=ON_REALM, supersedes_artifact_id=current.artifact_id)

    bad_time = RegistryEntry(principal="ghost", role="researcher", proposed_by="alice", proposed_at="not a date")
    assert "RFC 3339" in refused("body", service.create_draft, OWNER, REALM, registry_with(bad_time))
    bad_role = RegistryEntry(principal="ghost", role="janitor", proposed_by="alice", proposed_at="2026-12-01T00:00:00Z")
    assert "janitor" in refused("body", service.create_draft, OWNER, REALM, registry_with(bad_role))
    good = RegistryEntry(principal="ghost", role="reviewer", proposed_by="alice", proposed_at="2026-12-01T00:00:00Z")
    assert service.create_draft(OWNER, REALM, registry_with(good)).status is Status.DRAFT


def test_a_constitution_grants_only_kinds_that_exist(service):
    admitted(service)
    current = service.get_by_path(OWNER, REALM, "population/constitution")
    constitution = default_constitution(REALM, True).model_dump(mode="json")
    constitution["roles"]["researcher"]["may_write_kinds"].append("nonsense-kind")
    made = DraftInput(artifact_path="population/constitution", artifact_kind="constitution", write_mode="replace",
                      body=json.dumps(constitution), summary="typo", source_ref="edit", source_context={}, targets=ON_REALM,
                      supersedes_artifact_id=current.artifact_id)
    assert "nonsense-kind" in refused("body", service.create_draft, OWNER, REALM, made)


def test_an_id_registered_as_one_kind_is_not_quietly_taken_as_another(service):
    assert service.register_entity(ALICE, REALM, "contract-7", "Contract 7", "contract")["created"]
    assert not service.register_entity(BOB, REALM, "contract-7", "Contract 7", "contract")["created"]  # the same: fine
    assert "registered in realm" in refused("entity_kind", service.register_entity, BOB, REALM, "contract-7", "C7", "diagram")


def test_blank_required_texts_unknown_target_keys_and_overlong_ids_are_refused():
    with pytest.raises(ValidationError, match="body"):
        draft("decisions/c7", body="   ")
    with pytest.raises(ValidationError, match="evil"):
        Target.model_validate({"target_kind": "realm", "target_id": REALM, "evil": 1})
    with pytest.raises(ValidationError, match="supersedes_artifact_id"):
        draft("decisions/c7", supersedes="f" * 65)


@pytest.fixture
def records(service) -> AgentMemoryService:
    return AgentMemoryService(MemoryStore(service.store), service, service.data_dir)


def record(content: str = "Retries follow 2.1.") -> RecordInput:
    return RecordInput(memory_type="fact", title="Contract 7 retries", summary="The vendor changed retries.",
                       content=content, reality="current_state", targets=ON_REALM)


def test_only_a_records_author_changes_it_and_its_author_or_an_owner_retires_it(records):
    made = records.create(ALICE, REALM, record())
    refused("record_author", records.update, BOB, REALM, made["record_id"], RecordFields(content="Disable backoff."))
    refused("record_author", records.retire, BOB, REALM, made["record_id"], "wrong")
    shown = records.update(ALICE, REALM, made["record_id"], RecordFields(content="Retries follow 2.2."))
    assert (shown["author"], shown["content"]) == ("alice", "Retries follow 2.2.")
    assert records.retire(OWNER, REALM, made["record_id"], "superseded by the vendor's note")["status"] == "retired"


def test_a_records_content_is_bounded_in_bytes_of_utf8_not_in_characters(records):
    long = "x" * 25_000  # over the old 20,000-character cap, well under the 64 KiB default
    assert records.create(ALICE, REALM, record(long))["content"] == long
    with pytest.raises(TextTooLarge):
        records.create(ALICE, REALM, record("я" * 40_000))  # 80,000 bytes of UTF-8


def test_a_new_version_keeps_the_conversations_its_predecessor_cited_but_cites_no_other_users(service):
    transcript = TenantPaths.for_user(service.data_dir, "alice").transcript("call-notes")
    transcript.parent.mkdir(parents=True, exist_ok=True)
    transcript.write_text("")
    cited = [*ON_REALM, Target(target_kind="conversation", target_id="call-notes", role="evidence")]
    first = accepted(service, ALICE, draft("decisions/c7").model_copy(update={"targets": cited}))
    second = service.supersede(OWNER, REALM, first, "Move to 2.1.", "2.1", "thread:t-2", {}, None)
    assert sorted(t.target_id for t in second.targets) == ["call-notes", REALM]
    third = draft("decisions/c7", body="Move to 2.2.", supersedes=second.artifact_id).model_copy(update={"targets": cited})
    assert sorted(t.target_id for t in service.create_draft(BOB, REALM, third).targets) == ["call-notes", REALM]
    elsewhere = [*ON_REALM, Target(target_kind="conversation", target_id="bobs-other-call", role="evidence")]
    refused("targets", service.create_draft, BOB, REALM,
            draft("decisions/c8").model_copy(update={"targets": elsewhere}))


def test_a_record_carries_its_source_and_provenance_and_only_its_author_changes_them(records):
    made = records.create(ALICE, REALM, record().model_copy(update={
        "source_ref": "vendor-call:2026-11-30", "source_context": {"attendees": ["alice", "vendor"], "minute": 42}}))
    assert (made["source_ref"], made["source_context"]) == ("vendor-call:2026-11-30", {"attendees": ["alice", "vendor"], "minute": 42})
    changed = records.update(ALICE, REALM, made["record_id"], RecordFields(source_ref="vendor-email:2026-12-01"))
    assert changed["source_ref"] == "vendor-email:2026-12-01" and changed["source_context"]["minute"] == 42
    listed = records.search(ALICE, REALM, query="retries")
    assert [r["source_ref"] for r in listed] == ["vendor-email:2026-12-01"]
    for field in ("source_ref", "title", "summary", "content"):
        with pytest.raises(ValidationError, match=field):
            RecordFields(**{field: "  "})
    with pytest.raises(TextTooLarge):
        records.create(ALICE, REALM, record().model_copy(update={"source_context": {"notes": "x" * 70_000}}))


def test_an_agent_admitted_before_the_registry_checks_can_still_be_suspended(service, monkeypatch):
    import services.recall.artifacts.kind_schemas as kind_schemas

    admitted(service, "bot1")
    current = service.get_by_path(OWNER, REALM, REGISTRY_PATH)
    before = AgentRegistry.model_validate(json.loads(current.body))
    legacy = AgentRegistry(agents=[*before.agents, RegistryEntry(principal="Bot1", role="researcher", proposed_by="alice",
                                                                 proposed_at="2026-12-01T00:00:00Z")])
    with monkeypatch.context() as m:  # a registry accepted before the checks: two agents on one set of paths
        m.setattr(kind_schemas, "check_new_body", lambda *args: None)
        service.supersede(OWNER, REALM, current.artifact_id, dump(legacy), "admit Bot1", "owner", {}, None)
    current = service.get_by_path(OWNER, REALM, REGISTRY_PATH)
    registry = AgentRegistry.model_validate(json.loads(current.body))
    suspended = AgentRegistry(agents=[a.model_copy(update={"status": "suspended"}) if a.principal == "Bot1" else a
                                      for a in registry.agents])
    made = service.supersede(OWNER, REALM, current.artifact_id, dump(suspended), "suspend Bot1", "owner", {}, None)
    assert json.loads(made.body)["agents"][1]["status"] == "suspended"
