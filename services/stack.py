"""`recall up`: the whole system on one machine for a newcomer (what `make run` starts).

Checks every setting, the data dir and every port first (a mistake is one line, exit 2, and
nothing is started); then starts an embedded redis-server (AOF in DATA_DIR/redis, on a free
port unless RECALL_EMBEDDED_REDIS_PORT is set, verified to be our own) unless RECALL_REDIS_URL
is set, and the ingest API, one indexer and the recall MCP service as child processes sharing
every RECALL_* setting. When all of them are ready it prints the URLs, a dev token and a ready
curl line, last; it stops everything on Ctrl-C or SIGTERM (ingest, then the recall service and
the indexer together; a part still running 5 s past RECALL_STOP_GRACE_S after its
SIGTERM is killed, named on stderr). A part that dies before the stack is up stops
everything; after that, a service that exits is started again after a backoff (1, 2, 4, 8,
16 s) unless it already was RECALL_CHILD_RESTART_LIMIT times within two minutes, which stops
everything, and the embedded Redis is started again (on its port and AOF) unless it dies again
within 30 s of being started again.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from services.banner import TOKEN_TTL_S, banner
from services.cli_problem import ConfigProblem, Problem
from services.config_check import (
    ENGINE_VARIABLES,
    auth_problems,
    check_writable_dir,
    engine_problems,
    load_settings,
    variables_help,
    warn_misspelled_variables,
    without_password,
)
from services.dev_secrets import FILE as DEV_SECRETS_FILE
from services.dev_secrets import export_defaults
from services.indexer.settings import IndexerSettings
from services.ingest.settings import IngestSettings
from services.port_check import port_problems
from services.recall.settings import RecallSettings
from services.stack_state import DataDirLock, StackInfo, remove_info, write_info
from services.supervisor import RESTART_WINDOW_S, Child, Supervisor, exit_reason
from shared.child_process import die_with_parent, ready, stop_together
from shared.huge_pages import with_huge_pages
from shared.private_dir import close_to_others, private_files, tightening_line
from shared.settings_base import CommonSettings

if TYPE_CHECKING:
    from shared.redis_server import EmbeddedRedis

BIN = Path(sys.executable).parent
READY_TIMEOUT_S = 120.0
REDIS_RESTART_WINDOW_S = 30.0  # a Redis that dies again this soon is failing, not killed once
REDIS_STOP_S = 10.0  # SIGTERM to SIGKILL: Redis fsyncs its AOF meanwhile
STOP_MARGIN_S = 5.0  # past a part's own RECALL_STOP_GRACE_S: the time to close up after its last request


class StackSettings(IngestSettings, IndexerSettings, RecallSettings):
    """Every service's settings (validated together before anything starts), plus the stack's own."""

    embedded_redis_port: int | None = Field(None, description="Port of the embedded redis-server `recall up` starts "
                                            "when RECALL_REDIS_URL is unset; unset = a free port, printed in the banner.")
    child_restart_limit: int = Field(5, ge=0, description="How often `recall up` starts a crashed service (ingest, indexer, "
                                     f"recall) again within {RESTART_WINDOW_S:.0f} s before it stops everything; 0 = never.")


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("up", parents=[common], help="run the whole system (what `make run` starts)",
                       description=__doc__, epilog=lambda: variables_help(settings_groups(), ENGINE_VARIABLES),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(fn=lambda args: run_stack())


def local_url(host: str, port: int) -> str:
    return f"http://{'127.0.0.1' if host in ('0.0.0.0', '', '::') else host}:{port}"


def check_config() -> tuple[StackSettings, Path]:
    """Everything `recall up` needs, checked before any process starts (ConfigProblem otherwise)."""
    s = load_settings(StackSettings)
    embedder_problems()
    data_dir = check_writable_dir(s.data_dir)
    wanted = [("RECALL_INGEST_PORT", s.ingest_host, s.ingest_port), ("RECALL_INDEXER_PORT", s.indexer_host, s.indexer_port),
              ("RECALL_RECALL_PORT", s.recall_host, s.recall_port)]
    if not s.redis_url and s.embedded_redis_port is not None:
        wanted.append(("RECALL_EMBEDDED_REDIS_PORT", "127.0.0.1", s.embedded_redis_port))
    problems = port_problems(wanted) + engine_problems(s.engine, s.funes_bin) + (redis_url_problems(s.redis_url) if s.redis_url else [])
    if problems:
        raise ConfigProblem(*problems)
    export_defaults(data_dir, create=True)
    s = load_settings(StackSettings)
    problems = auth_problems(s.jwt_secret.get_secret_value(), s.jwks_url) + user_hash_problems(s, data_dir)
    if problems:
        raise ConfigProblem(*problems)
    return s, data_dir


def user_hash_problems(s: StackSettings, data_dir: Path) -> list[str]:
    """The data dir's user hash is this key's (the services check the Redis too, and record it
    when new): an old data dir given a key is one line now, not a child dying at its start."""
    from shared.user_hash_scheme import data_dir_scheme, mismatch, scheme

    problem = mismatch(scheme(s.user_hash_key.get_secret_value()), data_dir_scheme(data_dir), f"the data directory {data_dir}")
    return [problem] if problem else []


def embedder_problems() -> None:
    from shared.engine.e5_packed import packed_model_problem
    from shared.engine.embedder import E5_SETTINGS, EmbedderSettings

    e = load_settings(EmbedderSettings)
    reason = packed_model_problem() if e.embedder in E5_SETTINGS and e.embed_model_dir is None else None
    if reason:
        raise ConfigProblem(f"RECALL_EMBEDDER={e.embedder!r} is not allowed here: {reason}; set RECALL_EMBEDDER=minilm (English only)")


def redis_url_problems(url: str) -> list[str]:
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, ValueError) as exc:
        return [f"RECALL_REDIS_URL={without_password(url)!r} is not allowed: {exc} (unset it to use an embedded redis-server)"]
    return []


def run_stack() -> int:
    from shared.redis_server import EmbeddedRedis, RedisStartError

    # The stack's files are its user's alone: conversations, memories, Redis's AOF and the
    # artifacts database were 0644 and readable by every local user (a security review).
    private_files()
    s, data_dir = check_config()
    # ... and so are those an earlier version left (0755 directories, 0644 files).
    for path in (data_dir, data_dir / "redis", data_dir / DEV_SECRETS_FILE):
        if (tightening := close_to_others(path)) is not None:
            print(f"recall up: {tightening_line(tightening)}", file=sys.stderr if tightening.now is None else sys.stdout,
                  flush=True)
    lock = DataDirLock(data_dir)
    lock.acquire()
    stopping = False

    def request_stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    redis_server = None
    children: list[Child] = []
    code = 0
    try:
        ignored = set(warn_misspelled_variables())  # said once here, not again by each child
        env = with_huge_pages({**{k: v for k, v in os.environ.items() if k not in ignored}, "RECALL_DATA_DIR": str(data_dir)})
        if not s.redis_url:
            redis_server = EmbeddedRedis(data_dir / "redis", port=s.embedded_redis_port, own_session=True,
                                         password=secrets.token_urlsafe(24))
            try:
                redis_server.start()
            except RedisStartError as exc:
                raise Problem(f"recall up: the embedded redis-server did not start: {exc}; set RECALL_EMBEDDED_REDIS_PORT "
                              "to a free port, or RECALL_REDIS_URL to a running Redis") from None
            env["RECALL_REDIS_URL"] = redis_server.url
        info = StackInfo(pid=os.getpid(), data_dir=str(data_dir), redis_url=env["RECALL_REDIS_URL"],
                         embedded_redis=redis_server is not None, ingest_url=local_url(s.ingest_host, s.ingest_port),
                         indexer_url=local_url(s.indexer_host, s.indexer_port), recall_url=local_url(s.recall_host, s.recall_port),
                         dev_tokens=not s.jwks_url)
        for name, url in (("indexer", info.indexer_url), ("ingest", info.ingest_url), ("recall", info.recall_url)):
            children.append(Child(name, _start_child(COMMANDS[name], env), f"{url}/readyz"))
        deadline = time.monotonic() + READY_TIMEOUT_S
        for child, port in zip(children, (s.indexer_port, s.ingest_port, s.recall_port)):
            # Ready only when our own child holds the port: a 200 from another program that took
            # the port after the check must not print "recall is up". `ready` runs first on every
            # round: it raises when the child has exited (e.g. at its own settings check) or the
            # deadline passed, which a child that never listens would otherwise hide for ever.
            while not stopping and not (ready(child.proc, child.ready_url, deadline) and listens_on(child.proc, port)):
                time.sleep(0.1)
        if not stopping:
            write_info(info)
            print(f"\n{banner(info, s.ingest_key.get_secret_value(), _dev_token(s))}\nCtrl-C stops everything.\n", flush=True)
        # Only now: a child that dies before it was ever ready has a problem a restart repeats.
        supervisor = Supervisor(lambda name: _start_child(COMMANDS[name], env), children, s.child_restart_limit)
        while not stopping:
            given_up = supervisor.poll()
            if given_up:
                print(given_up, file=sys.stderr)
                stopping, code = True, 1
            if redis_server is not None and not stopping and not keep_redis_running(redis_server):
                stopping, code = True, 1
            time.sleep(0.2)
    except RuntimeError as exc:  # a child died or never became ready
        if not stopping:
            print(f"recall up: {exc}; stopping everything", file=sys.stderr)
            code = 1
    finally:
        # Ingest first, so nothing new reaches the indexer; then the recall service and the indexer
        # together: they do not wait on each other, and one after the other (the recall service
        # takes seconds to exit once its calls are done) a stop ran past 30 s in a soak trial.
        grace = s.stop_grace_s + STOP_MARGIN_S
        stop_children([c for c in children if c.name == "ingest"], grace)
        stop_children([c for c in children if c.name != "ingest"], grace)
        if redis_server is not None and not redis_server.stop(REDIS_STOP_S):
            print(f"recall up: the embedded redis-server did not stop within {REDIS_STOP_S:g} s of SIGTERM; killed it "
                  "(its AOF may lack the last second of writes)", file=sys.stderr, flush=True)
        remove_info(data_dir)
        lock.release()
    print("recall up: stopped", flush=True)
    return code


def stop_children(children: list[Child], grace_s: float) -> None:
    """SIGTERM to all of `children` at once; one still running `grace_s` later is killed, with a
    line naming it (a stop that hangs would otherwise hold Ctrl-C, or look like a clean exit)."""
    killed = stop_together([c.proc for c in children], grace_s)
    for child in children:
        if child.proc in killed:
            print(f"recall up: {child.name} did not stop within {grace_s:g} s of SIGTERM; killing it", file=sys.stderr,
                  flush=True)


def keep_redis_running(server: EmbeddedRedis) -> bool:
    """A dead embedded Redis is started again on its port and AOF: the services reconnect by
    themselves (ingest answers 503 meanwhile), and nothing acknowledged is lost beyond AOF's
    last second. False, after one line saying why, when it cannot be started again."""
    from shared.redis_server import RedisStartError

    died = server.exit_code()
    if died is None:
        return True
    if server.restarts and time.monotonic() - server.started_at < REDIS_RESTART_WINDOW_S:
        # Killed by a signal, its log's last line is whatever it did before (often "Ready to accept
        # connections"): something outside it killed it, the OOM killer or a user.
        why = "it was killed from outside (the OOM killer, or a user)" if died < 0 else server.last_words()
        print(f"recall up: the embedded redis-server exited with {exit_reason(died)} again within "
              f"{REDIS_RESTART_WINDOW_S:.0f} s of its restart: {why}; stopping everything", file=sys.stderr)
        return False
    print(f"recall up: the embedded redis-server exited with {exit_reason(died)}; starting it again on port {server.port}",
          file=sys.stderr, flush=True)
    try:
        server.restart()
    except RedisStartError as exc:
        print(f"recall up: the embedded redis-server did not start again: {exc}; stopping everything", file=sys.stderr)
        return False
    return True


def listens_on(proc: subprocess.Popen, port: int) -> bool:
    import psutil

    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in psutil.Process(proc.pid).net_connections("tcp"))
    except psutil.NoSuchProcess:
        return False


# Each service by the name `recall status` and the banner give it, and the command that runs it.
COMMANDS = {"indexer": "indexer", "ingest": "ingest", "recall": "serve"}


def _start_child(command: str, env: dict[str, str]) -> subprocess.Popen:
    # Own process group: Ctrl-C reaches only `recall up`, which stops the parts in order;
    # and a child never outlives a `recall up` that was killed outright.
    return subprocess.Popen([str(BIN / "recall"), command], env=env, stdin=subprocess.DEVNULL,
                            process_group=0, preexec_fn=die_with_parent)


def _dev_token(s: RecallSettings) -> str | None:
    from services.recall.tokens import mint_dev_token

    return None if s.jwks_url else mint_dev_token(s, "demo-user", ttl_s=TOKEN_TTL_S)


def settings_groups() -> list[tuple[str, type]]:
    from shared.engine.embedder import EmbedderSettings

    return [("every service", CommonSettings), ("ingest API", IngestSettings), ("indexer", IndexerSettings),
            ("recall MCP service", RecallSettings), ("recall up", StackSettings),
            ("the embedding model (indexer and recall service)", EmbedderSettings)]

