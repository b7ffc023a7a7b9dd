"""`recall memory`: operators write and inspect AgentMemory records straight in the database the
recall service uses (RECALL_ARTIFACTS_DB_URL), acting as a realm owner under their own name,
which the audit records as `operator:<name>`.

    recall memory add    --realm R --as NAME --file record.json   (or - for stdin)
    recall memory list   --realm R [--type T] [--reality X] [--tag G] [--target-id ID] [--query Q] [--all] [--limit N] [--offset N]
    recall memory show   --realm R RECORD_ID
    recall memory change --realm R --as NAME RECORD_ID --file patch.json
    recall memory retire --realm R --as NAME RECORD_ID [--reason TEXT]
    recall memory audit  --realm R RECORD_ID [--limit N] [--offset N]
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("memory", parents=[common], help="operators: write and inspect AgentMemory records",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="environment variables (or lines in .env): RECALL_ARTIFACTS_DB_URL (default: "
                              "sqlite:///$RECALL_DATA_DIR/artifacts.sqlite3), RECALL_DATA_DIR (default: data; cited "
                              "conversations and targets are checked there)")
    ops = p.add_subparsers(dest="memory_op", required=True)
    for name in ("add", "list", "show", "change", "retire", "audit"):
        op = ops.add_parser(name, parents=[common])
        op.add_argument("--realm", required=True, help="realm id")
        if name in ("add", "change", "retire"):
            op.add_argument("--as", dest="operator", required=True, help="your name, recorded in the audit")
        if name in ("show", "change", "retire", "audit"):
            op.add_argument("record_id")
        if name in ("add", "change"):
            op.add_argument("--file", required=True, help="JSON record (see docs/artifacts.md), - for stdin")
        if name == "retire":
            op.add_argument("--reason")
        if name == "audit":
            op.add_argument("--limit", type=int, default=50, help="most events shown (1..100)")
            op.add_argument("--offset", type=int, default=0, help="events to skip (the next page)")
        if name == "list":
            op.add_argument("--type", dest="memory_type")
            op.add_argument("--reality")
            op.add_argument("--tag")
            op.add_argument("--target-id")
            op.add_argument("--query")
            op.add_argument("--limit", type=int, default=20)
            op.add_argument("--offset", type=int, default=0, help="records to skip (the next page)")
            op.add_argument("--all", action="store_true", help="also records not valid now")
    p.set_defaults(fn=run_memory_command)


def run_memory_command(args: argparse.Namespace) -> int:
    from services.recall.agent_memory.memory_store import MemoryStore
    from services.recall.agent_memory.models import RecordFields, RecordInput
    from services.recall.agent_memory.service import AgentMemoryService
    from services.recall.artifacts.models import Role
    from services.recall.artifacts.rules import RuleBroken
    from services.recall.artifacts.service import Caller
    from services.recall.server import build_artifact_service
    from services.recall.settings import RecallSettings
    from services.config_check import load_settings

    s = load_settings(RecallSettings)
    artifacts = build_artifact_service(s)
    service = AgentMemoryService(MemoryStore(artifacts.store), artifacts, artifacts.data_dir)
    who = f"operator:{args.operator}" if getattr(args, "operator", None) else "operator"
    caller = Caller(who, {args.realm: Role.OWNER})

    def load(model):
        text = sys.stdin.read() if args.file == "-" else open(args.file, encoding="utf-8").read()
        return model.model_validate_json(text)

    try:
        if args.memory_op == "add":
            out: Any = service.create(caller, args.realm, load(RecordInput))
        elif args.memory_op == "change":
            out = service.update(caller, args.realm, args.record_id, load(RecordFields))
        elif args.memory_op == "retire":
            out = service.retire(caller, args.realm, args.record_id, args.reason)
        elif args.memory_op == "show":
            out = service.get(caller, args.realm, args.record_id)
        elif args.memory_op == "audit":
            out = service.audit(caller, args.realm, args.record_id, args.limit, args.offset)
        else:
            out = service.search(caller, args.realm, memory_type=args.memory_type, reality=args.reality, tag=args.tag,
                                 target_id=args.target_id, query=args.query, valid_now=not args.all, limit=args.limit,
                                 offset=args.offset)
    except RuleBroken as exc:
        print(f"recall memory: refused: {exc}", file=sys.stderr)
        return 1
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        print(f"recall memory: invalid {'.'.join(str(p) for p in first['loc']) or 'record'}: {first['msg']}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"recall memory: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=2, ensure_ascii=False))
    return 0
