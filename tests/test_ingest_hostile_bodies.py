"""Hostile bodies to the ingest API found by fault-injection (round fault9): each is a 4xx that
names what is wrong and stays small, and nothing is stored."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import INGEST_KEY, ingest_url


@pytest.fixture
def ingest(services, service_env):
    services("ingest")
    return ingest_url(service_env)


def post_raw(url: str, raw: bytes, query: str = "") -> httpx.Response:
    return httpx.post(f"{url}/turns{query}", headers={"content-type": "application/json", "x-ingest-key": INGEST_KEY},
                      content=raw, timeout=60)


def test_a_body_of_a_hundred_thousand_unknown_keys_gets_a_short_422_not_a_reply_larger_than_the_body(ingest, r):
    keys = b",".join(b'"k%d": 1' % i for i in range(100_000))
    raw = b"{" + keys + b', "user": "alice", "conversation_id": "c", "turns": []}'
    resp = post_raw(ingest, raw)
    assert resp.status_code == 422, resp.text[:300]
    fields = resp.json()["fields"]
    assert len(resp.content) < 10_000, f"{len(resp.content)} bytes of errors for a {len(raw)}-byte body"
    assert {"field": "turns", "message": "List should have at least 1 item after validation, not 0"} in fields
    assert fields[-1]["field"] == "body" and fields[-1]["message"].startswith(f"{100_000 + 1 - 20} more problems")
    assert r.xlen("recall:turns") == 0


def test_thousands_of_unknown_query_parameters_get_a_short_422(ingest, r):
    query = "?" + "&".join(f"q{i}=1" for i in range(3000))
    resp = post_raw(ingest, b'{"user": "alice", "conversation_id": "c", "turns": []}', query)
    assert resp.status_code == 422 and len(resp.json()["fields"]) == 21, resp.text[:300]
    assert r.xlen("recall:turns") == 0


@pytest.mark.parametrize("raw, field", [
    (b'{"user": "alice", "conversation_id": "c", "turns": [{"role": "user", "text": "a", "ts": "2026-10-08T10:00:00Z"},'
     b' {"role": "user", "text": "b", "ts": "2026-10-08T10:01:00Z", "role": "assistant"}]}', "turns[1].role"),
    (b'{"user": "alice", "conversation_id": "c", "turns": [{"role": "user", "text": "a", "ts": "2026-10-08T10:00:00Z",'
     b' "id": {"x": [1, {"\\ud800": 1, "\\ud800": 2}]}}]}', "turns[0].id.x[1].\\ud800"),
    (b'{"conversation_id": "c", "user": "a", "conversation_id": "d", "turns": []}', "conversation_id"),
])
def test_a_key_given_twice_is_422_naming_where_it_is_in_the_body(ingest, r, raw, field):
    """Fifty turns each have a `text`: the error must say which object gave a key twice."""
    resp = post_raw(ingest, raw)
    assert resp.status_code == 422, resp.text
    assert resp.json()["fields"] == [{"field": field, "message": "given more than once in one JSON object"}]
    assert r.xlen("recall:turns") == 0


def delete(url: str, path_and_query: str) -> httpx.Response:
    return httpx.request("DELETE", f"{url}{path_and_query}", headers={"x-ingest-key": INGEST_KEY}, timeout=10)


@pytest.mark.parametrize("path_and_query, field", [
    ("/users?user=%ff%fe", "user"),
    ("/users?user=%ED%A0%80", "user"),  # a lone surrogate, UTF-8-encoded
    ("/conversations/c?user=al%C3ice", "user"),
    ("/users/%ff%fe", "user"),
    ("/users/al%ED%A0%80ice/retention", "user"),
])
def test_a_user_id_that_is_not_utf8_in_the_url_forgets_nobody_and_is_422_naming_user(ingest, r, path_and_query, field):
    """Its bytes were replaced by U+FFFD: a forget of "\ufffd\ufffd" was accepted (202, then
    `done`) while the user the gateway meant kept everything."""
    resp = delete(ingest, path_and_query)
    assert resp.status_code == 422, resp.text
    assert resp.json()["fields"] == [{"field": field, "message": "not UTF-8 once percent-decoded"}]
    assert r.xlen("recall:turns") == 0


def test_a_user_id_holding_a_real_replacement_character_is_still_forgotten(ingest, r):
    resp = delete(ingest, "/users?user=al%EF%BF%BDice+b")
    assert resp.status_code == 202, resp.text
    assert r.xlen("recall:turns") == 1
