"""A service's files are its user's alone: new ones (umask 077), and those an earlier version left.

`recall up` has set umask 077 since round 32, but a service started alone (`recall indexer`, a
container, systemd) kept its caller's umask, usually 022: tenants' conversations and memories
were 0644 and readable by every local user. And a data directory made before round 32 keeps its
0644 files and 0755 directories whatever the umask is now. Closing the directory itself closes
every file below it (a path through it cannot be resolved), without a walk over millions of files.

A directory with its set-group-id bit is shared through its group on purpose: Kubernetes' fsGroup
sets it on the volume's root, and with `fsGroupChangePolicy: OnRootMismatch` the kubelet checks
that the root keeps group rwx and the bit, else it changes the group and mode of every file on
the volume at the next start (~40M files at docs/capacity.md's size). Such a directory keeps its
group's bits and loses only those of other users.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

PRIVATE_UMASK = 0o077


def private_files() -> None:
    """Every file and directory this process creates from now on is its user's alone; called
    first by each service's entry point and by `recall up`, before anything is written."""
    os.umask(PRIVATE_UMASK)


@dataclass(frozen=True)
class Tightening:
    """What `close_to_others` did to `path`: `now` is its new mode, or None when it could not be
    changed (`reason` says why)."""

    path: Path
    was: int
    now: int | None
    reason: str | None = None

    def fields(self) -> dict[str, str]:
        out = {"path": str(self.path), "mode": f"{self.was:04o}"}
        if self.now is not None:
            out["now"] = f"{self.now:04o}"
        if self.reason is not None:
            out["reason"] = self.reason
        return out


def close_to_others(path: Path) -> Tightening | None:
    """Takes every permission of other users (and of the group, unless the directory is shared
    through its set-group-id bit) off `path`; None when it had none, or does not exist. A path it
    cannot change (another user owns it, a read-only mount) is a Tightening with a reason, never an
    error: the service still runs, as it did before."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        return None
    shared_group = path.is_dir() and mode & stat.S_ISGID
    wanted = mode & ~(0o007 if shared_group else 0o077)
    if wanted == mode:
        return None
    try:
        os.chmod(path, wanted)
    except OSError as exc:
        return Tightening(path, mode, None, _why_not(path, exc))
    return Tightening(path, mode, wanted)


def _why_not(path: Path, exc: OSError) -> str:
    if exc.errno == errno.EROFS:
        return "it is on a read-only file system"
    if exc.errno == errno.EPERM:
        return f"it is owned by uid {path.stat().st_uid}, not by this process's uid {os.geteuid()}"
    return exc.strerror or type(exc).__name__


def tightening_line(tightening: Tightening) -> str:
    """The same for a person at a terminal (`recall up`)."""
    if tightening.now is not None:
        return (f"made {tightening.path} private (mode {tightening.was:04o} -> {tightening.now:04o}): what an earlier "
                "version wrote there was readable by other local users")
    return (f"warning: {tightening.path} stays open to other local users (mode {tightening.was:04o}): {tightening.reason}; "
            "have its owner run chmod o-rwx on it")


def log_tightening(log, what: str, tightening: Tightening | None) -> None:
    """One line for a service's log: `<what>.made_private`, or a warning naming what still lets
    other users in and how to close it."""
    if tightening is None:
        return
    if tightening.now is not None:
        log.info(f"{what}.made_private", **tightening.fields())
    else:
        log.warning(f"{what}.not_private", **tightening.fields(),
                    hint="other local users may read the files below it: have its owner run chmod o-rwx on it")
