"""A service's files are its user's alone however it is started (umask 077 in each entry point),
and a data dir an earlier version left open is closed at start (shared/private_dir.py)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from shared.private_dir import close_to_others
from shared.tenant_paths import user_hash
from tests.conftest import REPO, indexed_chunks, post_conversation, wait_until


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def callers_umask_022():
    """The services below are started as a shell or systemd would start them: umask 022."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def process_umask(pid: int) -> str:
    [line] = [line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Umask:")]
    return line.split()[1]


def test_each_service_started_alone_writes_files_only_its_user_can_read(services, service_env, callers_umask_022):
    """Outside `recall up` each service kept its caller's umask (022): conversations, memories and
    the artifacts database were 0644, readable by every local user."""
    started = [services(command) for command in ("ingest", "indexer", "serve")]
    assert [process_umask(s.proc.pid) for s in started] == ["0077"] * 3
    post_conversation(service_env, "alice", "c1", ["the pump overheats at line 3", "replace the seal"])
    assert wait_until(lambda: indexed_chunks(service_env, "alice") > 0, 60)
    data = Path(service_env["RECALL_DATA_DIR"])
    written = [data / user_hash("alice"), *(data / user_hash("alice")).rglob("*"), data / "artifacts.sqlite3"]
    assert len(written) > 5 and all(mode(p) & 0o077 == 0 for p in written), {str(p): oct(mode(p)) for p in written}


def test_a_data_dir_an_earlier_version_left_open_is_closed_at_start_in_one_line(services, service_env, callers_umask_022):
    """A tenant's files written before umask 077 stay 0644; closing the data dir itself closes
    them all without a walk over every file. The second service finds nothing left to do."""
    data = Path(service_env["RECALL_DATA_DIR"])
    tenant = data / user_hash("alice") / "src"
    tenant.mkdir(parents=True)
    (tenant / "c1.funes.jsonl").write_text("{}\n")
    data.chmod(0o755)
    indexer = services("indexer")
    assert mode(data) == 0o700
    [line] = [json.loads(line) for line in indexer.output().splitlines() if "made_private" in line]
    assert line["event"] == "data_dir.made_private" and line["mode"] == "0755" and line["now"] == "0700"
    assert line["path"] == str(data.resolve())
    recall = services("serve")
    assert "made_private" not in recall.output() and "not_private" not in recall.output()


def test_a_set_group_id_data_dir_keeps_its_groups_access_and_loses_other_users(tmp_path):
    """Kubernetes' fsGroup shares the volume through its group (g+rwx and set-group-id on its
    root); taking the group's bits would make the kubelet change every file's mode at the next
    start (fsGroupChangePolicy: OnRootMismatch)."""
    shared = tmp_path / "data"
    shared.mkdir()
    shared.chmod(0o2775)
    tightening = close_to_others(shared)
    assert tightening is not None and (tightening.was, tightening.now) == (0o2775, 0o2770)
    assert mode(shared) == 0o2770
    assert close_to_others(shared) is None


CHECK_AS_ANOTHER_USER = """
import json, sys
from pathlib import Path
from shared.private_dir import close_to_others
t = close_to_others(Path(sys.argv[1]))
print(json.dumps(t.fields()))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another user")
def test_a_data_dir_another_user_owns_is_left_as_it_is_with_the_reason():
    """A volume another uid owns (a recall replica reading what the indexer's uid made, writable
    to it through a group): chmod is refused, and the service says so instead of stopping."""
    with tempfile.TemporaryDirectory(dir="/tmp") as reachable:  # pytest's tmp_path is root's alone
        os.chmod(reachable, 0o755)
        owned = Path(reachable) / "volume"
        owned.mkdir()
        owned.chmod(0o777)
        _check_as_another_user(owned)


def _check_as_another_user(owned: Path) -> None:
    nobody = 65534
    # The venv's python lives under /root; shared/private_dir.py needs only the standard library.
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 that another user may run")
    done = subprocess.run([python, "-c", CHECK_AS_ANOTHER_USER, str(owned)], user=nobody, group=nobody,
                          env={"PYTHONPATH": str(REPO), "PATH": os.environ["PATH"]}, cwd="/", capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"path": str(owned), "mode": "0777",
                                       "reason": f"it is owned by uid 0, not by this process's uid {nobody}"}
    assert mode(owned) == 0o777
