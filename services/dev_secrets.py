"""Local-only defaults for a newcomer's `recall up`: generated once, kept in DATA_DIR.

When RECALL_INGEST_KEY or RECALL_JWT_SECRET is unset (or empty), `recall up` generates one and
writes it to `DATA_DIR/dev-secrets.json` (mode 0600); `recall token`, `recall demo` and
`recall status` read it back. RECALL_USER_HASH_KEY likewise, but only for a new (empty) data
dir or one it was generated for before: an older data dir's tenants are named by unkeyed hashes
that cannot be re-hashed (shared/user_hash_scheme.py), so it keeps running unkeyed. A secret `recall up` took from its environment is named in the
file instead (never its value), so those commands ask for the same value rather than use a
generated one the stack refuses. Production sets both explicitly (Kubernetes Secrets, compose
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
USER_HASH_KEY = "RECALL_USER_HASH_KEY"
WANTED = {"RECALL_INGEST_KEY": 24, "RECALL_JWT_SECRET": 32, USER_HASH_KEY: 32}
FROM_ENVIRONMENT = "set_by_environment"  # the secrets `recall up` took from its environment, by name


def _configured(name: str) -> bool:
    # Set in the environment or in ./.env (which pydantic-settings reads too; an environment
    # variable would override it, so a value from .env must not be replaced here).
    return bool(os.environ.get(name) or dotenv_values(".env").get(name))


def stored(data_dir: Path) -> dict:
    """What DATA_DIR/dev-secrets.json holds (empty when there is none)."""
    path = data_dir / FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _wanted(data_dir: Path, stored: dict) -> dict[str, int]:
    """The secrets `recall up` generates here: the user hash key only for a data dir that is new
    (nothing in it yet) or got one before, so a newcomer's old `data/` keeps working unkeyed."""
    keyed = USER_HASH_KEY in stored or not (data_dir.is_dir() and any(data_dir.iterdir()))
    return {name: n for name, n in WANTED.items() if keyed or name != USER_HASH_KEY}


def export_defaults(data_dir: Path, create: bool) -> None:
    """Fill unset RECALL_INGEST_KEY / RECALL_JWT_SECRET / RECALL_USER_HASH_KEY from the dev file;
    `recall up` (create) first writes it: a generated value for each secret its environment
    leaves unset (kept from an earlier run), and the names of those it sets (FROM_ENVIRONMENT)."""
    path = data_dir / FILE
    kept = stored(data_dir)
    if create:
        wanted = _wanted(data_dir, kept)
        from_environment = [name for name in WANTED if _configured(name)]
        if set(wanted) <= set(from_environment) and not path.exists():
            return  # nothing generated, and no earlier dev secret a second shell could pick up
        kept = {name: kept.get(name) or secrets.token_urlsafe(n) for name, n in wanted.items()
                if name not in from_environment} | {FROM_ENVIRONMENT: from_environment}
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(kept, fh)
    for name in WANTED:
        if name in kept and not _configured(name):  # an empty value counts as unset, as README says
            os.environ[name] = kept[name]


def require(data_dir: Path, command: str, *names: str) -> None:
    """Problem (one line) when a secret is neither set nor in the dev file of this data dir."""
    export_defaults(data_dir, create=False)
    missing = [name for name in names if not _configured(name)]
    elsewhere = [name for name in missing if name in stored(data_dir).get(FROM_ENVIRONMENT, [])]
    if elsewhere:
        raise Problem(f"recall {command}: the recall up of {data_dir} took {' and '.join(elsewhere)} from its "
                      f"environment; set the same {' and '.join(elsewhere)} here")
    if missing:
        raise Problem(f"recall {command}: {' and '.join(missing)} not set and {data_dir / FILE} does not exist; run it "
                      "from the directory where `make run` runs (or set RECALL_DATA_DIR to that stack's data dir), "
                      f"or set {' and '.join(missing)}")
