"""Start real service processes for the benchmarks (the same `recall <command>` as production)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

from shared.child_process import free_port, stop, wait_healthy

BIN = Path(sys.executable).parent


def start(command: str, env: dict[str, str], port: int, log_dir: Path, bin_dir: Path = BIN) -> subprocess.Popen:
    """`recall <command>` from `bin_dir` (another checkout's venv runs that checkout's code)."""
    log = open(log_dir / f"{command}-{port}.log", "wb")
    # Unkeyed user hashes (also over a key in the shell or ./.env): the benchmarks compute tenant
    # paths themselves, in this process, and their data dirs are throwaway.
    env = {**os.environ, "RECALL_USER_HASH_KEY": "", **env}
    proc = subprocess.Popen([str(bin_dir / "recall"), command], env=env, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/healthz")
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; see {log.name}") from None
    return proc


@contextlib.contextmanager
def ingest_alone(env: dict[str, str], prefix: str) -> Iterator[tuple[subprocess.Popen, int]]:
    """A real `recall ingest` on a free port, with `env` over its settings, beside an embedded
    Redis of its own in a throwaway directory; (the process, its port); all gone on exit."""
    from shared.redis_server import EmbeddedRedis

    work = Path(tempfile.mkdtemp(prefix=prefix))
    (work / "data").mkdir()
    (work / "redis").mkdir()
    redis = EmbeddedRedis(work / "redis")
    redis.start()
    port = free_port()
    try:
        ingest = start("ingest", {"RECALL_DATA_DIR": str(work / "data"), "RECALL_REDIS_URL": redis.url,
                                  "RECALL_INGEST_PORT": str(port), "RECALL_LOG_LEVEL": "WARNING", **env}, port, work)
        try:
            yield ingest, port
        finally:
            stop(ingest)
    finally:
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)


def stop_all(*procs: subprocess.Popen) -> None:
    for p in procs:
        stop(p)


def process_cpu_s(pid: int) -> float:
    """CPU time (user + system) a live process has used."""
    return _cpu_s(psutil.Process(pid))


def tree_cpu_s(pid: int) -> float:
    """CPU time of a process and its live children (a service and its engine children)."""
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *proc.children()]:
        try:
            total += _cpu_s(p)
        except psutil.NoSuchProcess:
            continue  # ended meanwhile
    return total


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def hs256_token(user: str, secret: str, ttl_s: int = 3600) -> str:
    """A token the recall service started with RECALL_JWT_SECRET=secret accepts for `user`."""
    from joserfc import jwt
    from joserfc.jwk import OctKey

    now = int(time.time())
    return jwt.encode({"alg": "HS256"}, {"sub": user, "iat": now, "exp": now + ttl_s}, OctKey.import_key(secret))
