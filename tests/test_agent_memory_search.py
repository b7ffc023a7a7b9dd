"""AgentMemory search words and changes (review8a), on SQLite and a real PostgreSQL: a query
finds records whatever their letters' case in any script, takes its words literally, and a
change that would null a required field is a 422 naming it, never a 500."""

from __future__ import annotations

import httpx
import pytest
from fastmcp import Client
from fastmcp.client.auth import BearerAuth

from services.recall.agent_memory.memory_store import MemoryStore
from services.recall.agent_memory.models import RecordInput
from services.recall.agent_memory.service import AgentMemoryService
from services.recall.artifacts.artifact_search import ArtifactSearch
from services.recall.artifacts.artifact_store import ArtifactStore
from services.recall.artifacts.models import Role
from services.recall.artifacts.service import ArtifactService, Caller
from shared.engine.api import Engine
from tests.conftest import mint, recall_url

REALM = "acme-integrations"
REALM_TARGET = [{"target_kind": "realm", "target_id": REALM}]
ALICE = Caller("alice", {REALM: Role.MEMBER})


@pytest.fixture
def realm_server(services, service_env, artifacts_db_url):
    services("serve", RECALL_ARTIFACTS_DB_URL=artifacts_db_url)
    return service_env


def record(title: str, content: str = "Confirmed on the call.") -> dict:
    return {"memory_type": "fact", "reality": "current_state", "title": title, "summary": title, "content": content,
            "targets": REALM_TARGET}


async def search(env, query: str) -> list[str]:
    async with Client(f"{recall_url(env)}/mcp", auth=BearerAuth(mint("agent", realms={REALM: "reader"}))) as client:
        found = (await client.call_tool("search_agent_memory", {"realm_id": REALM, "query": query})).structured_content
    return [r["title"] for r in found["records"]]


async def test_query_words_match_any_case_in_any_script_and_literally(realm_server):
    """SQLite's LOWER() (and PostgreSQL's under a C locale) leaves Cyrillic as it is, so
    "контракт" never found "Контракт 7"; `_` and `%` were dropped from the query words, so
    "retry_field" found nothing."""
    alice = httpx.Client(base_url=f"{recall_url(realm_server)}/realms/{REALM}", timeout=30,
                         headers={"authorization": f"Bearer {mint('alice', realms={REALM: 'member'})}"})
    for title, content in [("Контракт 7: поле повтора", "Поставщик ПОДТВЕРДИЛ исправление."),
                           ("Straße B uses the retry_field", "50% of calls retry."),
                           ("Another contract", "retryXfield is a different thing; 50 of calls.")]:
        assert alice.post("/memory", json=record(title, content)).status_code == 201
    assert await search(realm_server, "контракт") == ["Контракт 7: поле повтора"]
    assert await search(realm_server, "КОНТРАКТ подтвердил") == ["Контракт 7: поле повтора"]
    assert await search(realm_server, "STRASSE") == ["Straße B uses the retry_field"]
    assert await search(realm_server, "retry_field") == ["Straße B uses the retry_field"]
    assert await search(realm_server, "50%") == ["Straße B uses the retry_field"]
    assert await search(realm_server, "retry\\") == []
    assert alice.post("/memory", json={**record("Tagged"), "tags": ["vendor"]}).status_code == 201
    async with Client(f"{recall_url(realm_server)}/mcp", auth=BearerAuth(mint("agent", realms={REALM: "reader"}))) as client:
        tagged = (await client.call_tool("search_agent_memory", {"realm_id": REALM, "tag": "Vendor"})).structured_content
    assert [r["title"] for r in tagged["records"]] == ["Tagged"], "tags are lowercase: a capital asks for the same tag"
    listed = alice.get("/memory", params={"q": "поставщик"}).json()["records"]
    assert [r["title"] for r in listed] == ["Контракт 7: поле повтора"]

    # A change of the text is what the next search sees.
    rid = listed[0]["record_id"]
    assert alice.patch(f"/memory/{rid}", json={"title": "Договор 7", "summary": "Договор 7"}).status_code == 200
    assert await search(realm_server, "договор") == ["Договор 7"]
    assert await search(realm_server, "контракт") == []


async def test_a_change_that_nulls_a_required_field_is_422_naming_it(realm_server):
    """PATCH {"title": null} reached the database as NULL: a NOT NULL violation, a bare 500."""
    alice = httpx.Client(base_url=f"{recall_url(realm_server)}/realms/{REALM}", timeout=30,
                         headers={"authorization": f"Bearer {mint('alice', realms={REALM: 'member'})}"})
    made = alice.post("/memory", json={**record("Contract 7"), "valid_until": "2099-01-01T00:00:00Z", "tags": ["a"]})
    rid = made.json()["record_id"]
    for field in ("memory_type", "title", "summary", "content", "reality", "targets", "tags", "citations", "source_ref",
                  "source_context"):
        resp = alice.patch(f"/memory/{rid}", json={field: None})
        assert resp.status_code == 422 and resp.json()["error"] == field, (field, resp.text)
    cleared = alice.patch(f"/memory/{rid}", json={"valid_until": None, "tags": []})
    assert cleared.status_code == 200 and cleared.json()["valid_until"] is None and cleared.json()["tags"] == []
    assert alice.get(f"/memory/{rid}").json()["title"] == "Contract 7"


def test_a_database_made_before_search_text_is_migrated_and_searchable(artifacts_db_url, tmp_path, embedder):
    """An older artifacts database has agent_memory_records without search_text: the first
    transaction adds it and fills it for the records already there."""
    old = ArtifactStore(artifacts_db_url)
    with old.transaction() as tx:
        tx.q("""CREATE TABLE agent_memory_records (
            record_id TEXT PRIMARY KEY, realm_id TEXT NOT NULL, memory_type TEXT NOT NULL, title TEXT NOT NULL,
            summary TEXT NOT NULL, content TEXT NOT NULL, reality TEXT NOT NULL, valid_from DOUBLE PRECISION,
            valid_until DOUBLE PRECISION, author TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL, status TEXT NOT NULL)""")
        tx.q("INSERT INTO agent_memory_records VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
             ("old-1", REALM, "fact", "Старый Контракт", "s", "c", "current_state", None, None, "alice", 1.0, 1.0, "active"))
    store = ArtifactStore(artifacts_db_url)
    memory = AgentMemoryService(MemoryStore(store), ArtifactService(store, ArtifactSearch(tmp_path, Engine(embedder=embedder)),
                                                                    tmp_path), tmp_path)
    assert [r["record_id"] for r in memory.search(ALICE, REALM, query="контракт")] == ["old-1"]
    shown = memory.get(ALICE, REALM, "old-1")  # written before records carried their source
    assert (shown["source_ref"], shown["source_context"]) == (None, {})
    new = memory.create(ALICE, REALM, RecordInput.model_validate(record("Новый контракт")))
    assert {r["record_id"] for r in memory.search(ALICE, REALM, query="КОНТРАКТ")} == {"old-1", new["record_id"]}
