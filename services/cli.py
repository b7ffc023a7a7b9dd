"""`recall`: run the services, mint dev tokens, try it out.

    recall up          ingest + indexer + recall service (+ embedded Redis when RECALL_REDIS_URL is unset)
    recall ingest      the ingest API alone
    recall indexer     one indexer worker
    recall serve       the recall MCP service alone
    recall token       a dev JWT for a user (HS256 with RECALL_JWT_SECRET)
    recall demo        post example conversations to a running stack and show recalls
    recall memory      operators: write and inspect AgentMemory records
"""

from __future__ import annotations

import argparse
import sys


def _ingest(args: argparse.Namespace) -> int:
    import uvicorn

    from services.ingest.app import create_app
    from services.ingest.settings import IngestSettings
    from shared.logging_setup import configure_logging

    s = IngestSettings()
    configure_logging(s.log_level)
    uvicorn.run(create_app(s), host=s.ingest_host, port=s.ingest_port, log_config=None, access_log=False)
    return 0


def _indexer(args: argparse.Namespace) -> int:
    import asyncio

    from services.indexer.settings import IndexerSettings
    from services.indexer.worker import run_worker
    from shared.logging_setup import configure_logging

    s = IndexerSettings()
    configure_logging(s.log_level)
    asyncio.run(run_worker(s))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from services.recall.server import serve

    serve()
    return 0


def _token(args: argparse.Namespace) -> int:
    from services.dev_secrets import export_defaults
    from services.recall.settings import RecallSettings

    export_defaults(create=False)
    from services.recall.tokens import mint_dev_token

    print(mint_dev_token(RecallSettings(), args.user, ttl_s=args.ttl, realms=args.realm))
    return 0


def _up(args: argparse.Namespace) -> int:
    from services.stack import run_stack

    return run_stack()


def _demo(args: argparse.Namespace) -> int:
    from services.demo import run_demo

    return run_demo(args.user)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="recall", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="run the whole system").set_defaults(fn=_up)
    sub.add_parser("ingest", help="run the ingest API").set_defaults(fn=_ingest)
    sub.add_parser("indexer", help="run one indexer worker").set_defaults(fn=_indexer)
    sub.add_parser("serve", help="run the recall MCP service").set_defaults(fn=_serve)
    tok = sub.add_parser("token", help="mint a dev token")
    tok.add_argument("--user", required=True)
    tok.add_argument("--ttl", type=int, default=24 * 3600, help="seconds until it expires")
    tok.add_argument("--realm", action="append", default=[], help="realm:role claim (repeatable)")
    tok.set_defaults(fn=_token)
    demo = sub.add_parser("demo", help="post example conversations to a running stack and recall from them")
    demo.add_argument("--user", default="demo-user")
    demo.set_defaults(fn=_demo)
    from services.recall.agent_memory.cli import add_memory_command

    add_memory_command(sub)
    args = p.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
