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
