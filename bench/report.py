"""Markdown tables for the benchmarks, and writing them into docs/benchmarks.md in place."""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def table(headers: list[str], rows: list[list[object]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def write_section(name: str, command: str, body: str) -> None:
    """Replace (or append) the section between this benchmark's markers in docs/benchmarks.md."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\nCommand (from the repo root, after `make install`): `.venv/bin/{command.strip()}`\n\n{body.strip()}\n{end}"
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.write_text(text)


def publish(name: str, body: str, no_doc: bool) -> None:
    """Print a benchmark's tables and, unless --no-doc, write them into docs/benchmarks.md beside
    the command that made them (`bench.<name>` with this run's arguments)."""
    print(body)
    if not no_doc:
        write_section(name, f"python -m bench.{name} " + " ".join(sys.argv[1:]), body)
