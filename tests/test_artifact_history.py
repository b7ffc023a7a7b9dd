"""History links of memory artifacts always agree both ways, on SQLite and on a real PostgreSQL:
a draft that would replace an accepted version must name it (issue 14, section 3)."""

from __future__ import annotations

import concurrent.futures

import pytest

from services.recall.artifacts.models import DraftInput, Role, Status, Target
from services.recall.artifacts.rules import RuleBroken
from services.recall.artifacts.service import ArtifactService, Caller

REALM = "acme-integrations"
OWNER = Caller("lead", {REALM: Role.OWNER})
MEMBER = Caller("member-1", {REALM: Role.MEMBER})


def draft(body: str, path: str = "decisions/contract-7/version", kind: str = "decision", mode: str = "replace",
          supersedes: str | None = None) -> DraftInput:
    return DraftInput(artifact_path=path, artifact_kind=kind, write_mode=mode, body=body, summary=body[:40],
                      source_ref="r", source_context={}, targets=[Target(target_kind="realm", target_id=REALM)],
                      supersedes_artifact_id=supersedes)


def proposed(service: ArtifactService, author: Caller, d: DraftInput) -> str:
    a = service.create_draft(author, REALM, d)
    service.submit(author, REALM, a.artifact_id)
    return a.artifact_id


def assert_history_agrees(service: ArtifactService) -> None:
    """Walk every path's chain: each link is named from both ends, at most one accepted version,
    and the chain from the first version reaches every superseded one."""
    with service.store.transaction() as tx:
        rows = tx.q("SELECT artifact_id, artifact_path, status, supersedes_artifact_id, superseded_by_artifact_id"
                    " FROM artifacts WHERE realm_id = ?", (REALM,))
    by_id = {r[0]: r for r in rows}
    for aid, path, status, supersedes, superseded_by in rows:
        if superseded_by is not None:
            assert status == "superseded", f"{aid} names a successor but is {status}"
            assert by_id[superseded_by][3] == aid, f"{superseded_by} does not name {aid} as the version it supersedes"
        if status == "superseded":
            assert superseded_by is not None, f"superseded {aid} names no successor"
        if supersedes is not None and by_id[aid][2] in ("accepted", "superseded"):
            assert by_id[supersedes][4] == aid, f"{supersedes} does not name {aid} as its successor"
    for path in {r[1] for r in rows}:
        versions = [r for r in rows if r[1] == path and r[2] in ("accepted", "superseded")]
        assert sum(r[2] == "accepted" for r in versions) <= 1
        firsts = [r for r in versions if r[3] is None]
        if versions:
            assert len(firsts) == 1, f"{path}: {len(firsts)} chain starts"
            seen, cur = [], firsts[0]
            while cur is not None:
                seen.append(cur[0])
                cur = by_id.get(cur[4]) if cur[4] else None
            assert sorted(seen) == sorted(r[0] for r in versions), f"{path}: the chain misses versions"


def test_a_draft_that_does_not_name_the_accepted_version_is_refused_at_acceptance(service):
    v1 = proposed(service, MEMBER, draft("Decision: stay on 2.0."))
    stray = proposed(service, MEMBER, draft("Decision: move to 2.1 (no supersedes)."))
    service.accept(OWNER, REALM, v1)
    # It can never be accepted, so it left the review queue when v1 was accepted, saying why.
    with pytest.raises(RuleBroken, match=f"lifecycle: .* revoked \\(overtaken: {v1} was accepted"):
        service.accept(OWNER, REALM, stray)
    assert service.get(OWNER, REALM, v1).status is Status.ACCEPTED
    assert service.get(OWNER, REALM, stray).status is Status.REVOKED
    assert_history_agrees(service)


def test_a_draft_on_a_path_with_an_accepted_version_must_name_it_from_the_start(service):
    v1 = proposed(service, MEMBER, draft("v1"))
    service.accept(OWNER, REALM, v1)
    with pytest.raises(RuleBroken, match=f"path has accepted version {v1}; draft must supersede it"):
        service.create_draft(MEMBER, REALM, draft("v2 without supersedes"))
    with pytest.raises(RuleBroken, match=f"path has accepted version {v1}"):
        service.create_draft(MEMBER, REALM, draft("v2 naming another artifact", supersedes="0" * 32))
    assert service.create_draft(MEMBER, REALM, draft("v2", supersedes=v1)).supersedes_artifact_id == v1


def test_the_constitution_can_require_separate_author_and_reviewer(service):
    from services.recall.artifacts.kind_schemas import Constitution, RolePolicy, dump

    rules_text = dump(Constitution(title="Acme", separate_author_and_reviewer=True,
                                   roles={"researcher": RolePolicy(description="d", may=["start"])}))
    c = proposed(service, OWNER, draft(rules_text, path="population/constitution", kind="constitution"))
    service.accept(OWNER, REALM, c)  # not yet in force while it is being accepted
    mine = proposed(service, MEMBER, draft("Decision by member-1"))
    with pytest.raises(RuleBroken, match="separation_of_duties: the realm constitution requires separate author and reviewer"):
        service.accept(MEMBER, REALM, mine)
    assert service.accept(OWNER, REALM, mine).status is Status.ACCEPTED
    direct = service.supersede(OWNER, REALM, mine, "Owner's direct replacement", "s", "r", {}, None)
    assert direct.status is Status.ACCEPTED, "owners' direct supersede stays"
    assert [e["event"] for e in service.audit(OWNER, REALM, direct.artifact_id)] == ["created", "accepted"]
    assert_history_agrees(service)


def test_a_draft_naming_a_version_that_was_replaced_meanwhile_is_refused(service):
    v1 = proposed(service, MEMBER, draft("v1"))
    service.accept(OWNER, REALM, v1)
    a = proposed(service, MEMBER, draft("v2a", supersedes=v1))
    b = proposed(service, Caller("member-2", {REALM: Role.MEMBER}), draft("v2b", supersedes=v1))
    service.accept(OWNER, REALM, a)
    with pytest.raises(RuleBroken, match=f"revoked \\(overtaken: {a} was accepted .* supersedes_artifact_id='{a}'"):
        service.accept(OWNER, REALM, b)
    assert_history_agrees(service)


def test_a_first_version_that_names_a_predecessor_is_refused(service):
    v1 = proposed(service, MEMBER, draft("v1"))
    service.accept(OWNER, REALM, v1)
    v2 = proposed(service, MEMBER, draft("v2", supersedes=v1))
    service.revoke(OWNER, REALM, v1, "withdrawn")
    with pytest.raises(RuleBroken, match=f"overtaken: the version it replaces \\({v1}\\) was revoked"):
        service.accept(OWNER, REALM, v2)
    assert_history_agrees(service)


def test_history_agrees_both_ways_after_a_mixed_life(service):
    v1 = proposed(service, MEMBER, draft("v1"))
    service.accept(OWNER, REALM, v1)
    v2 = proposed(service, MEMBER, draft("v2", supersedes=v1))
    service.accept(OWNER, REALM, v2)
    v3 = service.supersede(OWNER, REALM, v2, "v3", "v3", "r", {}, None).artifact_id
    v4 = proposed(service, MEMBER, draft("v4", supersedes=v3))
    service.accept(MEMBER, REALM, v4)
    wl = proposed(service, MEMBER, draft("w", path="agents/a/worklog", kind="worklog", mode="append"))
    service.accept(OWNER, REALM, wl)
    service.append(MEMBER, REALM, wl, "more", "r", {})
    with pytest.raises(RuleBroken, match=f"journal: the path holds an accepted journal \\({wl}\\)"):
        service.create_draft(MEMBER, REALM, draft("w2", path="agents/a/worklog", kind="worklog", mode="append"))
    assert [service.get(OWNER, REALM, v).status for v in (v1, v2, v3, v4)] == \
        [Status.SUPERSEDED, Status.SUPERSEDED, Status.SUPERSEDED, Status.ACCEPTED]
    assert_history_agrees(service)


def test_twenty_concurrent_replacements_of_one_version_leave_exactly_one_successor(service):
    v0 = proposed(service, MEMBER, draft("v0"))
    service.accept(OWNER, REALM, v0)
    ids = [proposed(service, Caller(f"agent-{i}", {REALM: Role.MEMBER}), draft(f"version {i}", supersedes=v0))
           for i in range(20)]

    def accept(aid: str) -> str:
        try:
            return service.accept(OWNER, REALM, aid).status.value
        except RuleBroken as exc:
            return exc.rule

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        outcomes = list(pool.map(accept, ids))
    # A loser is refused by the succession rule, or (once the winner's acceptance revoked the
    # overtaken proposals) by its status.
    assert outcomes.count("accepted") == 1 and outcomes.count("supersedes") + outcomes.count("lifecycle") == 19, outcomes
    assert sorted(service.get(OWNER, REALM, aid).status.value for aid in ids) == ["accepted"] + ["revoked"] * 19
    assert_history_agrees(service)
