"""Start real service processes for the benchmarks (the same `recall <command>` as production)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from shared.child_process import stop, wait_healthy

BIN = Path(sys.executable).parent


def start(command: str, env: dict[str, str], port: int, log_dir: Path) -> subprocess.Popen:
    log = open(log_dir / f"{command}-{port}.log", "wb")
    proc = subprocess.Popen([str(BIN / "recall"), command], env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/healthz")
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; see {log.name}") from None
    return proc


def stop_all(*procs: subprocess.Popen) -> None:
    for p in procs:
        stop(p)


def _stat_fields(stat: Path) -> list[str]:
    """/proc/<pid>/stat after the command name (which may hold spaces): state, ppid, …"""
    return stat.read_text().rsplit(")", 1)[1].split()


def _cpu_s(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU time (user + system) a live process has used."""
    return _cpu_s(_stat_fields(Path(f"/proc/{pid}/stat")))


def tree_cpu_s(pid: int) -> float:
    """CPU time of a process and its live children (a service and its engine children)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = _stat_fields(stat)
        except OSError:
            continue  # ended meanwhile
        if stat.parent.name == str(pid) or fields[1] == str(pid):
            total += _cpu_s(fields)
    return total
