"""Searching memory artifacts (seed 004, step 8) on SQLite and a real PostgreSQL: search by
object with a query finds the object's artifacts however many others rank above them."""

from __future__ import annotations

import pytest

from services.recall.artifacts.artifact_search import ArtifactSearch
from services.recall.artifacts.artifact_store import ArtifactStore
from services.recall.artifacts.models import DraftInput, Role, Target
from services.recall.artifacts.service import ArtifactService, Caller
from shared.engine.api import Engine

REALM = "acme-integrations"
OWNER = Caller("lead", {REALM: Role.OWNER})
MEMBER = Caller("member-1", {REALM: Role.MEMBER})


@pytest.fixture
def service(artifacts_db_url, tmp_path, embedder) -> ArtifactService:
    return ArtifactService(ArtifactStore(artifacts_db_url), ArtifactSearch(tmp_path, Engine(embedder=embedder)), tmp_path)


def accepted(service: ArtifactService, path: str, body: str, entity: str, kind: str = "dossier") -> str:
    mode = "append" if kind == "worklog" else "replace"
    made = service.create_draft(MEMBER, REALM, DraftInput(
        artifact_path=path, artifact_kind=kind, write_mode=mode, body=body, summary=body[:80], source_ref="r",
        source_context={}, targets=[Target(target_kind="entity", target_id=entity)]))
    service.submit(MEMBER, REALM, made.artifact_id)
    return service.accept(OWNER, REALM, made.artifact_id).artifact_id


def test_search_by_object_with_a_query_finds_its_artifacts_below_the_realms_best_hits(service):
    """The query was ranked over the whole realm's top few dozen passages and only then filtered by
    target: an object whose artifacts ranked below them had "nothing" (the seed's step 8)."""
    for entity in ("contract-7", "contract-8"):
        service.register_entity(MEMBER, REALM, entity, entity, "contract")
    for i in range(40):
        accepted(service, f"dossiers/contract-8/retry-{i}",
                 f"Retry field study {i}: the retry field of contract 8 changes its retry semantics in 2.1.", "contract-8")
    mine = accepted(service, "dossiers/contract-7/notes", "Contract 7 notes: the vendor mentioned a retry once.", "contract-7")
    decision = accepted(service, "decisions/contract-8/x", "Decision about the retry field of contract 8.", "contract-8", "decision")

    found = service.search(MEMBER, REALM, "entity", "contract-7", None, "retry field semantics", 10)
    assert [a["artifact_id"] for a in found] == [mine]
    # A kind filter is exact too, whatever ranks above it.
    found = service.search(MEMBER, REALM, None, None, "decision", "retry field study semantics", 10)
    assert [a["artifact_id"] for a in found] == [decision]
    # Without filters the query still ranks the realm, limit respected.
    assert len(service.search(MEMBER, REALM, None, None, None, "retry field", 10)) == 10
