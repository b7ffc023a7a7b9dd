"""Deterministic kill points for crash tests: `RECALL_FAULT_INJECT=<point>` makes the process
die (os._exit, like kill -9: no cleanup, no flush) the moment it reaches that point.

Points: `after_listing`, `mid_embedding`, `before_commit`, `after_tantivy_commit`,
`after_sqlite_commit`; and the recall service's `artifact_before_index_refresh` (an artifact
change committed, the realm's search index not yet refreshed). Unset (always in production) it costs one dict lookup per point.
"""

from __future__ import annotations

import os

FAULT_ENV = "RECALL_FAULT_INJECT"
KILLED_EXIT_CODE = 137  # what a shell reports for SIGKILL, so tests can tell the point was reached


def fault_point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        os._exit(KILLED_EXIT_CODE)
