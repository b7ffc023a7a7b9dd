"""A process killed (kill -9: RECALL_FAULT_INJECT makes it os._exit at the point) between an
artifact change's commit and the realm's index refresh (which runs after the answer, in the index
queue's thread) left search without the change until
the realm's next write; now the change's outbox row, committed with it, brings it to search at
the realm's first search in a restarted process, at a later search once it is old, or with
anyone's next refresh. On SQLite and a real PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.recall.artifacts.artifact_search import ArtifactSearch
from services.recall.artifacts.artifact_store import ArtifactStore
from services.recall.artifacts.models import DraftInput, Role, Target
from services.recall.artifacts.service import ArtifactService, Caller
from shared.engine.api import Engine
from shared.engine.fault_injection import FAULT_ENV, KILLED_EXIT_CODE

REALM = "acme-integrations"
OWNER = Caller("lead", {REALM: Role.OWNER})
MEMBER = Caller("member-1", {REALM: Role.MEMBER})
REPO = Path(__file__).resolve().parents[1]

# A recall process accepting one artifact: killed after the commit, before the index refresh.
ACCEPT_AND_DIE = """
import sys
from pathlib import Path
from services.recall.artifacts.artifact_search import ArtifactSearch
from services.recall.artifacts.artifact_store import ArtifactStore
from services.recall.artifacts.models import DraftInput, Role, Target
from services.recall.artifacts.service import ArtifactService, Caller
from shared.engine.api import Engine

url, data_dir, realm, path, body = sys.argv[1:]
service = ArtifactService(ArtifactStore(url), ArtifactSearch(Path(data_dir), Engine()), Path(data_dir))
member, owner = Caller("member-1", {realm: Role.MEMBER}), Caller("lead", {realm: Role.OWNER})
made = service.create_draft(member, realm, DraftInput(
    artifact_path=path, artifact_kind="dossier", write_mode="replace", body=body, summary=body[:60], source_ref="r",
    source_context={}, targets=[Target(target_kind="entity", target_id="contract-7")]))
service.submit(member, realm, made.artifact_id)
print(made.artifact_id, flush=True)
service.accept(owner, realm, made.artifact_id)
service.index_queue.wait(realm, 120)  # the refresh after the answer: the fault kills the process there
"""


def service_on(url: str, data_dir: Path, embedder) -> ArtifactService:
    return ArtifactService(ArtifactStore(url), ArtifactSearch(data_dir, Engine(embedder=embedder)), data_dir)


def accept_and_die(url: str, data_dir: Path, path: str, body: str) -> str:
    done = subprocess.run([sys.executable, "-c", ACCEPT_AND_DIE, url, str(data_dir), REALM, path, body],
                          capture_output=True, text=True, timeout=180, cwd=REPO,
                          env={**os.environ, FAULT_ENV: "artifact_before_index_refresh"})
    assert done.returncode == KILLED_EXIT_CODE, done.stderr[-2000:]
    return done.stdout.split()[0]


def found(service: ArtifactService, query: str) -> list[str]:
    """The best artifact for the query (search ranks every accepted artifact of a small realm)."""
    return [a["artifact_id"] for a in service.search(MEMBER, REALM, None, None, None, query, 5)][:1]


def unindexed(service: ArtifactService) -> float | None:
    with service.store.transaction() as tx:
        return service.store.oldest_unindexed(tx, REALM)


@pytest.fixture
def running(artifacts_db_url, tmp_path, embedder) -> ArtifactService:
    """A replica that was serving the realm when another one was killed."""
    service = service_on(artifacts_db_url, tmp_path, embedder)
    service.register_entity(MEMBER, REALM, "contract-7", "Contract 7", "contract")
    made = service.create_draft(MEMBER, REALM, DraftInput(
        artifact_path="dossiers/first", artifact_kind="dossier", write_mode="replace", body="Heron survey dossier.",
        summary="Heron survey", source_ref="r", source_context={}, targets=[Target(target_kind="entity", target_id="contract-7")]))
    service.submit(MEMBER, REALM, made.artifact_id)
    service.accept(OWNER, REALM, made.artifact_id)
    assert found(service, "heron survey") == [made.artifact_id]
    return service


def test_a_change_committed_by_a_killed_process_is_searchable_at_the_realms_first_search_after_a_restart(
        running, artifacts_db_url, tmp_path, embedder):
    orphan = accept_and_die(artifacts_db_url, tmp_path, "dossiers/osprey", "Osprey migration dossier of contract 7.")
    assert running.get(MEMBER, REALM, orphan).status.value == "accepted"  # committed
    assert unindexed(running) is not None  # and not in search

    restarted = service_on(artifacts_db_url, tmp_path, embedder)
    assert found(restarted, "osprey migration") == [orphan]
    assert unindexed(restarted) is None


def test_a_replica_already_serving_the_realm_takes_a_dead_replicas_change_once_it_is_old(running, artifacts_db_url, tmp_path):
    orphan = accept_and_die(artifacts_db_url, tmp_path, "dossiers/osprey", "Osprey migration dossier of contract 7.")
    assert found(running, "osprey migration") != [orphan], "a young change may still be on its way (its own refresh)"
    running.catch_up_after_s = 0.0  # it is old now
    assert found(running, "osprey migration") == [orphan]
    assert unindexed(running) is None


def test_anyones_next_refresh_takes_a_dead_processs_change_along(running, artifacts_db_url, tmp_path):
    orphan = accept_and_die(artifacts_db_url, tmp_path, "dossiers/osprey", "Osprey migration dossier of contract 7.")
    made = running.create_draft(MEMBER, REALM, DraftInput(
        artifact_path="dossiers/pelican", artifact_kind="dossier", write_mode="replace", body="Pelican rollout dossier.",
        summary="Pelican rollout", source_ref="r", source_context={}, targets=[Target(target_kind="entity", target_id="contract-7")]))
    running.submit(MEMBER, REALM, made.artifact_id)
    running.accept(OWNER, REALM, made.artifact_id)
    assert running.index_queue.wait(REALM, 60)
    assert unindexed(running) is None
    assert found(running, "osprey migration") == [orphan]
    assert found(running, "pelican rollout") == [made.artifact_id]


def test_a_search_never_waits_for_a_refresh_in_progress_to_catch_up(running, artifacts_db_url, tmp_path):
    """While another refresh holds the realm, the search answers from the index as it is (that
    refresh takes the change along), instead of queueing behind it."""
    import time

    orphan = accept_and_die(artifacts_db_url, tmp_path, "dossiers/osprey", "Osprey migration dossier of contract 7.")
    running.catch_up_after_s = 0.0
    with running.index._realm_lock(REALM):
        started = time.monotonic()
        assert found(running, "osprey migration") != [orphan]
        assert time.monotonic() - started < 5
    assert unindexed(running) is not None
