"""What callers that stall their request bodies cost a service, and how each ends.

    .venv/bin/python -m bench.stalled_bodies_bench [--service serve|ingest] [--connections 200]
        [--declared 1048576] [--sent-bytes DECLARED-1] [--read-timeout 30] [--budget BYTES]

Starts the service as production does (`recall serve` or `recall ingest`, with an embedded
redis-server), then opens `--connections` connections that each send a valid token and ingest
key, a Content-Length of `--declared` bytes (1 MiB, /mcp's limit; ingest's is 4 MiB) and
`--sent-bytes` of body, then nothing; `--budget` sets RECALL_BODY_BUFFER_BYTES. Reports
the service's RSS idle, once every connection has sent its part (the peak), and after the read
timeout has passed; how each connection ended (an HTTP status, or closed without an answer);
and the log lines that carry a stack (`exception`).
"""

from __future__ import annotations

import argparse
import json
import socket
import tempfile
import time
from pathlib import Path

import psutil

from bench.stack_processes import hs256_token, start, stop_all
from shared.child_process import free_port
from shared.redis_server import EmbeddedRedis

KEY = "bench-stalled-ingest-key-0123456789"
JWT_SECRET = "bench-stalled-jwt-secret-0123456789abcdef"
DECLARED = 2**20
PATHS = {"serve": ("/mcp", "RECALL_RECALL_PORT"), "ingest": ("/turns", "RECALL_INGEST_PORT")}


def how_it_ended(conn: socket.socket, wait_s: float) -> str:
    conn.settimeout(wait_s)
    try:
        answer = conn.recv(256)
    except TimeoutError:
        return "still open"
    except ConnectionResetError:
        return "reset"
    return answer.split(b"\r\n", 1)[0].decode(errors="replace") if answer else "closed without an answer"


def rss_mib(proc: psutil.Process) -> float:
    return proc.memory_info().rss / 2**20


def run(service: str, connections: int, declared: int, sent: int, read_timeout: float, budget: int | None,
        work: Path) -> dict:
    redis = EmbeddedRedis(work / "redis")
    redis.start()
    path, port_var = PATHS[service]
    port = free_port()
    env = {"RECALL_DATA_DIR": str(work / "data"), "RECALL_REDIS_URL": redis.url, "RECALL_INGEST_KEY": KEY,
           "RECALL_JWT_SECRET": JWT_SECRET, "RECALL_REQUEST_READ_TIMEOUT_S": str(read_timeout),
           "FASTMCP_LOG_ENABLED": "false", port_var: str(port)}
    if budget is not None:
        env["RECALL_BODY_BUFFER_BYTES"] = str(budget)
    proc = start(service, env, port, work)
    ps = psutil.Process(proc.pid)
    head = (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"accept: application/json, text/event-stream\r\nx-ingest-key: {KEY}\r\nauthorization: Bearer {hs256_token('alice', JWT_SECRET)}\r\n"
            f"content-length: {declared}\r\n\r\n").encode()
    try:
        time.sleep(2)
        idle = rss_mib(ps)
        opened = []
        started = time.monotonic()
        for _ in range(connections):
            conn = socket.create_connection(("127.0.0.1", port))
            conn.sendall(head + b"x" * sent)
            opened.append(conn)
        time.sleep(3)  # the service reads what was sent
        peak = rss_mib(ps)
        ends: dict[str, int] = {}
        for conn in opened:
            end = how_it_ended(conn, max(1.0, read_timeout + 10 - (time.monotonic() - started)))
            ends[end] = ends.get(end, 0) + 1
            conn.close()
        time.sleep(2)
        after = rss_mib(ps)
    finally:
        stop_all(proc)
        redis.stop()
    log = (work / f"{service}-{port}.log").read_text(errors="replace").splitlines()
    stacks = sum(1 for line in log if line.startswith("{") and "exception" in json.loads(line))
    return {"service": service, "connections": connections, "declared_bytes": declared, "sent_bytes": sent,
            "budget_bytes": budget, "rss_idle_mib": round(idle),
            "rss_stalled_mib": round(peak), "per_connection_kib": round((peak - idle) * 1024 / connections),
            "rss_after_mib": round(after), "ended": ends, "log_lines_with_a_stack": stacks}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--service", choices=sorted(PATHS), default="serve")
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--declared", type=int, default=DECLARED, help="the Content-Length each connection announces")
    ap.add_argument("--sent-bytes", type=int, help="body bytes each sends (default: all but the last)")
    ap.add_argument("--read-timeout", type=float, default=30.0)
    ap.add_argument("--budget", type=int, help="RECALL_BODY_BUFFER_BYTES (default: the service's)")
    args = ap.parse_args()
    sent = args.declared - 1 if args.sent_bytes is None else args.sent_bytes
    print(json.dumps(run(args.service, args.connections, args.declared, sent, args.read_timeout, args.budget,
                         Path(tempfile.mkdtemp(prefix="recall-stalled-")))))


if __name__ == "__main__":
    main()
