"""An unexpected exception as the services log it: its type and where it was raised, never its
message. A message may quote what the request carried (a pydantic error shows the input value,
a database error the statement's text), and logs never hold message text; the file, line and
function of the innermost frames are enough to find the bug. An incident id ties the log line
to the answer the caller got."""

from __future__ import annotations

import secrets
import traceback

FRAMES = 6  # the innermost ones: where it failed and the calls that led there


def _short(filename: str) -> str:
    """A frame's file from the package root (`services/…`, `starlette/…`), not the machine's path."""
    for marker in ("/site-packages/", "/services/", "/shared/"):
        if marker in filename:
            head = "" if marker == "/site-packages/" else marker.strip("/") + "/"
            return head + filename.rsplit(marker, 1)[1]
    return filename


def new_incident() -> str:
    return secrets.token_hex(6)


def exception_site(exc: BaseException) -> dict[str, object]:
    """`error`: the exception's type; `at`: its innermost frames as `file:line function`, the
    last being where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)[-FRAMES:]
    kind = type(exc)
    return {"error": kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}",
            "at": [f"{_short(f.filename)}:{f.lineno} {f.name}" for f in frames]}


# Exceptions whose message is written by the system, never a copy of stored or posted text: an
# OS error's strerror ("No space left on device"), SQLite's and Redis's fixed phrases ("database
# is locked", "OOM command not allowed"). Any other message may quote what it was given.
def _system_reason(exc: BaseException) -> str | None:
    import sqlite3

    from redis.exceptions import RedisError

    if isinstance(exc, OSError):
        return exc.strerror or None
    if isinstance(exc, (sqlite3.Error, RedisError)):
        return str(exc).splitlines()[0][:200] if str(exc) else None
    return None


def loggable_failure(exc: BaseException) -> dict[str, object]:
    """An expected-but-failed step for a log line: `exception_site`, plus `reason` where the
    message is the system's own (see `_system_reason`), so an operator still reads "disk full"."""
    reason = _system_reason(exc)
    return exception_site(exc) | ({"reason": reason} if reason else {})
