"""Start real service processes for the benchmarks (the same `recall <command>` as production)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from shared.child_process import stop

BIN = Path(sys.executable).parent


def start(command: str, env: dict[str, str], port: int, log_dir: Path) -> subprocess.Popen:
    log = open(log_dir / f"{command}-{port}.log", "wb")
    proc = subprocess.Popen([str(BIN / "recall"), command], env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"recall {command} exited; see {log.name}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"recall {command} did not start")


def stop_all(*procs: subprocess.Popen) -> None:
    for p in procs:
        stop(p)
