"""Every mistake a user can make with `recall` gets one clear line and the right exit code, before
anything starts; `--help` documents every variable that is read."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.config_check import ENGINE_VARIABLES
from services.stack import StackSettings
from shared.engine.embedder import EmbedderSettings
from shared.redis_server import EmbeddedRedis, RedisStartError
from shared.tenant_paths import user_hash
from tests.conftest import BIN, REPO, free_port, user_hash_under, wait_until

JWT = secrets.token_urlsafe(32)
INGEST_KEY = secrets.token_urlsafe(24)


def recall(*args: str, cwd: Path, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RECALL_")}
    return subprocess.run([str(BIN / "recall"), *args], cwd=cwd, env={**clean, **env}, capture_output=True, text=True,
                          timeout=timeout)


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def free_ports() -> dict[str, str]:
    return {v: str(free_port()) for v in ("RECALL_INGEST_PORT", "RECALL_INDEXER_PORT", "RECALL_RECALL_PORT")}


def test_an_invalid_setting_is_one_line_naming_variable_value_and_rule_and_nothing_starts(tmp_path):
    started = time.monotonic()
    result = recall("up", cwd=tmp_path, RECALL_K="0", **free_ports())
    assert result.returncode == 2
    line = one_line(result)
    assert "RECALL_K='0'" in line and "greater than or equal to 1" in line, line
    assert not (tmp_path / "data" / "redis").exists() and time.monotonic() - started < 20


def test_several_mistakes_are_all_reported_at_once(tmp_path):
    result = recall("up", cwd=tmp_path, RECALL_K="many", RECALL_ENGINE="gpt", **free_ports())
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 2 and "Traceback" not in result.stderr, result.stderr
    assert any("RECALL_K='many'" in ln and "integer" in ln for ln in lines)
    assert any("RECALL_ENGINE='gpt'" in ln and "embedded|funes" in ln for ln in lines)


def test_the_embedding_model_settings_are_checked_too(tmp_path):
    result = recall("up", cwd=tmp_path, RECALL_EMBEDDER="bert", **free_ports())
    assert result.returncode == 2 and "RECALL_EMBEDDER='bert'" in one_line(result) and "'e5', 'e5-q4' or 'minilm'" in one_line(result)


def test_jwks_tokens_are_refused_before_anything_starts_unless_issuer_and_audience_are_named(tmp_path):
    """An identity provider signs tokens for many services: without `iss` and `aud` checks a token
    it issued for another API was a valid recall token."""
    result = recall("up", cwd=tmp_path, RECALL_JWKS_URL="https://idp.example/jwks.json", RECALL_JWT_ISSUER="https://idp.example/",
                    **free_ports())
    assert result.returncode == 2
    assert one_line(result).startswith("recall up: RECALL_JWKS_URL needs RECALL_JWT_ISSUER and RECALL_JWT_AUDIENCE"), one_line(result)
    assert not (tmp_path / "data" / "redis").exists()


def test_a_rule_across_variables_is_one_line_that_shows_no_setting_value(tmp_path):
    """A model-level rule's input is every setting read: printing it printed the secrets."""
    result = recall("up", cwd=tmp_path, RECALL_REPLICAS="3", RECALL_JWT_SECRET=JWT, RECALL_INGEST_KEY=INGEST_KEY, **free_ports())
    assert result.returncode == 2
    line = one_line(result)
    assert line.startswith("recall up: RECALL_REPLICAS=3 needs RECALL_ARTIFACTS_DB_URL=postgresql://"), line
    assert JWT not in line and INGEST_KEY not in line and "RECALL_?" not in line and "{" not in line, line


def test_a_validators_message_keeps_the_variable_name_it_starts_with(tmp_path):
    result = recall("up", cwd=tmp_path, RECALL_JWT_SECRET="too-short", **free_ports())
    line = one_line(result)
    assert "not allowed: RECALL_JWT_SECRET must be at least 32 characters" in line, line


@pytest.mark.parametrize("variable, value, named", [
    ("RECALL_ARTIFACTS_DB_URL", "mysql://db/recall", "sqlite:///<path> or postgresql://"),
    ("RECALL_JWKS_URL", "issuer.example/jwks.json", "https:// URL"),
    ("RECALL_JWKS_URL", "http://issuer.example/jwks.json", "https:// URL"),
    ("RECALL_JWKS_URL", "https://", "https:// URL"),
])
def test_an_unknown_database_or_jwks_url_is_refused_before_anything_starts(tmp_path, variable, value, named):
    result = recall("up", cwd=tmp_path, **{variable: value}, **free_ports())
    assert result.returncode == 2
    line = one_line(result)
    assert f"{variable}='{value}' is not allowed" in line and named in line, line
    assert not (tmp_path / "data" / "redis").exists()


@pytest.mark.parametrize("env, named", [
    ({"RECALL_LOG_LEVEL": "LOUD"}, "RECALL_LOG_LEVEL='LOUD' is not allowed: must be one of DEBUG, INFO"),
    ({"RECALL_STREAM": ""}, "RECALL_STREAM='' is not allowed"),
    ({"RECALL_ENGINE": "funes", "RECALL_FUNES_BIN": "/nonexistent/funes"},
     "RECALL_FUNES_BIN='/nonexistent/funes' is not allowed: no executable"),
    ({"RECALL_INGEST_HOST": "999.1.1.1"}, "RECALL_INGEST_HOST='999.1.1.1' is not allowed: cannot listen on 999.1.1.1:"),
    ({"RECALL_TIMEOUT_S": "inf"}, "RECALL_TIMEOUT_S='inf' is not allowed: input should be a finite number"),
    ({"RECALL_DEFAULT_TIME_ZONE": "Europe/Atlantis"},
     "RECALL_DEFAULT_TIME_ZONE='Europe/Atlantis' is not allowed: must be an IANA time zone name"),
])
def test_settings_a_child_would_die_or_hang_on_are_one_line_before_anything_starts(tmp_path, env, named):
    """Each used to pass the check: the children then died with `KeyError: 'level loud'`, the
    stack waited two minutes for a funes that does not exist, or a bad address was 'in use'."""
    started = time.monotonic()
    result = recall("up", cwd=tmp_path, timeout=60, **env, **free_ports())
    assert result.returncode == 2, result.stderr[-2000:]
    assert named in one_line(result), one_line(result)
    assert "already in use" not in one_line(result)
    assert not (tmp_path / "data" / "redis").exists() and time.monotonic() - started < 30


def test_service_commands_refuse_a_missing_funes_binary_too(tmp_path):
    for command, port in (("indexer", "RECALL_INDEXER_PORT"), ("serve", "RECALL_RECALL_PORT")):
        result = recall(command, cwd=tmp_path, RECALL_ENGINE="funes", RECALL_FUNES_BIN="no-such-funes-here",
                        RECALL_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", RECALL_JWT_SECRET=JWT, **{port: str(free_port())})
        assert result.returncode == 2 and "RECALL_FUNES_BIN='no-such-funes-here'" in one_line(result), result.stderr


@pytest.mark.parametrize("command, env, named", [
    ("indexer", {"RECALL_EMBEDDER": "bert"}, "recall indexer: RECALL_EMBEDDER='bert' is not allowed: input should be 'e5'"),
    ("serve", {"RECALL_EMBEDDER": "bert"}, "recall serve: RECALL_EMBEDDER='bert' is not allowed: input should be 'e5'"),
    ("ingest", {"RECALL_REDIS_URL": "http://:pw-1234@redis:6379"},
     "recall ingest: RECALL_REDIS_URL='http://(hidden)@redis:6379' is not allowed: must start with redis://"),
    ("serve", {"RECALL_REDIS_URL": "127.0.0.1:6379"}, "recall serve: RECALL_REDIS_URL='127.0.0.1:6379' is not allowed"),
    ("serve", {"RECALL_REDIS_URL": "default:pw-1234@redis:6379"}, "recall serve: RECALL_REDIS_URL='default:(hidden)@redis"),
    ("indexer", {"RECALL_REDIS_URL": "redis:/:pw-1234@redis"}, "recall indexer: RECALL_REDIS_URL='redis:/(hidden)@redis'"),
    ("indexer", {"RECALL_REDIS_URL": ""}, "recall indexer: RECALL_REDIS_URL is not set: the indexer needs the Redis"),
    ("ingest", {"RECALL_INGEST_KEY": ""}, "recall ingest: RECALL_INGEST_KEY is not set"),
])
def test_a_service_started_alone_with_a_bad_setting_says_so_in_one_line_naming_it(tmp_path, command, env, named):
    """An SRE's trial: the embedder's settings were read only when the model loaded (a pydantic
    traceback naming EmbedderSettings), a Redis URL without its scheme and a missing Redis URL or
    ingest key were exit-1 crashes that said to run --debug for the traceback."""
    env = {"RECALL_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "RECALL_JWT_SECRET": JWT, "RECALL_INGEST_KEY": INGEST_KEY,
           "RECALL_DATA_DIR": str(tmp_path / "data"), **free_ports(), **env}
    result = recall(command, cwd=tmp_path, timeout=60, **env)
    assert result.returncode == 2 and one_line(result).startswith(named), result.stderr[-2000:]
    assert "pw-1234" not in result.stderr and "--debug" not in result.stderr


def test_an_indexer_whose_redis_does_not_answer_at_start_says_so_in_one_line(tmp_path):
    result = recall("indexer", cwd=tmp_path, timeout=60, RECALL_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
                    RECALL_DATA_DIR=str(tmp_path / "data"), RECALL_INDEXER_PORT=str(free_port()))
    assert result.returncode == 1 and one_line(result).startswith("recall indexer: RECALL_REDIS_URL: Redis does not "
                                                                  "answer (ConnectionError"), result.stderr[-2000:]
    assert "--debug" not in result.stderr


def test_an_indexer_or_replica_on_another_data_dir_than_the_deployments_is_refused_in_one_line(tmp_path, redis_url, r):
    """An SRE's trial: an indexer on a mistyped RECALL_DATA_DIR created it, said ready and took
    its share of the stream into it; its forgets answered done while the files stayed where the
    replicas read them."""
    from concurrent.futures import ThreadPoolExecutor

    from shared.data_dir_identity import KEY, local_id, shared_dir_problem

    shared, typo = tmp_path / "data", tmp_path / "typo" / "data"
    shared.mkdir()
    with ThreadPoolExecutor(8) as pool:  # services starting at once on a fresh volume agree on its id
        assert len(set(pool.map(lambda _: local_id(shared), range(8)))) == 1
    r.delete(KEY)
    try:
        assert shared_dir_problem(redis_url, shared, register=True) is None, "the first indexer names the deployment's"
        assert r.get(KEY) == local_id(shared)
        for command, port in (("indexer", "RECALL_INDEXER_PORT"), ("serve", "RECALL_RECALL_PORT")):
            result = recall(command, cwd=tmp_path, timeout=60, RECALL_REDIS_URL=redis_url, RECALL_DATA_DIR=str(typo),
                            RECALL_JWT_SECRET=JWT, **{port: str(free_port())})
            assert result.returncode == 2, result.stderr[-2000:]
            assert one_line(result).startswith(f"recall {command}: RECALL_DATA_DIR={typo} is not the data directory the "
                                               "other services on this Redis use"), one_line(result)
        assert shared_dir_problem(redis_url, shared, register=False) is None
    finally:
        r.delete(KEY)


def test_a_keyed_user_hash_is_an_hmac_under_the_key_not_the_guessable_sha256():
    import hashlib
    import hmac

    key = secrets.token_urlsafe(32)
    keyed = user_hash_under(key, "ursula@example.com")
    assert keyed == hmac.new(key.encode(), b"ursula@example.com", hashlib.sha256).hexdigest()[:24]
    assert keyed != hashlib.sha256(b"ursula@example.com").hexdigest()[:24] == user_hash("ursula@example.com")
    assert user_hash_under(secrets.token_urlsafe(32), "ursula@example.com") != keyed
    assert len(user_hash_under(key, "\udc80 lone surrogate")) == 24  # total, as unkeyed


def test_a_service_with_another_user_hash_key_than_the_deployments_is_refused_in_one_line(tmp_path, redis_url, r):
    """Every process must hash users alike, or a tenant's turns land where its reads never look:
    the first service records its key's fingerprint (never the key), a later one with another
    key, or none, is refused naming RECALL_USER_HASH_KEY."""
    from shared.user_hash_scheme import FILE, KEY

    first, other = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    data = tmp_path / "data"
    r.flushdb()
    base = dict(RECALL_REDIS_URL=redis_url, RECALL_DATA_DIR=str(data), RECALL_JWT_SECRET=JWT, RECALL_INGEST_KEY=INGEST_KEY)
    indexer = subprocess.Popen([str(BIN / "recall"), "indexer"], cwd=tmp_path, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True,
                               env={**{k: v for k, v in os.environ.items() if not k.startswith("RECALL_")}, **base,
                                    "RECALL_USER_HASH_KEY": first, "RECALL_INDEXER_PORT": str(free_port())})
    try:
        assert wait_until(lambda: (data / FILE).exists() and r.get(KEY) is not None or indexer.poll() is not None, 60)
        assert indexer.poll() is None, indexer.stderr.read()
        recorded = (data / FILE).read_text().strip()
        assert r.get(KEY) == recorded and recorded.startswith("hmac-sha256:") and first not in recorded
        for command, port in (("indexer", "RECALL_INDEXER_PORT"), ("serve", "RECALL_RECALL_PORT"), ("ingest", "RECALL_INGEST_PORT")):
            for key in (other, ""):
                result = recall(command, cwd=tmp_path, timeout=60, **base, RECALL_USER_HASH_KEY=key, **{port: str(free_port())})
                assert result.returncode == 2, result.stderr[-2000:]
                line = one_line(result)
                assert line.startswith(f"recall {command}: RECALL_USER_HASH_KEY is not"), line
                assert first not in line and other not in line
        assert (data / FILE).read_text().strip() == recorded and r.get(KEY) == recorded, "a refused one records nothing"
    finally:
        indexer.kill()
        indexer.wait()
        r.flushdb()


def _unkeyed_data_dir_of_an_older_release(data: Path) -> None:
    """A data dir as releases before the keyed hash left it: tenants under sha256, no record."""
    (data / user_hash("alice") / "src").mkdir(parents=True)
    (data / user_hash("alice") / "src" / "c1.funes.jsonl").write_text("")


def test_a_key_given_to_an_unkeyed_deployment_is_refused_naming_why(tmp_path, redis_url, r):
    data = tmp_path / "data"
    _unkeyed_data_dir_of_an_older_release(data)
    r.flushdb()
    key = secrets.token_urlsafe(32)
    try:
        for command, port in (("indexer", "RECALL_INDEXER_PORT"), ("serve", "RECALL_RECALL_PORT")):
            result = recall(command, cwd=tmp_path, timeout=60, RECALL_REDIS_URL=redis_url, RECALL_DATA_DIR=str(data),
                            RECALL_JWT_SECRET=JWT, RECALL_USER_HASH_KEY=key, **{port: str(free_port())})
            assert result.returncode == 2, result.stderr[-2000:]
            line = one_line(result)
            assert line.startswith(f"recall {command}: RECALL_USER_HASH_KEY is set, but the data directory {data} holds "
                                   "tenants under unkeyed user hashes"), line
            assert "memories would become unreachable" in line and "Keying the user hash" in line
        # `recall up` says so before it starts anything.
        up = recall("up", cwd=tmp_path, timeout=60, RECALL_USER_HASH_KEY=key, **free_ports())
        assert up.returncode == 2 and "RECALL_USER_HASH_KEY is set, but" in one_line(up), up.stderr[-2000:]
        assert not (data / "redis").exists()
        # A Redis whose stream holds events of an older release: ingest has no data dir to tell it.
        r.xadd("recall:turns", {"kind": "turns", "user_hash": user_hash("alice"), "conversation_id": "c1", "event": "{}"})
        result = recall("ingest", cwd=tmp_path, timeout=60, RECALL_REDIS_URL=redis_url, RECALL_INGEST_KEY=INGEST_KEY,
                        RECALL_USER_HASH_KEY=key, RECALL_INGEST_PORT=str(free_port()))
        assert result.returncode == 2 and "RECALL_USER_HASH_KEY is set, but the deployment's Redis holds tenants under " \
            "unkeyed" in one_line(result), result.stderr[-2000:]
    finally:
        r.flushdb()


async def test_an_unkeyed_deployment_of_an_older_release_keeps_working_without_a_key(services, service_env, r):
    from shared.user_hash_scheme import FILE, KEY, UNKEYED
    from tests.conftest import call_recall, indexed_chunks, mint, post_conversation

    data = Path(service_env["RECALL_DATA_DIR"])
    ingest, indexer = services("ingest"), services("indexer")
    post_conversation(service_env, "alice", "c1", ["The pump P-7 overheats at noon.", "noted"])
    assert wait_until(lambda: indexed_chunks(service_env, "alice") == 2, 30)
    indexer.kill()
    ingest.kill()
    (data / FILE).unlink()  # as an older release left it: tenants under sha256, nothing recorded
    r.delete(KEY)
    refused = recall("indexer", cwd=data.parent, timeout=60, RECALL_REDIS_URL=service_env["RECALL_REDIS_URL"],
                     RECALL_DATA_DIR=str(data), RECALL_USER_HASH_KEY=secrets.token_urlsafe(32),
                     RECALL_INDEXER_PORT=str(free_port()))
    assert refused.returncode == 2 and "memories would become unreachable" in one_line(refused)
    services("indexer"), services("ingest"), services("serve")
    assert (data / FILE).read_text().strip() == UNKEYED and r.get(KEY) == UNKEYED
    assert "P-7 overheats" in await call_recall(service_env, mint("alice"), "pump P-7")
    post_conversation(service_env, "alice", "c2", ["The valve V-2 leaks.", "noted"])
    assert wait_until(lambda: indexed_chunks(service_env, "alice") == 4, 30), "new turns join the old tenant"


def test_recall_up_keys_a_new_data_dir_and_leaves_an_older_unkeyed_one_unkeyed(tmp_path, monkeypatch):
    from services.dev_secrets import FILE, export_defaults

    monkeypatch.chdir(tmp_path)  # no .env here
    for name in ("RECALL_INGEST_KEY", "RECALL_JWT_SECRET", "RECALL_USER_HASH_KEY"):
        monkeypatch.delenv(name, raising=False)
    new = tmp_path / "new"
    export_defaults(new, create=True)
    key = json.loads((new / FILE).read_text())["RECALL_USER_HASH_KEY"]
    assert os.environ.pop("RECALL_USER_HASH_KEY") == key and len(key) >= 32
    export_defaults(new, create=True)  # the next start keeps it
    assert os.environ.pop("RECALL_USER_HASH_KEY") == key

    old = tmp_path / "old"  # what `recall up` of an older release left: its dev secrets and unkeyed tenants
    _unkeyed_data_dir_of_an_older_release(old)
    (old / FILE).write_text(json.dumps({"RECALL_INGEST_KEY": INGEST_KEY, "RECALL_JWT_SECRET": JWT, "set_by_environment": []}))
    export_defaults(old, create=True)
    assert "RECALL_USER_HASH_KEY" not in json.loads((old / FILE).read_text()) and "RECALL_USER_HASH_KEY" not in os.environ


def test_a_service_that_dies_at_start_stops_recall_up_with_its_reason(tmp_path):
    """A child that exits before it listens (here: its artifacts database cannot be created)
    used to leave `recall up` waiting for it for ever."""
    (tmp_path / "a-file").write_text("")
    started = time.monotonic()
    result = recall("up", cwd=tmp_path, timeout=90, RECALL_ARTIFACTS_DB_URL=f"sqlite:///{tmp_path / 'a-file' / 'x.sqlite3'}",
                    **free_ports())
    assert result.returncode == 1 and time.monotonic() - started < 60, result.stderr[-2000:]
    assert re.search(r"recall up: .*serve.* exited with 1; stopping everything", result.stderr), result.stderr[-2000:]
    assert "recall up: stopped" in result.stdout


def test_debug_shows_the_traceback(tmp_path):
    result = recall("--debug", "up", cwd=tmp_path, RECALL_K="0", **free_ports())
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_a_taken_port_names_its_variable_and_starts_nothing(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = {**free_ports(), "RECALL_RECALL_PORT": str(taken.getsockname()[1])}
        result = recall("up", cwd=tmp_path, **ports)
    assert result.returncode == 2
    line = one_line(result)
    assert f"RECALL_RECALL_PORT={ports['RECALL_RECALL_PORT']}" in line and "set RECALL_RECALL_PORT to a free port" in line
    assert not (tmp_path / "data" / "redis").exists()


@pytest.mark.parametrize("command, variable", [("serve", "RECALL_RECALL_PORT"), ("ingest", "RECALL_INGEST_PORT"),
                                               ("indexer", "RECALL_INDEXER_PORT")])
def test_a_service_started_alone_on_a_taken_port_says_so_in_one_line_before_it_starts(tmp_path, command, variable):
    """`recall serve` loaded its model and built its app first (seconds), then died in uvicorn's bind."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        started = time.monotonic()
        result = recall(command, cwd=tmp_path, **{**free_ports(), variable: port}, RECALL_JWT_SECRET=JWT,
                        RECALL_INGEST_KEY=INGEST_KEY, RECALL_REDIS_URL="redis://127.0.0.1:1/0", RECALL_DATA_DIR=str(tmp_path / "data"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{variable}={port} is not allowed" in one_line(result) and "already in use" in one_line(result)
    assert time.monotonic() - started < 15 and result.stdout == "", "nothing started"


def test_a_taken_embedded_redis_port_and_a_port_used_twice_are_refused(tmp_path, redis_url):
    redis_port = redis_url.rsplit(":", 1)[1].split("/")[0]
    ports = free_ports()
    result = recall("up", cwd=tmp_path, RECALL_EMBEDDED_REDIS_PORT=redis_port,
                    **{**ports, "RECALL_INDEXER_PORT": ports["RECALL_INGEST_PORT"]})
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 2, result.stderr
    assert any("RECALL_EMBEDDED_REDIS_PORT" in ln and "in use" in ln for ln in lines)
    assert any("RECALL_INDEXER_PORT" in ln and "RECALL_INGEST_PORT uses that port too" in ln for ln in lines)


def test_an_unwritable_data_dir_is_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    result = recall("up", cwd=tmp_path, RECALL_DATA_DIR=str(tmp_path / "a-file" / "data"), **free_ports())
    assert result.returncode == 2
    assert "RECALL_DATA_DIR=" in one_line(result) and "not writable" in one_line(result)


def test_a_short_jwt_secret_is_refused_and_an_empty_one_is_generated(tmp_path):
    short = recall("up", cwd=tmp_path, RECALL_JWT_SECRET="too-short", **free_ports())
    assert short.returncode == 2 and "RECALL_JWT_SECRET" in one_line(short) and "32" in one_line(short)
    home = tmp_path / "made-by-recall-up"
    (home / "data").mkdir(parents=True)
    (home / "data" / "dev-secrets.json").write_text(json.dumps({"RECALL_INGEST_KEY": INGEST_KEY, "RECALL_JWT_SECRET": JWT}))
    token = recall("token", "--user", "alice", cwd=home, RECALL_JWT_SECRET="")
    assert token.returncode == 0, token.stderr
    from joserfc import jwt
    from joserfc.jwk import OctKey

    assert jwt.decode(token.stdout.strip(), OctKey.import_key(JWT)).claims["sub"] == "alice"


def test_a_secret_in_dot_env_wins_over_the_generated_dev_secret(tmp_path):
    (tmp_path / ".env").write_text(f"RECALL_JWT_SECRET={JWT}\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "dev-secrets.json").write_text(json.dumps({"RECALL_INGEST_KEY": INGEST_KEY, "RECALL_JWT_SECRET": secrets.token_urlsafe(32)}))
    token = recall("token", "--user", "alice", cwd=tmp_path)
    from joserfc import jwt
    from joserfc.jwk import OctKey

    assert token.returncode == 0, token.stderr
    assert jwt.decode(token.stdout.strip(), OctKey.import_key(JWT)).claims["sub"] == "alice"


def test_a_secret_recall_up_took_from_its_environment_is_asked_for_in_another_shell_not_generated(tmp_path, monkeypatch):
    from services.cli_problem import Problem
    from services.dev_secrets import FILE, export_defaults, require

    monkeypatch.chdir(tmp_path)  # no .env here
    data = tmp_path / "data"
    monkeypatch.setenv("RECALL_INGEST_KEY", INGEST_KEY)  # the shell that runs recall up
    monkeypatch.delenv("RECALL_JWT_SECRET", raising=False)
    export_defaults(data, create=True)
    generated = os.environ["RECALL_JWT_SECRET"]
    assert INGEST_KEY not in (data / FILE).read_text(), "a secret from the environment is named, never written"

    monkeypatch.delenv("RECALL_INGEST_KEY")  # a second shell: neither set
    monkeypatch.delenv("RECALL_JWT_SECRET")
    with pytest.raises(Problem) as refused:
        require(data, "status", "RECALL_INGEST_KEY", "RECALL_JWT_SECRET")
    assert "took RECALL_INGEST_KEY from its environment" in str(refused.value)
    require(data, "token", "RECALL_JWT_SECRET")  # the generated one is the stack's: still read back
    assert os.environ["RECALL_JWT_SECRET"] == generated
    monkeypatch.setenv("RECALL_INGEST_KEY", INGEST_KEY)
    require(data, "status", "RECALL_INGEST_KEY", "RECALL_JWT_SECRET")


def test_a_misspelled_variable_is_named_with_the_setting_it_is_close_to(tmp_path):
    result = recall("up", cwd=tmp_path, RECALL_RECAL_PORT="18000", RECALL_INGEST_SERVICE_HOST="10.0.0.7",
                    RECALL_K="0", **free_ports())
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 2, result.stderr
    assert lines[0] == "recall: RECALL_RECAL_PORT is not a setting and is ignored; did you mean RECALL_RECALL_PORT?"
    assert "RECALL_K='0'" in lines[1], "a Service's link variable (RECALL_INGEST_SERVICE_HOST) is no typo"


def test_an_unreachable_redis_url_is_one_line(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"
    result = recall("up", cwd=tmp_path, RECALL_REDIS_URL=url, **free_ports())
    assert result.returncode == 2 and f"RECALL_REDIS_URL='{url}'" in one_line(result)


def test_service_commands_check_their_settings_before_starting(tmp_path):
    result = recall("serve", cwd=tmp_path, RECALL_JWT_SECRET=JWT, RECALL_CANDIDATES="0", RECALL_RECALL_PORT=str(free_port()))
    assert result.returncode == 2 and "RECALL_CANDIDATES='0'" in one_line(result)
    result = recall("serve", cwd=tmp_path, RECALL_RECALL_PORT=str(free_port()))
    assert result.returncode == 2 and "RECALL_JWT_SECRET" in one_line(result)


def test_token_outside_a_data_dir_says_what_is_missing(tmp_path):
    result = recall("token", "--user", "alice", cwd=tmp_path)
    assert result.returncode == 1
    line = one_line(result)
    assert "RECALL_JWT_SECRET" in line and "dev-secrets.json" in line and "make run" in line


@pytest.mark.parametrize("args, named", [(["--ttl", "-10"], "--ttl"), (["--ttl", "0"], "--ttl"),
                                         (["--ttl", "99999999"], "RECALL_MAX_TOKEN_LIFETIME_S"),
                                         (["--user", ""], "empty user"), (["--user", "  "], "empty user"),
                                         (["--realm", "x:admin"], "owner, member, reader"),
                                         (["--zoneinfo", "../../etc/passwd"], "IANA time zone name")])
def test_token_refuses_expired_ttls_and_unknown_roles(tmp_path, args, named):
    result = recall("token", "--user", "alice", *args, cwd=tmp_path, RECALL_JWT_SECRET=JWT)
    assert result.returncode == 2 and named in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_token_accepts_known_realm_roles(tmp_path):
    result = recall("token", "--user", "alice", "--realm", "plant-7:owner", "--realm", "ops", cwd=tmp_path, RECALL_JWT_SECRET=JWT)
    from joserfc import jwt
    from joserfc.jwk import OctKey

    claims = jwt.decode(result.stdout.strip(), OctKey.import_key(JWT)).claims
    assert claims["realms"] == {"plant-7": "owner", "ops": "member"} and "zoneinfo" not in claims
    zoned = recall("token", "--user", "alice", "--zoneinfo", "Asia/Tokyo", cwd=tmp_path, RECALL_JWT_SECRET=JWT)
    assert jwt.decode(zoned.stdout.strip(), OctKey.import_key(JWT)).claims["zoneinfo"] == "Asia/Tokyo"


def test_demo_and_status_without_a_stack_say_what_to_do(tmp_path):
    demo = recall("demo", cwd=tmp_path, RECALL_JWT_SECRET=JWT, RECALL_INGEST_KEY=INGEST_KEY, **free_ports())
    assert demo.returncode == 1 and "start the stack first" in one_line(demo) and "RECALL_INGEST_PORT" in one_line(demo)
    missing = recall("demo", cwd=tmp_path)
    assert missing.returncode == 1 and "RECALL_INGEST_KEY" in one_line(missing)
    status = recall("status", cwd=tmp_path)
    assert status.returncode == 1 and "no recall up is running" in one_line(status)


def test_up_help_lists_every_variable_with_its_default(tmp_path):
    text = recall("up", "--help", cwd=tmp_path).stdout
    for name in [*StackSettings.model_fields, *EmbedderSettings.model_fields]:
        assert re.search(rf"RECALL_{name.upper()}  \(default: [^)]", text), name
    for name in ENGINE_VARIABLES:
        assert f"{name}  (default: " in text
    assert "RECALL_K  (default: 3)" in text and "RECALL_INGEST_PORT  (default: 8001)" in text


def test_every_recall_variable_read_anywhere_is_documented_in_help():
    """A RECALL_ name in the code that no settings class and no ENGINE_VARIABLES entry declares
    would be read but missing from `recall up --help`."""
    declared = {f"RECALL_{n.upper()}" for cls in (StackSettings, EmbedderSettings) for n in cls.model_fields}
    declared |= set(ENGINE_VARIABLES)
    used: set[str] = set()
    for path in [*(REPO / "services").rglob("*.py"), *(REPO / "shared").rglob("*.py")]:
        used |= set(re.findall(r"[\"'](RECALL_[A-Z0-9_]+)[\"']", path.read_text()))
    assert used and not used - declared, used - declared


def test_a_port_answered_by_another_redis_is_never_taken_for_ours(tmp_path, redis_url, monkeypatch):
    """The embedded Redis is verified by pid: here our 'redis-server' never binds, while another
    Redis answers on the port, as when a port is taken between the check and the start."""
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setattr("shared.redis_server.redis_server_binary", lambda: str(fake))
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    server = EmbeddedRedis(tmp_path / "redis", port=port)
    with pytest.raises(RedisStartError, match="another redis-server"):
        server.start(timeout=5)
    assert server.proc is None


def test_a_redis_that_cannot_start_says_why(tmp_path, redis_url):
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(RedisStartError, match="(?i)address already in use|failed listening|another redis-server"):
        EmbeddedRedis(tmp_path / "redis", port=port).start(timeout=10)


def test_embedded_redis_works_with_a_relative_data_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    server = EmbeddedRedis(Path("data") / "redis")
    server.start()
    try:
        assert (tmp_path / "data" / "redis" / "redis.log").exists()
    finally:
        server.stop()


def test_cli_is_importable_without_starting_anything():
    result = subprocess.run([sys.executable, "-c", "import services.cli as c; c.build_parser()"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_redis_killed_twice_in_a_row_is_named_as_killed_not_by_its_last_log_line(tmp_path, capsys):
    from services.stack import keep_redis_running

    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    try:
        server.proc.kill()
        server.proc.wait()
        assert keep_redis_running(server)
        assert "exited with -9 (SIGKILL); starting it again" in capsys.readouterr().err
        server.proc.kill()
        server.proc.wait()
        assert not keep_redis_running(server)
        said = capsys.readouterr().err
        assert "-9 (SIGKILL) again within 30 s of its restart: it was killed from outside" in said, said
        assert "Ready to accept" not in said, "a healthy log line is not why it died"
    finally:
        server.stop()


def test_a_hung_redis_is_killed_at_stop_and_says_so(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    proc = server.proc
    os.kill(proc.pid, signal.SIGSTOP)  # accepts nothing, answers nothing, ignores SIGTERM
    try:
        assert server.stop(timeout=1) is False and proc.returncode == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    again = EmbeddedRedis(tmp_path / "redis2")
    again.start()
    assert again.stop() is True


def test_a_killed_embedded_redis_is_started_again_and_the_stack_carries_on(tmp_path):
    """kill -9 of the embedded redis-server used to leave a zombie and a stack whose ingest
    answered 503 for ever. `recall up` now starts it again on its port and AOF: what was accepted
    before is still there, ingest accepts again, and Ctrl-C still stops everything."""
    import httpx
    import psutil

    ports = free_ports()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RECALL_")}
    # The data dir as a release before umask 077 left it: 0755 directories, a 0644 secrets file.
    (tmp_path / "data" / "redis").mkdir(parents=True)
    (tmp_path / "data" / "dev-secrets.json").write_text("{}")
    for path, mode in (("data", 0o755), ("data/redis", 0o755), ("data/dev-secrets.json", 0o644)):
        (tmp_path / path).chmod(mode)
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen([str(BIN / "recall"), "up"], cwd=tmp_path, env={**clean, **ports}, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    output = lambda: log_path.read_text(errors="replace")  # noqa: E731
    try:
        assert wait_until(lambda: "Ctrl-C stops everything." in output() or up.poll() is not None, 240, 0.2), output()
        assert up.poll() is None, output()[-3000:]
        data = (tmp_path / "data").resolve()
        for path, mode in ((data, "0755 -> 0700"), (data / "redis", "0755 -> 0700"), (data / "dev-secrets.json", "0644 -> 0600")):
            assert f"recall up: made {path} private (mode {mode})" in output(), output()[-3000:]
        key = json.loads((tmp_path / "data" / "dev-secrets.json").read_text())["RECALL_INGEST_KEY"]
        turns = f"http://127.0.0.1:{ports['RECALL_INGEST_PORT']}/turns"
        post = lambda cid: httpx.post(turns, headers={"x-ingest-key": key}, timeout=10, json={  # noqa: E731
            "user": "alice", "conversation_id": cid, "turns": [{"role": "user", "text": f"{cid} text", "ts": "2026-10-08T10:00:00Z"}]})
        assert post("before").status_code == 202
        [redis] = [p for p in psutil.Process(up.pid).children() if "redis-server" in p.name()]
        redis_port = next(c.laddr.port for c in redis.net_connections("tcp") if c.status == psutil.CONN_LISTEN)
        _embedded_redis_and_files_are_this_users_alone(tmp_path / "data", redis, redis_port)
        redis.kill()

        assert wait_until(lambda: "starting it again" in output(), 30, 0.1), output()[-3000:]
        assert wait_until(lambda: post("after").status_code == 202, 30, 0.5), "ingest never accepted again"
        [again] = [p for p in psutil.Process(up.pid).children() if "redis-server" in p.name()]
        assert again.pid != redis.pid and again.status() != psutil.STATUS_ZOMBIE
        assert any(c.laddr.port == redis_port for c in again.net_connections("tcp") if c.status == psutil.CONN_LISTEN)
        # An older release's data dir keeps the unkeyed hash its tenants are filed under.
        assert "RECALL_USER_HASH_KEY" not in json.loads((tmp_path / "data" / "dev-secrets.json").read_text())
        src = tmp_path / "data" / user_hash("alice") / "src"
        assert wait_until(lambda: {p.name for p in src.glob("*.funes.jsonl")} == {"before.funes.jsonl", "after.funes.jsonl"}, 30)
        assert up.poll() is None
        _embedded_redis_and_files_are_this_users_alone(tmp_path / "data", again, redis_port)  # the restarted one too
    except BaseException:
        os.killpg(up.pid, signal.SIGKILL)
        raise
    os.killpg(up.pid, signal.SIGINT)
    assert up.wait(90) == 0 and "recall up: stopped" in output()
    assert not psutil.pid_exists(again.pid) or psutil.Process(again.pid).status() == psutil.STATUS_ZOMBIE


def _embedded_redis_and_files_are_this_users_alone(data: Path, server, port: int) -> None:
    """Without a password any local user could write into any tenant's stream or have Redis
    write files anywhere (CONFIG SET dir + SAVE); and the stack's files were 0644 (a security review)."""
    import redis as redis_py

    with pytest.raises(redis_py.AuthenticationError):
        redis_py.Redis(port=port, socket_timeout=5).xlen("recall:turns")
    url = json.loads((data / "recall-up.json").read_text())["redis_url"]
    assert redis_py.Redis.from_url(url, socket_timeout=5).ping()
    password = url.split("@")[0].rsplit(":", 1)[1]
    assert password not in " ".join(server.cmdline()), "every local user reads a command line"
    private = [data, data / "redis", data / "recall-up.json", data / "dev-secrets.json", data / "redis" / "auth.conf",
               *data.rglob("*.funes.jsonl"), *data.rglob("*.aof")]
    assert all(p.stat().st_mode & 0o077 == 0 for p in private), {str(p): oct(p.stat().st_mode) for p in private}


def test_a_stack_that_verifies_jwks_tokens_prints_no_dev_token_that_it_would_refuse(tmp_path):
    """With RECALL_JWKS_URL the recall service verifies RS256 only: the banner's HS256 dev token
    was refused (401) and `recall demo` failed with 'MCPError: Server returned an error response'."""
    ports = free_ports()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RECALL_")}
    jwks = {"RECALL_JWKS_URL": f"https://127.0.0.1:{free_port()}/jwks.json", "RECALL_JWT_ISSUER": "https://idp.example/",
            "RECALL_JWT_AUDIENCE": "recall"}
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen([str(BIN / "recall"), "up"], cwd=tmp_path, env={**clean, **ports, **jwks}, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    output = lambda: log_path.read_text(errors="replace")  # noqa: E731
    try:
        assert wait_until(lambda: "Ctrl-C stops everything." in output() or up.poll() is not None, 240, 0.2), output()
        banner = output()[output().index("recall is up"):]
        assert "dev token for" not in banner and "eyJ" not in banner and "RS256 from your issuer" in banner, banner
        for env in ({}, jwks):  # from another terminal, with or without the variable
            demo = recall("demo", cwd=tmp_path, **env)
            assert demo.returncode == 1 and "RECALL_JWKS_URL" in one_line(demo), demo.stdout + demo.stderr
        status = recall("status", cwd=tmp_path)
        assert "eyJ" not in status.stdout and "RS256 from your issuer" in status.stdout, status.stdout
    finally:
        os.killpg(up.pid, signal.SIGINT)
        up.wait(90)
