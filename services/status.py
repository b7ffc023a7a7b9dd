"""`recall status`: the running stack's summary again (URLs, a fresh dev token, the curl line),
then the health of each service, its tenants and the stream backlog. Exit 1 when a part is
not ready."""

from __future__ import annotations

import argparse

from services.cli_problem import Problem

BACKLOG_COUNT_CAP = 10_000  # counting undelivered entries walks the stream; stop there


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("status", parents=[common], help="the running stack: URLs, health, tenants, stream backlog",
                       description=__doc__)
    p.set_defaults(fn=lambda args: run_status())


def run_status() -> int:
    from services.banner import TOKEN_TTL_S, banner
    from services.config_check import load_settings, without_password
    from services.dev_secrets import require
    from services.recall.tokens import mint_dev_token
    from services.stack import StackSettings
    from services.stack_state import read_info

    data_dir = load_settings(StackSettings).data_dir.resolve()
    info = read_info(data_dir)
    if info is None:
        raise Problem(f"recall status: no recall up is running for {data_dir}; start one with `make run`, or set "
                      "RECALL_DATA_DIR to the data dir of the one you mean")
    require(data_dir, "status", "RECALL_INGEST_KEY", "RECALL_JWT_SECRET")
    s = load_settings(StackSettings)
    token = mint_dev_token(s, "demo-user", ttl_s=TOKEN_TTL_S) if info.dev_tokens else None
    print(banner(info, s.ingest_key.get_secret_value(), token))
    print("\nhealth:")
    ok = True
    for name, url in (("ingest", info.ingest_url), ("indexer", info.indexer_url), ("recall", info.recall_url)):
        state = _probe(f"{url}/readyz")
        ok &= state == "ready"
        print(f"  {name:<8} {state}")
    tenants = _tenant_count(data_dir)
    print(f"\ntenants: {tenants} (directories in {data_dir})")
    try:
        print("stream:  " + _backlog(info.redis_url, s.stream, s.group))
    except Exception as exc:  # Redis down: say so, the rest of the report still stands
        ok = False
        print(f"stream:  redis unreachable at {without_password(info.redis_url)} ({exc})")
    return 0 if ok else 1


def _probe(url: str) -> str:
    import httpx

    try:
        resp = httpx.get(url, timeout=3)
    except httpx.HTTPError as exc:
        return f"down ({type(exc).__name__} at {url})"
    if resp.status_code != 200:
        return f"not ready ({resp.status_code} {resp.text[:120]})"
    try:  # ready, and what it refuses meanwhile ("ready; turns refused (503): ...")
        return str(resp.json()["status"])[:200]
    except (ValueError, KeyError, TypeError):
        return "ready"


def _tenant_count(data_dir) -> int:
    from shared.tenant_paths import USER_HASH

    return sum(1 for p in data_dir.iterdir() if p.is_dir() and USER_HASH.fullmatch(p.name))


def _backlog(redis_url: str, stream: str, group: str) -> str:
    import redis

    from shared.stream_schema import dead_letter_stream

    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=3, socket_connect_timeout=3)
    try:
        length = client.xlen(stream)
        groups = {g["name"]: g for g in client.xinfo_groups(stream)} if client.exists(stream) else {}
        g = groups.get(group)
        if g is None:
            return f"{length} entries in {stream}; consumer group {group} not created yet"
        undelivered = len(client.xrange(stream, f"({g['last-delivered-id']}", "+", count=BACKLOG_COUNT_CAP))
        shown = f"{undelivered}+" if undelivered >= BACKLOG_COUNT_CAP else str(undelivered)
        dead = client.xlen(dead_letter_stream(stream))
        return (f"{length} entries in {stream}; {shown} not yet delivered, {g['pending']} being processed "
                f"by {g['consumers']} consumer(s); {dead} dead letters")
    finally:
        client.close()
