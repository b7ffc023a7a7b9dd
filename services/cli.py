"""`recall`: run the services, mint dev tokens, try it out.

    recall up          ingest + indexer + recall service (+ embedded Redis when RECALL_REDIS_URL is unset)
    recall status      the running stack's URLs, health of each service, tenants and stream backlog
    recall ingest      the ingest API alone
    recall indexer     one indexer worker
    recall serve       the recall MCP service alone
    recall token       a dev JWT for a user (HS256 with RECALL_JWT_SECRET)
    recall demo        post example conversations to a running stack and show recalls
    recall dlq         list, replay (at the original version) or drop dead-lettered events
    recall memory      operators: write and inspect AgentMemory records

`recall <command> --help` lists the environment variables each command reads.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from services.cli_problem import Problem

# One module per group of subcommands; each has `register(sub, common)`. A new subcommand is
# a new module and one line here.
COMMANDS = (
    "services.stack",
    "services.status",
    "services.service_commands",
    "services.token_command",
    "services.demo",
    "services.dlq",
    "services.recall.agent_memory.cli",
)


class RecallParser(argparse.ArgumentParser):
    """An epilog may be a function: the variables' help imports every settings class (and the
    engine's), which a service process started as `recall ingest` should not pay for."""

    def format_help(self) -> str:
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    # Subparsers must not reset --debug given before the command, hence SUPPRESS.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show the full traceback of an unexpected error")
    p = RecallParser(prog="recall", description=__doc__, parents=[common],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="command")
    for module in COMMANDS:
        importlib.import_module(module).register(sub, common)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = getattr(args, "debug", False)
    try:
        return args.fn(args)
    except Problem as exc:
        if debug:
            raise
        for line in exc.lines:
            print(line if line.startswith("recall ") else f"recall {args.command}: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if debug:
            raise
        print(f"recall {args.command}: {type(exc).__name__}: {exc} (run `recall --debug {args.command}` for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
