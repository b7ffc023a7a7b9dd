"""Secrets that anybody could know are refused before anything starts (the shipped examples,
placeholders, low entropy; Grafana's `admin` too), without the value reaching the output; the
ingest key can be rotated with two keys valid at once (real services)."""

from __future__ import annotations

import secrets
import subprocess
import sys

import httpx
import pytest

from shared.secret_policy import SHIPPED_EXAMPLES, WeakSecret, check_secret
from tests.conftest import BIN, conversation_payload, ingest_url


@pytest.mark.parametrize("value", sorted(SHIPPED_EXAMPLES) + ["a" * 40, "ab" * 20, "short-but-random-9x", "my-CHANGEME-secret-key-0123456789"])
def test_known_placeholder_short_and_low_entropy_secrets_are_refused(value):
    with pytest.raises(WeakSecret) as refused:
        check_secret("RECALL_JWT_SECRET", value, min_length=32)
    assert "RECALL_JWT_SECRET" in str(refused.value) and value not in str(refused.value)


def test_fresh_random_secrets_pass():
    for _ in range(20):
        check_secret("RECALL_JWT_SECRET", secrets.token_urlsafe(32), min_length=32)
        check_secret("RECALL_INGEST_KEY", secrets.token_hex(16), min_length=24)


@pytest.mark.parametrize(("command", "variable", "value"), [
    ("ingest", "RECALL_INGEST_KEY", "change-me-local-ingest-key"),
    ("serve", "RECALL_JWT_SECRET", "replace-me-with-at-least-32-random-characters"),
    ("serve", "RECALL_JWT_SECRET", "0000000000000000000000000000000000000000"),
    ("indexer", "RECALL_USER_HASH_KEY", "replace-me-with-a-long-random-key"),
    ("ingest", "RECALL_USER_HASH_KEY", "short-but-random-9x"),  # under 32 characters
    ("serve", "RECALL_USER_HASH_KEY", "ab" * 20),
])
def test_a_service_with_a_weak_secret_refuses_to_start_naming_the_variable(service_env, command, variable, value):
    out = subprocess.run([str(BIN / "recall"), command], env={**service_env, variable: value},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert variable in out.stderr and value not in out.stdout + out.stderr


def test_grafana_admin_and_other_foreign_secrets_are_checked_from_the_environment():
    env = {"GF_SECURITY_ADMIN_PASSWORD": "admin", "POSTGRES_PASSWORD": secrets.token_urlsafe(32)}
    out = subprocess.run([sys.executable, "-m", "shared.secret_policy", *env], env=env, capture_output=True, text=True)
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        "refused: GF_SECURITY_ADMIN_PASSWORD is an example value shipped with recall: generate a fresh one "
        "(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"]


def test_a_weak_next_ingest_key_is_refused_too(service_env):
    out = subprocess.run([str(BIN / "recall"), "ingest"], env={**service_env, "RECALL_INGEST_KEY_NEXT": "replace-me-with-a-long-random-key"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "RECALL_INGEST_KEY_NEXT" in out.stderr


def test_ingest_accepts_the_current_and_the_next_key_during_a_rotation(services, service_env):
    new_key = secrets.token_urlsafe(32)
    env = {**service_env, "RECALL_INGEST_KEY_NEXT": new_key}
    services("ingest", RECALL_INGEST_KEY_NEXT=new_key)
    body = conversation_payload("alice", "c1", ["hello"])
    for key, status in ((new_key, 202), (service_env["RECALL_INGEST_KEY"], 202), (secrets.token_urlsafe(32), 401), ("", 401)):
        resp = httpx.post(f"{ingest_url(env)}/turns", headers={"x-ingest-key": key}, json=body, timeout=10)
        assert resp.status_code == status, (status, resp.text)
