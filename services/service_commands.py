"""`recall ingest`, `recall indexer`, `recall serve`: one service each (what `recall up` starts,
and what each container runs). Settings are checked before the service starts, and each makes
the files it will write its user's alone first, however it was started (shared/private_dir.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from services.cli_problem import ConfigProblem, Problem
from services.config_check import (ENGINE_VARIABLES, auth_problems, check_writable_dir, engine_problems, load_settings,
                                   variables_help)
from services.indexer.settings import IndexerSettings
from services.ingest.settings import IngestSettings
from services.port_check import port_problems
from services.recall.settings import RecallSettings
from shared.engine.embedder import EmbedderSettings
from shared.private_dir import close_to_others, log_tightening, private_files
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
    groups: list[tuple[str, type]] = [("every service", CommonSettings), (title, cls)]
    return variables_help(groups + [("the embedding model", EmbedderSettings)], ENGINE_VARIABLES) if engine \
        else variables_help(groups)


def _redis_problems(s: CommonSettings, service: str) -> list[str]:
    return [] if s.redis_url else [f"RECALL_REDIS_URL is not set: {service} needs the Redis every service shares "
                                   "(only `recall up` starts an embedded one)"]


def _ingest(args: argparse.Namespace) -> int:
    from services.ingest.app import create_app
    from shared.http_serving import serve_http
    from shared.logging_setup import configure_logging

    private_files()
    s = load_settings(IngestSettings)
    problems = port_problems([("RECALL_INGEST_PORT", s.ingest_host, s.ingest_port)]) + _redis_problems(s, "ingest")
    if not s.ingest_key.get_secret_value():
        problems.append("RECALL_INGEST_KEY is not set: the ingest API never runs without a key (`recall up` makes one)")
    if problems:
        raise ConfigProblem(*problems)
    _settle_user_hash(s, None, register=True)
    configure_logging(s.log_level)
    serve_http(create_app(s), s.ingest_host, s.ingest_port, s)
    return 0


def _indexer(args: argparse.Namespace) -> int:
    import asyncio

    from services.indexer.worker import run_worker
    from shared.logging_setup import configure_logging

    private_files()
    s = load_settings(IndexerSettings)
    load_settings(EmbedderSettings)  # read when the model loads: a bad RECALL_EMBEDDER is a line now, not a traceback then
    problems = (port_problems([("RECALL_INDEXER_PORT", s.indexer_host, s.indexer_port)]) + _redis_problems(s, "the indexer")
                + engine_problems(s.engine, s.funes_bin))
    if problems:
        raise ConfigProblem(*problems)
    configure_logging(s.log_level)
    _settle_user_hash(s, _check_shared_data_dir(s, required=True), register=True)
    asyncio.run(run_worker(s))
    return 0


def _serve(args: argparse.Namespace) -> int:
    from services.recall.server import serve
    from shared.logging_setup import configure_logging

    private_files()
    s = load_settings(RecallSettings)
    load_settings(EmbedderSettings)
    # Before the model and the app are built (seconds): a taken port is one line, not a traceback after them.
    problems = (port_problems([("RECALL_RECALL_PORT", s.recall_host, s.recall_port)]) + engine_problems(s.engine, s.funes_bin)
                + auth_problems(s.jwt_secret.get_secret_value(), s.jwks_url))
    if problems:
        raise ConfigProblem(*problems)
    configure_logging(s.log_level)
    _settle_user_hash(s, _check_shared_data_dir(s, required=False), register=False)
    serve()
    return 0


def _check_shared_data_dir(s: CommonSettings, required: bool) -> Path:
    """The data directory is writable, closed to other local users, and the one the other
    services on this Redis share (shared/data_dir_identity.py; an indexer, `required`, names it
    there first). Redis not
    answering stops an indexer, which needs it to start; a recall replica starts without the
    check and answers from what it finds."""
    import redis

    from shared.data_dir_identity import shared_dir_problem
    from shared.logging_setup import get_logger

    data_dir = check_writable_dir(s.data_dir)
    # A data dir an earlier version made keeps its 0755 directories and 0644 files: closing the
    # directory itself closes them all (and what `recall up` or a container made there).
    log_tightening(get_logger("recall.data_dir"), "data_dir", close_to_others(data_dir))
    if not s.redis_url:
        return data_dir
    try:
        problem = shared_dir_problem(s.redis_url, data_dir, register=required)
    except redis.RedisError as exc:
        if required:
            raise Problem(f"RECALL_REDIS_URL: Redis does not answer ({type(exc).__name__}: {exc}); "
                          "start the indexer again once it does (an orchestrator restarts it)") from None
        return data_dir
    if problem:
        raise ConfigProblem(problem)
    return data_dir


def _settle_user_hash(s: CommonSettings, data_dir: Path | None, register: bool) -> None:
    """Hash users with RECALL_USER_HASH_KEY in this process, once the data directory (when the
    service has one) and the Redis record no other scheme (shared/user_hash_scheme.py); the
    first to start records its own, the data directory last, so that a refused service records
    nothing. `register`: this service may record it in Redis (a recall replica's Redis user
    reads only). A Redis that does not answer is not checked (the indexer has already stopped on
    it; ingest answers 503 until it does, a replica answers from the data directory)."""
    import redis

    from shared.tenant_paths import use_user_hash_key
    from shared import user_hash_scheme
    from shared.user_hash_scheme import FILE, data_dir_scheme, mismatch, record_data_dir_scheme, redis_scheme, scheme

    key = s.user_hash_key.get_secret_value()
    ours = scheme(key)
    where = f"the data directory {data_dir}"
    recorded = data_dir_scheme(data_dir) if data_dir else None
    problem = mismatch(ours, recorded, where)
    if not problem and s.redis_url:
        # Short: ingest starts on a Redis that does not answer (and answers 503 until it does).
        client = redis.Redis.from_url(s.redis_url, socket_connect_timeout=2, socket_timeout=3)
        try:
            problem = mismatch(ours, redis_scheme(client, s.stream, ours, register), "the deployment's Redis")
        except (redis.ConnectionError, redis.TimeoutError):
            pass
        except redis.ResponseError as exc:  # an ACL without the key: a deployment mistake, not a key to skip
            problem = (f"RECALL_REDIS_URL: its Redis user may not read or record {user_hash_scheme.KEY} ({exc}); "
                       "give it the key as deploy/k8s/base/redis/users.acl.template does")
        finally:
            client.close()
    if not problem and data_dir and not (data_dir / FILE).exists():  # an older release's tenants: unkeyed, now said
        problem = mismatch(ours, record_data_dir_scheme(data_dir, recorded or ours), where)
    if problem:
        raise ConfigProblem(problem)
    use_user_hash_key(key)
