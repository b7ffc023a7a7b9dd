"""The review queue and the lifecycle around it (round 32's realm review), on SQLite and a real
PostgreSQL: a reviewer rejects a proposal with a reason, as the dry run says it may; proposals
that can never be accepted leave the queue on their own, saying why; a journal is continued,
never replaced; an author keeps one draft per path; and an edit is checked like a creation."""

from __future__ import annotations

import pytest

from services.recall.artifacts.models import DraftInput, Role, Status
from services.recall.artifacts.rules import RuleBroken
from services.recall.artifacts.service import ArtifactService, Caller
from services.recall.population.service import PopulationService
from tests.conftest import realm_draft, refused


REALM = "acme"
OWNER = Caller("lead", {REALM: Role.OWNER})
ALICE = Caller("alice", {REALM: Role.MEMBER})
BOB = Caller("bob", {REALM: Role.MEMBER})


def draft(path: str, kind: str = "dossier", body: str = "Vendor SLA is 99.9%.", supersedes: str | None = None) -> DraftInput:
    return realm_draft(REALM, path, kind, body, supersedes)


def proposed(service: ArtifactService, author: Caller, made: DraftInput) -> str:
    artifact = service.create_draft(author, REALM, made)
    return service.submit(author, REALM, artifact.artifact_id).artifact_id


def accepted(service: ArtifactService, author: Caller, made: DraftInput, reviewer: Caller = OWNER) -> str:
    return service.accept(reviewer, REALM, proposed(service, author, made)).artifact_id


def queue(service: ArtifactService) -> set[str]:
    return {a["artifact_id"] for a in service.search(OWNER, REALM, None, None, None, None, limit=100, status="proposed")}


def test_a_reviewer_rejects_a_proposal_with_a_reason_as_the_dry_run_says(service):
    population = PopulationService(service)
    population.init_population(OWNER, REALM)
    for principal, role in (("researcher-a", "researcher"), ("researcher-b", "researcher"), ("review-bot", "reviewer")):
        service.accept(OWNER, REALM, population.propose_admission(ALICE, REALM, principal, role, "n").artifact_id)
    author, researcher_b = Caller("researcher-a", {REALM: Role.MEMBER}), Caller("researcher-b", {REALM: Role.MEMBER})
    reviewer = Caller("review-bot", {REALM: Role.MEMBER})
    proposal = proposed(service, author, draft("dossiers/sla"))

    assert population.check(reviewer, REALM, "revoke")["allowed"]
    refused("reason", service.revoke, reviewer, REALM, proposal, None)
    rejected = service.revoke(reviewer, REALM, proposal, "changes requested: cite the SLA source")
    assert rejected.status is Status.REVOKED and rejected.revoked_reason == "changes requested: cite the SLA source"
    last = service.audit(author, REALM, proposal)[-1]
    assert (last["event"], last["actor"], last["detail"]["reason"]) == ("revoked", "review-bot", "changes requested: cite the SLA source")

    # A researcher lacks the revoke action: the dry run and the real call say the same.
    second = proposed(service, author, draft("dossiers/sla", body="Vendor SLA is 99.9% (source: contract 7, §4)."))
    assert not population.check(researcher_b, REALM, "revoke")["allowed"]
    refused("constitution", service.revoke, researcher_b, REALM, second, "mine is better")
    # A person is governed by the realm role: a member who may accept may reject.
    assert service.revoke(BOB, REALM, second, "duplicate of dossiers/sla-v2").status is Status.REVOKED
    # Another's draft is theirs alone, and an admission is an owner's to reject.
    private = service.create_draft(author, REALM, draft("dossiers/other"))
    refused("draft_privacy", service.revoke, reviewer, REALM, private.artifact_id, "no")
    admission = population.propose_admission(ALICE, REALM, "bot-9", "researcher", "n")
    refused("realm_role", service.revoke, BOB, REALM, admission.artifact_id, "no")
    assert service.revoke(OWNER, REALM, admission.artifact_id, "not now").status is Status.REVOKED


def test_proposals_overtaken_by_another_version_leave_the_review_queue_saying_why(service):
    v1 = accepted(service, ALICE, draft("decisions/retry", "decision", "Retry 3 times."))
    a = proposed(service, ALICE, draft("decisions/retry", "decision", "Retry 5 times.", supersedes=v1))
    b = proposed(service, BOB, draft("decisions/retry", "decision", "Retry 4 times.", supersedes=v1))
    elsewhere = proposed(service, BOB, draft("decisions/timeout", "decision", "Time out at 30 s."))
    assert queue(service) == {a, b, elsewhere}

    service.accept(OWNER, REALM, a)
    assert queue(service) == {elsewhere}, "b can never be accepted: it names v1, which a replaced"
    lost = service.get(BOB, REALM, b)
    assert lost.status is Status.REVOKED and f"overtaken: {a} was accepted" in lost.revoked_reason
    event = service.audit(BOB, REALM, b)[-1]
    assert event["event"] == "revoked" and event["detail"]["overtaken"] is True and event["actor"] == "lead"
    assert f"overtaken: {a} was accepted" in refused("lifecycle", service.accept, OWNER, REALM, b)

    # An owner's one-step replacement and a revocation overtake proposals the same way.
    c = proposed(service, BOB, draft("decisions/retry", "decision", "Retry twice.", supersedes=a))
    v3 = service.supersede(OWNER, REALM, a, "Retry 6 times.", "six", "r", {}, None).artifact_id
    assert service.get(BOB, REALM, c).status is Status.REVOKED
    d = proposed(service, BOB, draft("decisions/retry", "decision", "Retry once.", supersedes=v3))
    service.revoke(OWNER, REALM, v3, "retry policy withdrawn")
    assert f"the version it replaces ({v3}) was revoked" in service.get(BOB, REALM, d).revoked_reason
    assert queue(service) == {elsewhere}


def test_a_journal_is_continued_never_replaced_by_a_new_version(service):
    journal = accepted(service, ALICE, draft("agents/ops/journal", "worklog", "Ops journal"))
    for i in range(3):
        service.append(BOB, REALM, journal, f"entry {i}", "r", {})

    message = refused("journal", service.create_draft, BOB, REALM,
                      draft("agents/ops/journal", "worklog", "Ops journal (rewritten)", supersedes=journal))
    assert f"append_memory_artifact(artifact_id='{journal}')" in message
    refused("journal", service.supersede, OWNER, REALM, journal, "b", "s", "r", {}, None)
    assert service.get_by_path(BOB, REALM, "agents/ops/journal").entries_total == 3

    # An owner revokes it to start a new one at the path.
    service.revoke(OWNER, REALM, journal, "a new journal")
    assert service.create_draft(BOB, REALM, draft("agents/ops/journal", "worklog", "Ops journal 2")).status is Status.DRAFT


def test_an_author_keeps_one_draft_per_path(service):
    first = service.create_draft(ALICE, REALM, draft("agents/alice/multi", body="draft 1"))
    message = refused("open_draft", service.create_draft, ALICE, REALM, draft("agents/alice/multi", body="draft 2"))
    assert first.artifact_id in message
    assert service.create_draft(BOB, REALM, draft("agents/alice/multi", body="bob's")).status is Status.DRAFT
    service.update_draft(ALICE, REALM, first.artifact_id, {"body": "draft 2"})
    assert service.own_draft_by_path(ALICE, REALM, "agents/alice/multi", None).body == "draft 2"
    service.submit(ALICE, REALM, first.artifact_id)  # sent for review: the next one may start
    assert service.create_draft(ALICE, REALM, draft("agents/alice/multi", body="draft 3")).status is Status.DRAFT


@pytest.mark.parametrize("field", ["body", "summary", "source_ref"])
def test_an_edit_refuses_whitespace_alone_as_creation_does(service, field):
    made = service.create_draft(ALICE, REALM, draft("agents/alice/scratch"))
    for blank in ("   ", " \t", "\n"):
        refused(field, service.update_draft, ALICE, REALM, made.artifact_id, {field: blank})
    refused("summary", service.update_draft, ALICE, REALM, made.artifact_id, {"summary": "s" * 1001})
    assert getattr(service.get(ALICE, REALM, made.artifact_id), field) == getattr(made, field)
    journal = accepted(service, BOB, draft("agents/bob/worklog", "worklog", "w"))
    refused("body", service.append, ALICE, REALM, journal, " ", "r", {})
    refused("source_ref", service.append, ALICE, REALM, journal, "entry", "\t", {})
    dossier = accepted(service, BOB, draft("dossiers/blank", body="d"))
    refused(field, service.supersede, OWNER, REALM, dossier, *[" " if f == field else "x" for f in ("body", "summary", "source_ref")],
            {}, None)


def test_an_author_creating_drafts_at_one_path_at_once_gets_one(service):
    """The one-draft rule is read in the creating transaction: on PostgreSQL two creations at the
    same moment could both find no draft there."""
    import concurrent.futures

    def create(i: int) -> str:
        try:
            return service.create_draft(ALICE, REALM, draft("agents/alice/race", body=f"draft {i}")).status.value
        except RuleBroken as exc:
            return exc.rule

    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        outcomes = list(pool.map(create, range(12)))
    assert sorted(outcomes) == ["draft"] + ["open_draft"] * 11, outcomes
