"""Local-only defaults for a newcomer's `recall up`: generated once, kept in DATA_DIR.

When RECALL_INGEST_KEY or RECALL_JWT_SECRET is unset (or empty), `recall up` generates one and
writes it to `DATA_DIR/dev-secrets.json` (mode 0600); `recall token`, `recall demo` and
`recall status` read it back. Production sets both explicitly (Kubernetes Secrets, compose
`.env`), and this file is never used.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from dotenv import dotenv_values

from services.cli_problem import Problem

FILE = "dev-secrets.json"
WANTED = {"RECALL_INGEST_KEY": 24, "RECALL_JWT_SECRET": 32}


def _configured(name: str) -> bool:
    # Set in the environment or in ./.env (which pydantic-settings reads too; an environment
    # variable would override it, so a value from .env must not be replaced here).
    return bool(os.environ.get(name) or dotenv_values(".env").get(name))


def export_defaults(data_dir: Path, create: bool) -> None:
    """Fill unset RECALL_INGEST_KEY / RECALL_JWT_SECRET from the dev file (creating it if asked)."""
    if all(_configured(name) for name in WANTED):
        return
    path = data_dir / FILE
    stored: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    if create and any(name not in stored for name in WANTED):
        stored = {name: stored.get(name) or secrets.token_urlsafe(n) for name, n in WANTED.items()}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(stored, fh)
    for name, value in stored.items():
        if not _configured(name):  # an empty value counts as unset, as README says
            os.environ[name] = value


def require(data_dir: Path, command: str, *names: str) -> None:
    """Problem (one line) when a secret is neither set nor in the dev file of this data dir."""
    export_defaults(data_dir, create=False)
    missing = [name for name in names if not _configured(name)]
    if missing:
        raise Problem(f"recall {command}: {' and '.join(missing)} not set and {data_dir / FILE} does not exist; run it "
                      "from the directory where `make run` runs (or set RECALL_DATA_DIR to that stack's data dir), "
                      f"or set {' and '.join(missing)}")
