"""Local-only defaults for a newcomer's `recall up`: generated once, kept in DATA_DIR.

When RECALL_INGEST_KEY or RECALL_JWT_SECRET is unset, `recall up` generates one and writes it
to `DATA_DIR/dev-secrets.json` (mode 0600); `recall token` and `recall demo` read it back.
Production sets both explicitly (Kubernetes Secrets, compose `.env`), and this file is never used.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

FILE = "dev-secrets.json"


def data_dir() -> Path:
    return Path(os.environ.get("RECALL_DATA_DIR", "data"))


def export_defaults(create: bool) -> None:
    """Fill unset RECALL_INGEST_KEY / RECALL_JWT_SECRET from the dev file (creating it if asked)."""
    wanted = {"RECALL_INGEST_KEY": 24, "RECALL_JWT_SECRET": 32}
    if all(os.environ.get(name) for name in wanted):
        return
    path = data_dir() / FILE
    stored: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    if create and any(name not in stored for name in wanted):
        stored = {name: stored.get(name) or secrets.token_urlsafe(n) for name, n in wanted.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(stored, fh)
    for name, value in stored.items():
        os.environ.setdefault(name, value)
