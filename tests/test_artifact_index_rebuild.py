"""A realm's search index brought up to its database: a whole rebuild (after a refresh that did
not finish) on SQLite and a real PostgreSQL, with the real engine."""

from __future__ import annotations

import time
import tracemalloc
import uuid
from pathlib import Path

from services.recall.artifacts.artifact_search import ArtifactSearch
from services.recall.artifacts.artifact_store import ArtifactStore
from services.recall.artifacts.models import Artifact, Role, Status, Target
from services.recall.artifacts.service import INDEX_PAGE, ArtifactService, Caller
from shared.engine.api import Engine
from tests.conftest import wait_until

REALM = "acme-integrations"
MEMBER = Caller("member-1", {REALM: Role.MEMBER})


def accepted_directly(service: ArtifactService, count: int, context_chars: int, realm: str = REALM) -> list[str]:
    """`count` accepted dossiers written in one transaction, each with a large source_context
    (stored, never indexed), and their outbox rows."""
    now = time.time()
    made = [Artifact(artifact_id=uuid.uuid4().hex, realm_id=realm, artifact_path=f"dossiers/heron-{i}",
                     artifact_kind="dossier", write_mode="replace", status=Status.ACCEPTED, body=f"Heron survey {i}.",
                     summary=f"Heron {i}", source_ref="r", source_context={"notes": "x" * context_chars}, author="member-1",
                     created_at=now, updated_at=now, targets=[Target(target_kind="realm", target_id=realm)])
            for i in range(count)]
    with service.store.transaction() as tx:
        for a in made:
            service.store.insert(tx, a)
        service.store.mark_for_index(tx, realm, [a.artifact_id for a in made])
    return [a.artifact_id for a in made]


def test_a_whole_rebuild_reads_the_realm_a_page_at_a_time(service):
    """A rebuild loaded every accepted artifact with its entries at once: a realm of 150 artifacts
    with 50,000-character source contexts held them all (over 7 MB); now a page of INDEX_PAGE."""
    ids = accepted_directly(service, 150, 50_000)
    assert service.reindex(REALM)
    (service.index.home(REALM) / "refresh.unfinished").touch()  # the last refresh did not finish: rebuild whole
    stale = service.index.home(REALM) / "src" / "gone.funes.jsonl"
    stale.write_text("")
    tracemalloc.start()
    try:
        assert service.reindex(REALM)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 150 * 50_000 / 2, f"peak {peak:,} bytes for pages of {INDEX_PAGE}"
    assert not stale.exists()
    assert sorted(p.name.split(".")[0] for p in (service.index.home(REALM) / "src").iterdir()) == sorted(ids)
    found = service.search(MEMBER, REALM, None, None, None, "heron survey 149", 1)
    assert [a["artifact_id"] for a in found] == [ids[149]]


def test_a_starting_recall_service_brings_every_realm_left_behind_up_to_date_before_any_search(
        services, service_env, artifacts_db_url, embedder):
    """A realm whose index missed changes (a process killed between commit and refresh) healed only
    at its first search, or with its next write: search's first caller paid for the catch-up."""
    data_dir = Path(service_env["RECALL_DATA_DIR"])
    writer = ArtifactService(ArtifactStore(artifacts_db_url), ArtifactSearch(data_dir, Engine(embedder=embedder)), data_dir)
    left = {realm: accepted_directly(writer, 2, 10, realm) for realm in (REALM, "acme-billing")}
    with writer.store.transaction() as tx:
        assert writer.store.realms_behind(tx, 10) == [REALM, "acme-billing"]
    services("serve", RECALL_ARTIFACTS_DB_URL=artifacts_db_url)

    def behind() -> list[str]:
        with writer.store.transaction() as tx:
            return writer.store.realms_behind(tx, 10)
    assert wait_until(lambda: not behind(), 120), behind()
    for realm, ids in left.items():
        src = writer.index.home(realm) / "src"
        assert sorted(p.name.split(".")[0] for p in src.iterdir()) == sorted(ids)


def test_an_append_to_a_long_journal_rewrites_only_its_last_file_of_entries(service):
    """Each append rewrote the journal's whole transcript — every entry read from the database,
    written, and read again by the index run — so appends grew slower with the journal."""
    from services.recall.artifacts.artifact_search import ENTRIES_PER_FILE

    [wl] = accepted_directly(service, 1, 10)
    with service.store.transaction() as tx:
        service.store.update_fields(tx, wl, artifact_kind="worklog", write_mode="append")
        for i in range(3 * ENTRIES_PER_FILE - 1):
            service.store.add_entry(tx, wl, f"Step {i}: checked gauge{i}x.", "member-1", "r", {})
    assert service.reindex(REALM)
    src = service.index.home(REALM) / "src"
    files = [src / f"{wl}.e{k}.funes.jsonl" for k in range(4)]
    assert [f.exists() for f in files] == [True, True, True, False]

    def stamps(paths):
        return [(p.stat().st_ino, p.stat().st_mtime_ns) for p in paths]
    before = stamps(files[:2])
    service.append(MEMBER, REALM, wl, "Step 149: found the heron valve.", "r", {})  # the last file fills up
    assert service.index_queue.wait(REALM, 60)
    assert stamps(files[:2]) == before
    assert "heron valve" in files[2].read_text() and not files[3].exists()
    before = stamps(files[:3])
    service.append(MEMBER, REALM, wl, "Step 150: replaced the osprey gasket.", "r", {})  # a new file begins
    assert service.index_queue.wait(REALM, 60)
    assert stamps(files[:3]) == before
    assert "osprey gasket" in files[3].read_text()
    for query in ("heron valve", "osprey gasket", "gauge7x"):
        assert [a["artifact_id"] for a in service.search(MEMBER, REALM, None, None, None, query, 1)] == [wl], query
    service.revoke(Caller("lead", {REALM: Role.OWNER}), REALM, wl, "wrong")
    assert service.index_queue.wait(REALM, 60)
    assert list(src.iterdir()) == []
