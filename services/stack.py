"""`recall up`: the whole system on one machine for a newcomer (what `make run` starts).

Starts an embedded redis-server (AOF in DATA_DIR/redis) unless RECALL_REDIS_URL is set, then
the ingest API, one indexer and the recall MCP service as child processes sharing every
RECALL_* setting; prints the URLs, a dev token and a ready curl line; stops everything on
Ctrl-C or SIGTERM, and stops everything if any part dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import Field

from services.dev_secrets import export_defaults
from shared.child_process import stop, wait_healthy
from shared.redis_server import EmbeddedRedis
from shared.settings_base import CommonSettings

BIN = Path(sys.executable).parent


class StackSettings(CommonSettings):
    embedded_redis_port: int = Field(6390, description="Port of the embedded redis-server `recall up` starts.")
    ingest_port: int = 8001
    indexer_port: int = 8002
    recall_port: int = 8000


def run_stack() -> int:
    export_defaults(create=True)
    s = StackSettings()
    s.data_dir.mkdir(parents=True, exist_ok=True)
    redis_server = None
    env = dict(os.environ)
    if not s.redis_url:
        redis_server = EmbeddedRedis(s.data_dir / "redis", port=s.embedded_redis_port)
        redis_server.start()
        env["RECALL_REDIS_URL"] = redis_server.url
    children: list[tuple[str, subprocess.Popen]] = []
    stopping = False

    def request_stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    code = 0
    try:
        for name, port in (("indexer", s.indexer_port), ("ingest", s.ingest_port), ("serve", s.recall_port)):
            proc = subprocess.Popen([str(BIN / "recall"), name], env=env, stdin=subprocess.DEVNULL)
            children.append((name, proc))
            wait_healthy(proc, f"http://127.0.0.1:{port}/healthz")
        _banner(s, env)
        while not stopping:
            for name, proc in children:
                if proc.poll() is not None:
                    print(f"recall up: {name} exited with {proc.returncode}; stopping", file=sys.stderr)
                    stopping, code = True, 1
            time.sleep(0.5)
    except RuntimeError as exc:
        print(f"recall up: {exc}", file=sys.stderr)
        code = 1
    finally:
        for _, proc in reversed(children):  # recall and ingest first, the indexer finishes its job last
            stop(proc, timeout=60)
        if redis_server is not None:
            redis_server.stop()
    return code


def _banner(s: StackSettings, env: dict[str, str]) -> None:
    from services.recall.settings import RecallSettings
    from services.recall.tokens import mint_dev_token

    token = mint_dev_token(RecallSettings(), "demo-user", ttl_s=7 * 24 * 3600)
    ingest = f"http://127.0.0.1:{s.ingest_port}"
    body = ('{"user":"demo-user","conversation_id":"hello-1","turns":[{"role":"user","text":"Ticket MT-4471 blocks '
            'the N-11 upgrade","ts":"2026-10-08T10:00:00Z"}]}')
    print(f"""
recall is up (data in {s.data_dir.resolve()}, redis {env['RECALL_REDIS_URL']})
  ingest API   {ingest}/turns        (header x-ingest-key: {env['RECALL_INGEST_KEY']})
  MCP          http://127.0.0.1:{s.recall_port}/mcp   (tool recall_my_conversations)
  metrics      {ingest}/metrics  http://127.0.0.1:{s.indexer_port}/metrics  http://127.0.0.1:{s.recall_port}/metrics

dev token for demo-user (7 days):
  {token}

try:
  curl -s -X POST {ingest}/turns -H 'content-type: application/json' -H 'x-ingest-key: {env['RECALL_INGEST_KEY']}' -d '{body}'
  .venv/bin/recall demo          # posts example conversations and shows what recall answers
Ctrl-C stops everything.
""", flush=True)
