"""Forget announcements are Redis pub/sub: sent while a recall replica's subscription was down
(a Redis restart, a proxy cutting the idle connection), they are lost. The replica then kept a
forgotten tenant's reader, and with it the deleted memory's files open (their bytes still on
disk, beyond the `done` receipt). A replica that resubscribes now drops every cached handle,
since it cannot know what it missed. Real Redis, real service, real MCP client."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import redis

from shared.engine.index_run import index_tree
from shared.redis_server import EmbeddedRedis
from shared.stream_schema import FORGET_CHANNEL
from shared.tenant_paths import TenantPaths, user_hash
from tests.conftest import call_recall, mint, wait_until, write_conversation


def open_deleted_files(pid: int, under: Path) -> list[str]:
    held = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith(str(under)) and target.endswith("(deleted)"):
            held.append(target)
    return held


async def test_a_forget_announced_while_the_replica_was_unsubscribed_still_releases_the_tenants_files(
        services, service_env, tmp_path, embedder):
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    try:
        data = Path(service_env["RECALL_DATA_DIR"])
        paths = TenantPaths.for_user(data, "ivy")
        write_conversation(paths.src, "vault", ["Vault migration codename BLUEHERON, budget 48k.", "noted"])
        index_tree(paths.root, paths.src, embedder)
        serve = services("serve", RECALL_REDIS_URL=server.url)
        client = redis.Redis.from_url(server.url)
        assert wait_until(lambda: client.pubsub_numsub(FORGET_CHANNEL)[0][1] == 1, 20)
        assert "BLUEHERON" in await call_recall(service_env, mint("ivy"), "vault migration codename")

        # The replica's subscription is cut; meanwhile an indexer forgets the user and announces it.
        client.client_kill_filter(_type="pubsub")
        shutil.rmtree(paths.root)
        client.publish(FORGET_CHANNEL, json.dumps({"user_hash": user_hash("ivy"), "conversation_id": None}))
        assert wait_until(lambda: client.pubsub_numsub(FORGET_CHANNEL)[0][1] == 1, 20), "the replica resubscribed"

        assert wait_until(lambda: not open_deleted_files(serve.proc.pid, data), 10), \
            f"the forgotten memory's files are still open: {open_deleted_files(serve.proc.pid, data)}"
        # The log line follows the drop; the files may be released a moment before it is written.
        assert wait_until(lambda: "recall.all_tenants_dropped" in serve.output(), 10)
    finally:
        server.stop()
