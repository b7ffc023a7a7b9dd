"""What a running `recall up` leaves in its data dir for the other commands.

`recall-up.lock` is held (flock) for the stack's whole life: one stack per data dir, so two
stacks never share tenants' files or the embedded Redis's AOF. `recall-up.json` tells
`recall status` and `recall demo` where the stack's services are; it counts only while the
lock is held, so a stack killed with SIGKILL leaves nothing that looks alive.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from pydantic import BaseModel

from services.cli_problem import ConfigProblem

RUN_FILE = "recall-up.json"
LOCK_FILE = "recall-up.lock"


class StackInfo(BaseModel):
    pid: int
    data_dir: str
    redis_url: str
    embedded_redis: bool
    ingest_url: str
    indexer_url: str
    recall_url: str
    # False when the stack verifies RS256 tokens from RECALL_JWKS_URL: an HS256 dev token
    # (banner, `recall demo`) would be refused there.
    dev_tokens: bool = True


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ConfigProblem(f"RECALL_DATA_DIR={str(self.path.parent)!r} is not allowed: another recall up "
                                f"(pid {holder}) is using it; stop that one, or set RECALL_DATA_DIR to another directory") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def _locked(data_dir: Path) -> bool:
    try:
        fd = os.open(data_dir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def write_info(info: StackInfo) -> None:
    path = Path(info.data_dir) / RUN_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds the embedded Redis's password
    with os.fdopen(fd, "w") as f:
        f.write(info.model_dump_json(indent=1))
    tmp.replace(path)


def read_info(data_dir: Path) -> StackInfo | None:
    """The running stack of this data dir, or None when no `recall up` holds it."""
    path = data_dir / RUN_FILE
    if not _locked(data_dir) or not path.is_file():
        return None
    try:
        return StackInfo.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def remove_info(data_dir: Path) -> None:
    (data_dir / RUN_FILE).unlink(missing_ok=True)
