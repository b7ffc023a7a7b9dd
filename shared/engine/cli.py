"""`recall-engine`: the funes-compatible command line of the embedded engine.

Errors print `Error: <msg>` on stderr and exit 1; usage errors exit 2 (argparse), as funes.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from shared.engine.hybrid_search import RecallParams
from shared.engine.version import recall_version


def funes_home() -> Path:
    return Path(os.environ.get("FUNES_HOME") or Path.home() / ".funes")


def _memory(arg: str | None) -> Path:
    return Path(arg) if arg else funes_home() / "memory"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recall-engine", description="Hybrid search over your own conversation history.")
    p.add_argument("--version", action="version", version=f"recall-engine {recall_version()} (funes 1.8.0 command line)")
    sub = p.add_subparsers(dest="command", required=True)

    ix = sub.add_parser("index", help="index a tree of *.funes.jsonl files into $FUNES_HOME/memory")
    ix.add_argument("--yes", action="store_true", help="accepted for funes compatibility; never prompts")
    ix.add_argument("--wait", type=float, default=0.0, help="seconds to wait for a running index to finish")
    ix.add_argument("src", help="directory holding the *.funes.jsonl transcripts")

    rc = sub.add_parser("recall", help="ranked search")
    rc.add_argument("-k", "--k", type=int, default=8, help="passages to return (default 8)")
    rc.add_argument("--candidates", type=int, default=30, help="depth of each search leg before fusion (default 30)")
    rc.add_argument("--half-life", type=float, default=30.0, help="recency half-life in days (default 30)")
    rc.add_argument("--neighbors", type=int, default=1, help="neighbouring turns shown on each side (default 1)")
    rc.add_argument("--type", dest="block_type", help="only chunks of this block type (not validated: a typo gives no results)")
    rc.add_argument("--harness", help="only sessions of this harness (claude, codex, pi, hermes)")
    rc.add_argument("--memory", help="memory directory (default: $FUNES_HOME/memory)")
    rc.add_argument("--explain", action="store_true",
                    help="show per hit how it was scored (legs, ranks, fusion, boosts, recency)")
    rc.add_argument("query", nargs="+", help="what to look for (words are joined)")

    gt = sub.add_parser("get", help="read turns around one turn")
    gt.add_argument("session_id", help="session (conversation) id, as recall prints it")
    gt.add_argument("turn_uuid", help="turn id, as recall prints it")
    gt.add_argument("--window", type=int, default=3, help="turns shown on each side (default 3)")
    gt.add_argument("--memory", help="memory directory (default: $FUNES_HOME/memory)")

    st = sub.add_parser("status", help="what a memory holds")
    st.add_argument("memory", nargs="?", help="memory directory (default: $FUNES_HOME/memory)")

    fg = sub.add_parser("forget", help="remove one session from a memory now")
    fg.add_argument("session_id", help="session (conversation) id to remove")
    fg.add_argument("--memory", help="memory directory (default: $FUNES_HOME/memory)")

    mc = sub.add_parser("mcp", help="serve recall, get and status over stdio MCP")
    mc.add_argument("memory", nargs="?", help="memory directory (default: $FUNES_HOME/memory)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # every failure is one line for the caller, as funes' anyhow errors
        print(f"Error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.command == "mcp":
        from shared.engine.mcp_stdio import serve

        serve(_memory(args.memory))
        return 0
    if args.command == "status":
        from shared.engine.api import status_text

        sys.stdout.write(status_text(_memory(args.memory)))
        return 0
    if args.command == "forget":
        from shared.engine.index_run import forget_session

        memory = _memory(args.memory)
        removed = forget_session(memory.parent, args.session_id)
        print(f"forgot session {args.session_id}: {removed} chunks removed")
        return 0
    if args.command == "index":
        from shared.engine.embedder import LazyEmbedder
        from shared.engine.index_run import index_tree

        report = index_tree(funes_home(), Path(args.src).resolve(), LazyEmbedder(), lock_wait_s=args.wait)
        if report.malformed_lines:
            print(f"skipped {report.malformed_lines} malformed line(s)", file=sys.stderr)
        print(report.summary_line())
        return 0

    from shared.engine.api import Engine

    engine = Engine(max_readers=1)
    memory = _memory(args.memory)
    if args.command == "recall":
        params = RecallParams(args.k, args.candidates, args.half_life, args.neighbors, args.block_type, args.harness,
                              floor=True, explain=args.explain)
        sys.stdout.write(engine.recall(memory, " ".join(args.query), params, label=args.memory or str(memory)))
    else:
        sys.stdout.write(engine.get(memory, args.session_id, args.turn_uuid, args.window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
