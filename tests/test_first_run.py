"""A newcomer's first run, exactly as README.md tells it, on a clean copy of the repository.

The copy has no data dir and no .env; the environment has no RECALL_ variable but three free
ports (the README's defaults 8000-8002 may be taken on a shared host). The copy shares this
checkout's .venv (a symlink; `make` must find it up to date, so nothing is reinstalled), so the
code that runs is the code under test. Ctrl-C is SIGINT to the whole foreground process group,
as a terminal sends it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import psutil

from shared.tenant_paths import USER_HASH
from tests.conftest import REPO, free_port, user_hash_under, wait_until

README = (REPO / "README.md").read_text()


def _clean_copy(dest: Path) -> Path:
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    (dest / ".venv").symlink_to(REPO / ".venv")
    stamp = (REPO / ".venv" / ".installed").stat().st_mtime
    os.utime(dest / "pyproject.toml", (stamp - 1, stamp - 1))
    # Never let `make run` pip-install into the shared .venv from a directory about to be deleted.
    assert subprocess.run(["make", "-q", "install"], cwd=dest).returncode == 0, "make would reinstall .venv"
    return dest


def _newcomer_env(ports: dict[str, int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALL_", "FUNES_", "PYTEST_"))}
    env.update({name: str(port) for name, port in ports.items()})
    return env


def _session_processes(sid: int) -> list[psutil.Process]:
    alive = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                alive.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return alive


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _run_line(line: str, cwd: Path, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


async def _recall_as(url: str, token: str, query: str) -> str:
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    async with Client(url, auth=BearerAuth(token)) as client:
        return (await client.call_tool("recall_my_conversations", {"query": query})).content[0].text


def test_readme_tells_a_newcomer_to_make_run_then_demo():
    assert "make run" in README and ".venv/bin/recall demo" in README


async def test_first_run_as_the_readme_tells_it(tmp_path):
    clone = _clean_copy(tmp_path / "recall")
    assert not (clone / "data").exists()
    ports = {"RECALL_INGEST_PORT": free_port(), "RECALL_INDEXER_PORT": free_port(), "RECALL_RECALL_PORT": free_port()}
    env = _newcomer_env(ports)
    log_path = tmp_path / "make-run.log"
    with open(log_path, "wb") as log:
        make = subprocess.Popen(["make", "run"], cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    output = lambda: log_path.read_text(errors="replace")  # noqa: E731
    try:
        assert wait_until(lambda: "Ctrl-C stops everything." in output() or make.poll() is not None, 240, 0.2), output()
        assert make.poll() is None, output()
        banner = output()[output().index("recall is up"):]
        assert banner.rstrip().endswith("Ctrl-C stops everything."), "the banner is the last thing printed"
        assert f"data in {clone / 'data'}" in banner, "the relative data dir is the clone's data/"

        curl = next(line.strip() for line in banner.splitlines() if line.strip().startswith("curl "))
        posted = _run_line(curl, clone, env)
        assert posted.returncode == 0 and '"stored":"hello-1"' in posted.stdout.replace(" ", ""), posted

        demo = next(line.strip().split("  #")[0].strip() for line in banner.splitlines() if " demo " in f"{line} ")
        shown = _run_line(demo, clone, env)
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "1069.5 units/day at 18 months" in shown.stdout and "MT-4471" in shown.stdout

        lines = banner.splitlines()
        token = lines[lines.index(next(ln for ln in lines if ln.startswith("dev token for demo-user"))) + 1].strip()
        mcp_url = re.search(r"MCP\s+(http://\S+/mcp)", banner).group(1)
        assert mcp_url == f"http://127.0.0.1:{ports['RECALL_RECALL_PORT']}/mcp"
        deadline = time.monotonic() + 60
        while "Ticket MT-4471 blocks the N-11 upgrade" not in (text := await _recall_as(mcp_url, token, "MT-4471 N-11")):
            assert time.monotonic() < deadline, f"the curl line's conversation never became searchable: {text}"
            time.sleep(0.5)

        status_line = next(line.strip().split("  #")[0].strip() for line in banner.splitlines() if " status " in f"{line} ")
        status = _run_line(status_line, clone, env)
        assert status.returncode == 0, status.stdout + status.stderr
        assert re.search(r"ingest\s+ready", status.stdout) and "tenants: 1" in status.stdout, status.stdout
        # A new data dir is keyed: its user hash key is generated, kept, and names the one tenant.
        hash_key = json.loads((clone / "data" / "dev-secrets.json").read_text())["RECALL_USER_HASH_KEY"]
        assert (clone / "data" / ".recall-user-hash").read_text().startswith("hmac-sha256:")
        tenants = [p.name for p in (clone / "data").iterdir() if USER_HASH.fullmatch(p.name)]
        assert tenants == [user_hash_under(hash_key, "demo-user")], tenants

        # A second stack on this host: the same data dir, or the same ports, is refused before it starts.
        again = _run_line(".venv/bin/recall up", clone, _newcomer_env({k: free_port() for k in ports}), timeout=60)
        assert again.returncode == 2 and "another recall up" in again.stderr and "RECALL_DATA_DIR" in again.stderr, again
        elsewhere = _run_line(".venv/bin/recall up", clone, {**env, "RECALL_DATA_DIR": str(tmp_path / "other")}, timeout=60)
        assert elsewhere.returncode == 2, elsewhere
        assert len(elsewhere.stderr.strip().splitlines()) == 3 and "RECALL_INGEST_PORT" in elsewhere.stderr, elsewhere.stderr
        assert not (tmp_path / "other" / "redis").exists(), "nothing was started"

        redis_port = int(re.search(r"redis\s+redis://\(hidden\)@127\.0\.0\.1:(\d+)/0", banner).group(1))
        parts = psutil.Process(make.pid).children(recursive=True)
        assert len(parts) >= 5, "recall up, redis-server, ingest, indexer and the recall service"
    except BaseException:
        os.killpg(make.pid, signal.SIGKILL)
        raise

    os.killpg(make.pid, signal.SIGINT)  # Ctrl-C
    try:
        make.wait(90)
    except subprocess.TimeoutExpired:
        os.killpg(make.pid, signal.SIGKILL)
        raise AssertionError(f"make run did not stop on Ctrl-C: {output()[-3000:]}") from None
    assert "recall up: stopped" in output() and "Traceback" not in output(), output()[-3000:]
    gone, alive = psutil.wait_procs(parts, timeout=30)
    assert not alive and not _session_processes(make.pid), f"left running: {[p.cmdline() for p in alive]}"
    assert all(_port_free(p) for p in [*ports.values(), redis_port]), "every port is free again"
    assert not (clone / "data" / "recall-up.json").exists()
