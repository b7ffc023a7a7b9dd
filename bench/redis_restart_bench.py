"""How long a restarted Redis answers LOADING instead of PONG, by stream backlog: what the
Redis probes in deploy/k8s/base/redis.yaml must wait for (a liveness probe that fails while
Redis loads its append-only file kills it before it is back, again and again).

    .venv/bin/python -m bench.redis_restart_bench [--entries 0 100000 300000]

For each backlog, on a fresh data dir with the shipped redis.conf (AOF, fsync every second):
`entries` stream entries of 0.9 KiB of incompressible text (a pending six-turn snapshot of the
capacity figures), a clean shutdown, then the time from spawn to the first PONG and Redis's
process CPU over it. Twice: with the AOF as written (commands replayed one by one), and right
after a rewrite (an RDB preamble, what auto-aof-rewrite leaves most of the time). The empty
Redis is the baseline.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import redis

from bench.report import table, write_section
from shared.child_process import free_port
from shared.redis_server import redis_server_binary

CONF = Path(__file__).resolve().parents[1] / "deploy" / "k8s" / "base" / "redis" / "redis.conf"
BATCH = 5000


def _spawn(data: Path, port: int) -> subprocess.Popen:
    # maxmemory off: the backlog is measured, not refused.
    return subprocess.Popen([redis_server_binary(), str(CONF), "--port", str(port), "--bind", "127.0.0.1",
                             "--dir", str(data), "--maxmemory", "0"], stdout=subprocess.DEVNULL)


def _until_pong(client: redis.Redis, timeout: float = 600) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if client.ping():
                return time.monotonic() - started
        except (redis.BusyLoadingError, redis.ConnectionError):
            pass
        time.sleep(0.02)
    raise TimeoutError("redis did not answer PONG")


def measure(entries: int, rewrite: bool) -> list[object]:
    with tempfile.TemporaryDirectory(prefix="redis-restart-") as d:
        data, port = Path(d), free_port()
        client = redis.Redis(port=port)
        proc = _spawn(data, port)
        _until_pong(client, 30)
        pipe = client.pipeline(transaction=False)
        for i in range(entries):
            pipe.xadd("recall:turns", {"kind": "turns", "user_hash": "0" * 24, "conversation_id": f"c{i}",
                                       "turns": os.urandom(440).hex()})
            if i % BATCH == BATCH - 1:
                pipe.execute()
        pipe.execute()
        used = client.info("memory")["used_memory"]
        if rewrite:
            client.bgrewriteaof()
            time.sleep(0.5)
            while client.info("persistence")["aof_rewrite_in_progress"]:
                time.sleep(0.1)
        try:
            client.shutdown()
        except redis.ConnectionError:
            pass
        proc.wait(120)
        on_disk = sum(f.stat().st_size for f in data.rglob("*") if f.is_file())
        proc = _spawn(data, port)
        wall = _until_pong(client)
        cpu = psutil.Process(proc.pid).cpu_times()
        proc.terminate()
        proc.wait(60)
        client.close()
    return [f"{entries:,}", "after a rewrite (RDB preamble)" if rewrite else "commands only",
            f"{used / 2**20:.0f}", f"{on_disk / 2**20:.0f}", f"{wall:.2f}", f"{cpu.user + cpu.system:.2f}"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, nargs="+", default=[0, 100_000, 300_000])
    args = ap.parse_args()
    rows = []
    for entries in args.entries:
        for rewrite in ((False,) if entries == 0 else (False, True)):
            rows.append(measure(entries, rewrite))
            print(rows[-1], flush=True)
    body = (f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end (shared with other work). "
            "Entries of 0.9 KiB of random hex; the empty Redis is the baseline.\n\n"
            + table(["backlog (entries)", "append-only file", "used_memory (MiB)", "on disk (MiB)",
                     "spawn to PONG (s)", "Redis CPU to PONG (s)"], rows))
    write_section("redis-restart-bench", f"python -m bench.redis_restart_bench --entries {' '.join(map(str, args.entries))}", body)


if __name__ == "__main__":
    main()
