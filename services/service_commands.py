"""`recall ingest`, `recall indexer`, `recall serve`: one service each (what `recall up` starts,
and what each container runs). Settings are checked before the service starts."""

from __future__ import annotations

import argparse

from services.cli_problem import ConfigProblem
from services.config_check import ENGINE_VARIABLES, auth_problems, engine_problems, load_settings, variables_help
from services.indexer.settings import IndexerSettings
from services.ingest.settings import IngestSettings
from services.port_check import port_problems
from services.recall.settings import RecallSettings
from shared.settings_base import CommonSettings


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    for name, helptext, title, cls, fn, engine in (
        ("ingest", "run the ingest API", "ingest API", IngestSettings, _ingest, False),
        ("indexer", "run one indexer worker", "indexer", IndexerSettings, _indexer, True),
        ("serve", "run the recall MCP service", "recall MCP service", RecallSettings, _serve, True),
    ):
        p = sub.add_parser(name, parents=[common], help=helptext, description=helptext,
                           epilog=lambda cls=cls, title=title, engine=engine: _variables(cls, title, engine),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(fn=fn)


def _variables(cls: type[CommonSettings], title: str, engine: bool) -> str:
    from shared.engine.embedder import EmbedderSettings

    groups: list[tuple[str, type]] = [("every service", CommonSettings), (title, cls)]
    return variables_help(groups + [("the embedding model", EmbedderSettings)], ENGINE_VARIABLES) if engine \
        else variables_help(groups)


def _ingest(args: argparse.Namespace) -> int:
    from services.ingest.app import create_app
    from shared.http_serving import serve_http
    from shared.logging_setup import configure_logging

    s = load_settings(IngestSettings)
    problems = port_problems([("RECALL_INGEST_PORT", s.ingest_host, s.ingest_port)])
    if problems:
        raise ConfigProblem(*problems)
    configure_logging(s.log_level)
    serve_http(create_app(s), s.ingest_host, s.ingest_port, s.stop_grace_s, s.request_read_timeout_s)
    return 0


def _indexer(args: argparse.Namespace) -> int:
    import asyncio

    from services.indexer.worker import run_worker
    from shared.logging_setup import configure_logging

    s = load_settings(IndexerSettings)
    problems = port_problems([("RECALL_INDEXER_PORT", s.indexer_host, s.indexer_port)]) + engine_problems(s.engine, s.funes_bin)
    if problems:
        raise ConfigProblem(*problems)
    configure_logging(s.log_level)
    asyncio.run(run_worker(s))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from services.recall.server import serve
    s = load_settings(RecallSettings)
    # Before the model and the app are built (seconds): a taken port is one line, not a traceback after them.
    problems = (port_problems([("RECALL_RECALL_PORT", s.recall_host, s.recall_port)]) + engine_problems(s.engine, s.funes_bin)
                + auth_problems(s.jwt_secret.get_secret_value(), s.jwks_url))
    if problems:
        raise ConfigProblem(*problems)
    serve()
    return 0
