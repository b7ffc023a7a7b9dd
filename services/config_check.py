"""Configuration read once and checked before any process starts, and the variables' help.

Every `recall` command builds its settings through `load_settings`, so a bad value is one line
naming the variable, the value and what is allowed (exit 2), never a pydantic traceback from a
child process seconds later. `variables_help` renders the same settings classes for `--help`,
so the documented variables and defaults cannot drift from what is read.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import shutil
import sys
import textwrap
from pathlib import Path
from typing import TypeVar

from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, SettingsError

from services.cli_problem import ConfigProblem
S = TypeVar("S", bound=BaseSettings)
PREFIX = "RECALL_"

# Read by the embedded engine straight from the environment (it also runs as the standalone
# `recall-engine` CLI, without the services' settings). tests/test_recall_cli.py fails when a
# RECALL_ variable is named anywhere in the code without being listed here or in a settings class.
ENGINE_VARIABLES: dict[str, tuple[str, str]] = {
    "RECALL_RERANK_MODEL_DIR": ("unset", "A local cross-encoder directory; reranking is off when unset."),
    "RECALL_SQLITE_JOURNAL_MODE": ("wal", "SQLite journal mode of each memory (wal, or delete for network file systems)."),
    "RECALL_FAULT_INJECT": ("unset", "Crash tests only: the process exits at the named point of an index run."),
}


def variable(field_name: str) -> str:
    return PREFIX + field_name.upper()


def load_settings(cls: type[S]) -> S:
    """`cls()` from the environment; ConfigProblem with one line per invalid variable."""
    warn_misspelled_variables()
    try:
        return cls()
    except ValidationError as exc:
        raise ConfigProblem(*(_error_line(cls, err) for err in exc.errors())) from None
    except SettingsError as exc:
        raise ConfigProblem(str(exc)) from None


# What kubelet sets for each Service in the namespace (`recall-ingest` → RECALL_INGEST_SERVICE_HOST):
# not a setting, and not a typo of one.
_SERVICE_LINK = re.compile(r"_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)$")


def misspelled_variables(names: set[str], known: set[str]) -> list[tuple[str, str]]:
    """(name, the setting it is close to) for each RECALL_ name that no setting reads."""
    return [(name, close[0]) for name in sorted(names)
            if name.startswith(PREFIX) and name not in known and not _SERVICE_LINK.search(name)
            and (close := difflib.get_close_matches(name, known, 1, 0.8))]


@functools.cache  # once per process
def warn_misspelled_variables() -> tuple[str, ...]:
    """A stderr line for each RECALL_ variable (environment or ./.env) that no setting reads but
    one is close to: pydantic-settings ignores unknown names, so a typo (RECALL_RECAL_PORT)
    silently left the default in place. Returns those names (`recall up` keeps them from its
    children, which would say it again)."""
    from dotenv import dotenv_values

    from services.stack import settings_groups

    known = {variable(name) for _, cls in settings_groups() for name in cls.model_fields} | set(ENGINE_VARIABLES)
    misspelled = misspelled_variables(set(os.environ) | set(dotenv_values(".env")), known)
    for name, meant in misspelled:
        print(f"recall: {name} is not a setting and is ignored; did you mean {meant}?", file=sys.stderr)
    return tuple(name for name, _ in misspelled)


def _error_line(cls: type[BaseSettings], err: dict) -> str:
    msg = err["msg"].removeprefix("Value error, ")  # a validator's own message is already the reason
    if not err.get("loc"):
        # A rule across several variables: its message names them. Its input is every setting
        # read (secrets included), so it is never shown.
        return msg
    name = str(err["loc"][0])
    field = cls.model_fields.get(name)
    secret = field is not None and _is_secret(field)
    shown = "(hidden)" if secret else repr(without_password(err.get("input")))
    # pydantic's own messages start with a capital ("Input should be…"); a validator's may
    # start with a variable's name, which keeps its case.
    allowed = msg if msg.startswith(PREFIX) else msg[0].lower() + msg[1:]
    about = f" ({field.description.rstrip('.')})" if field is not None and field.description else ""
    return f"{variable(name)}={shown} is not allowed: {allowed}{about}"


def without_password(value: object) -> object:
    """A URL's user and password hidden, whatever its scheme or the lack of one (redis://:pw@host
    mistyped as http://:pw@host, :pw@host or redis:/:pw@host)."""
    if not isinstance(value, str) or "@" not in value:
        return value
    userinfo, _, host = value.rpartition("@")
    scheme = re.match(r"[A-Za-z][\w+.-]*:/*(?=[^/]*$)", userinfo)
    return f"{scheme.group(0) if scheme else ''}(hidden)@{host}"


def _is_secret(field: FieldInfo) -> bool:
    return field.annotation is SecretStr or "SecretStr" in repr(field.annotation)


def check_writable_dir(path: Path, var: str = "RECALL_DATA_DIR") -> Path:
    """The directory, created if needed and absolute; ConfigProblem when this user cannot write it."""
    absolute = path.expanduser().resolve()
    probe = absolute / f".write-check-{os.getpid()}"
    try:
        absolute.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigProblem(f"{var}={str(path)!r} is not allowed: {absolute} is not writable ({exc.strerror}); "
                            "choose a directory this user can write") from None
    return absolute


def engine_problems(engine: str, funes_bin: str) -> list[str]:
    """RECALL_ENGINE=funes runs RECALL_FUNES_BIN for every index job and search: it must exist."""
    if engine == "funes" and shutil.which(funes_bin) is None:
        return [f"RECALL_FUNES_BIN={funes_bin!r} is not allowed: no executable of that name or path "
                "(RECALL_ENGINE=funes runs it); install it, or set RECALL_ENGINE=embedded"]
    return []


def auth_problems(jwt_secret: str, jwks_url: str | None) -> list[str]:
    """The recall service needs RS256 via JWKS or an HS256 secret long enough to resist guessing."""
    if jwks_url or len(jwt_secret) >= 32:
        return []
    return [f"RECALL_JWT_SECRET is not allowed: it has {len(jwt_secret)} characters and needs at least 32 "
            "(under `recall up`, leave it unset for a generated dev secret; or set RECALL_JWKS_URL)"]


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "computed"
    value = field.default
    if value is PydanticUndefined or value is None or value == "" or (isinstance(value, SecretStr) and not value.get_secret_value()):
        return "unset"
    return str(value)


def variables_help(classes: list[tuple[str, type[BaseSettings]]], extra: dict[str, tuple[str, str]] | None = None) -> str:
    """Every variable the classes read, grouped under the first class (title) that declares it."""
    groups: list[tuple[str, list[tuple[str, str, str]]]] = []
    seen: set[str] = set()
    for title, cls in classes:
        rows = []
        for base in reversed(cls.__mro__):
            own = getattr(base, "__annotations__", {})
            for name, field in cls.model_fields.items():
                if name in own and name not in seen and base.__module__ != "pydantic_settings.main":
                    seen.add(name)
                    rows.append((variable(name), _default(field), field.description or ""))
        if rows:
            groups.append((title, rows))
    if extra:
        groups.append(("the embedded engine", [(name, default, about) for name, (default, about) in extra.items()]))
    out = ["environment variables (or lines in .env), with their defaults:"]
    for title, rows in groups:
        out.append(f"\n  {title}:")
        for name, default, about in rows:
            out.append(f"    {name}  (default: {default})")
            out.extend(textwrap.wrap(about, 88, initial_indent=" " * 8, subsequent_indent=" " * 8))
    return "\n".join(out)
