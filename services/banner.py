"""The summary `recall up` prints last (and `recall status` prints again): URLs, a dev token,
and commands that work when pasted verbatim."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from services.config_check import without_password
from services.stack_state import RUN_FILE, StackInfo
from shared.settings_base import CommonSettings

TOKEN_TTL_S = 7 * 24 * 3600
HELLO = ('{"user":"demo-user","conversation_id":"hello-1","turns":[{"role":"user","text":"Ticket MT-4471 blocks '
         'the N-11 upgrade","ts":"2026-10-08T10:00:00Z"}]}')


def recall_command(data_dir: Path) -> str:
    """How to run `recall` from here so that it finds this stack's data dir."""
    invoked = Path(sys.argv[0])  # as the user typed it (make run: .venv/bin/recall), so it works from here
    exe = invoked if invoked.name == "recall" else Path(sys.executable).parent / "recall"
    if not exe.is_absolute():
        return _with_data_dir(str(exe), data_dir)
    try:
        shown = "./" + str(exe.relative_to(Path.cwd()))
    except ValueError:
        shown = str(exe)
    return _with_data_dir(shown, data_dir)


def _with_data_dir(command: str, data_dir: Path) -> str:
    found_from_here = CommonSettings().data_dir.resolve() == data_dir
    return command if found_from_here else f"RECALL_DATA_DIR={shlex.quote(str(data_dir))} {command}"


def banner(info: StackInfo, ingest_key: str, token: str | None) -> str:
    """`token` is None when the stack verifies RS256 tokens from RECALL_JWKS_URL (no dev token works)."""
    data_dir = Path(info.data_dir)
    recall = recall_command(data_dir)
    redis = (f"{without_password(info.redis_url)} (embedded, AOF in {data_dir / 'redis'}; its password in "
             f"{data_dir / RUN_FILE})" if info.embedded_redis else without_password(info.redis_url))
    tokens = (f"dev token for demo-user (7 days):\n  {token}" if token else
              "tokens: RS256 from your issuer (RECALL_JWKS_URL is set; dev tokens and `recall demo` need it unset)")
    demo = f"\n  {recall} demo          # posts example conversations and shows what recall answers" if token else ""
    return f"""recall is up (data in {data_dir})
  redis        {redis}
  ingest API   {info.ingest_url}/turns        (header x-ingest-key: {ingest_key})
  MCP          {info.recall_url}/mcp   (tool recall_my_conversations; header Authorization: Bearer <token>)
  metrics      {info.ingest_url}/metrics  {info.indexer_url}/metrics  {info.recall_url}/metrics

{tokens}

try:
  curl -s -X POST {info.ingest_url}/turns -H 'content-type: application/json' -H 'x-ingest-key: {ingest_key}' -d '{HELLO}'{demo}
  {recall} status        # this summary again, with the health of each service and the stream backlog"""
