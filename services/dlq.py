"""`recall dlq list|replay|drop`: the dead-letter stream, handled without losing order.

A dead-lettered event must not go back with `XADD recall:turns *`: the stream entry id is the
snapshot's version, so a new id would make an old snapshot "newer" than what is on disk, or
bring back a conversation or user forgotten since. `replay` therefore carries each event out
itself, at its ORIGINAL entry id, through the indexer's own code paths:

- a turns snapshot is written under the conversation lock by `write_snapshot`, which drops it
  when a newer snapshot or a deletion (conversation version file, user tombstone) is on disk;
  if written, the tenant is marked due and a running indexer indexes it;
- a forget event is carried out by the indexer's `Forgetter` at its original id (tombstones,
  files, index rows, older stream entries, receipt).

Run it where the indexers run (same DATA_DIR and Redis credentials), e.g.
`kubectl exec deploy/recall-indexer -- recall dlq list`; beside `make run` (RECALL_REDIS_URL
unset) it uses that stack's embedded Redis. Output names entries, kinds, tenant
hashes and reasons, never message text.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shared.stream_schema import ForgetEvent, StreamEvent, dead_letter_stream, decode_fields, parse_event

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from services.indexer.settings import IndexerSettings


DEAD_LETTER_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


@dataclass
class DeadLetter:
    dead_id: str  # id in the dead-letter stream
    entry_id: str  # the event's original id in the ingest stream: its version
    reason: str
    deliveries: str
    fields: dict[str, str]

    def summary(self) -> str:
        return (f"{self.dead_id}  version={self.entry_id}  kind={self.fields.get('kind', '?')}  "
                f"user_hash={self.fields.get('user_hash', '?')}  conversation={self.fields.get('conversation_id') or '-'}  "
                f"deliveries={self.deliveries}  reason={self.reason}")


async def read_dead_letters(client: aioredis.Redis, stream: str, ids: list[str] | None = None) -> list[DeadLetter]:
    dead = dead_letter_stream(stream)
    if ids:
        raw = [entry for i in ids for entry in await client.xrange(dead, min=i, max=i)]
    else:
        raw = await client.xrange(dead)
    out = []
    for dead_id, record in raw:
        r = decode_fields(record)
        out.append(DeadLetter(dead_id.decode() if isinstance(dead_id, bytes) else dead_id, r["entry_id"], r.get("reason", ""),
                              r.get("deliveries", ""), json.loads(r["fields"])))
    return out


def valid_event(fields: dict[str, str]) -> StreamEvent | None:
    """The event, checked as an indexer checks it; None when it can never be carried out."""
    from pydantic import ValidationError

    from shared.tenant_paths import USER_HASH, check_conversation_id

    try:
        event = parse_event(fields)
        if not USER_HASH.fullmatch(event.user_hash):
            return None
        if event.conversation_id is not None:
            check_conversation_id(event.conversation_id)
        return event
    except (KeyError, TypeError, ValidationError, ValueError):
        return None


class Replayer:
    def __init__(self, client: aioredis.Redis, settings: IndexerSettings) -> None:
        # The indexer's machinery is imported here, not at the top: `recall` starts fast.
        from services.indexer.forgetting import Forgetter
        from services.indexer.index_job import make_index_job

        self.client = client
        self.s = settings
        self.forgetter = Forgetter(client, settings, make_index_job(settings.engine, settings.funes_bin, settings.index_timeout_s))

    async def replay(self, letter: DeadLetter) -> str:
        """Carry the event out at its original version; returns what happened (one word)."""
        from services.indexer.snapshot_writer import parse_version
        from services.indexer.stream_consumer import store_snapshot

        parse_version(letter.entry_id)  # a malformed id would order wrongly: refuse before touching anything
        event = valid_event(letter.fields)
        if event is None:
            return "invalid"  # stays in the dead-letter stream; `drop` removes it
        if isinstance(event, ForgetEvent):
            await self.forgetter.forget(letter.entry_id, event)
            result = "forgotten"
        else:
            # "written", "rewritten", or "stale": something newer or a deletion is on disk
            result = (await store_snapshot(self.client, self.s, event, letter.entry_id, wait_s=30)).value
        await self.client.xdel(dead_letter_stream(self.s.stream), letter.dead_id)
        return result


async def _run(args: argparse.Namespace, settings: IndexerSettings) -> int:
    from shared.redis_client import async_redis

    client = async_redis(settings.redis)
    try:
        letters = await read_dead_letters(client, settings.stream, args.ids or None)
        if args.action == "list":
            for letter in letters:
                print(letter.summary())
            print(f"{len(letters)} dead-lettered event(s)")
            return 0
        if not args.ids and not args.all:
            print(f"recall dlq {args.action}: name dead-letter ids, or pass --all")
            return 2
        if args.action == "drop":
            if letters:
                await client.xdel(dead_letter_stream(settings.stream), *[letter.dead_id for letter in letters])
            print(f"dropped {len(letters)}")
            return 0
        replayer = Replayer(client, settings)
        failed = 0
        for letter in letters:
            result = await replayer.replay(letter)
            failed += result == "invalid"
            print(f"{letter.dead_id}  version={letter.entry_id}  {result}")
        return 1 if failed else 0
    finally:
        await client.aclose()


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Register `recall dlq` on the `recall` command's subparsers."""
    p = sub.add_parser("dlq", parents=[common], help="list, replay (at the original version) or drop dead-lettered events")
    p.add_argument("action", choices=["list", "replay", "drop"])
    p.add_argument("ids", nargs="*", help="dead-letter stream ids (from `list`)")
    p.add_argument("--all", action="store_true", help="replay or drop every dead-lettered event")
    p.set_defaults(fn=main)


def main(args: argparse.Namespace) -> int:
    from services.cli_problem import Problem
    from services.config_check import load_settings
    from services.indexer.settings import IndexerSettings
    from services.stack_state import read_info

    malformed = [i for i in args.ids if not DEAD_LETTER_ID.fullmatch(i)]
    if malformed:
        raise Problem(f"recall dlq: {malformed[0]!r} is not a dead-letter id; `recall dlq list` prints them "
                      "(<milliseconds>-<sequence>, e.g. 1796076260336-0)")
    settings = load_settings(IndexerSettings)
    if not settings.redis_url:
        # Beside `make run` (what `recall status` reports dead letters of): that stack's own Redis.
        stack = read_info(settings.data_dir.resolve())
        if stack is None:
            raise Problem(f"recall dlq: RECALL_REDIS_URL is not set and no recall up is running for "
                          f"{settings.data_dir.resolve()}; set RECALL_REDIS_URL (and RECALL_DATA_DIR) to the indexers' own")
        settings = settings.model_copy(update={"redis_url": stack.redis_url, "data_dir": Path(stack.data_dir)})
    return asyncio.run(_run(args, settings))
