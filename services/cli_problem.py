"""Mistakes a user can fix: `recall` prints them one line each, without a traceback."""

from __future__ import annotations


class Problem(Exception):
    """Something is missing or not running; each line says what and what to do."""

    exit_code = 1

    def __init__(self, *lines: str) -> None:
        super().__init__("; ".join(lines))
        self.lines = list(lines)


class ConfigProblem(Problem):
    """A setting is wrong (bad value, taken port, unwritable directory): nothing was started."""

    exit_code = 2
