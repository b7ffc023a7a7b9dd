"""Identifiers in queries (MT-4471, N-11, K-047, INV-80239) and how to match them exactly.

Plain RRF lets template-alike turns about other units (K-490 for K-421) outrank the turn that
carries the asked-for identifier (calibration: BM25 alone ~1.00 hit@3, plain RRF 0.85-0.91).
So hits that contain the query's identifiers are ranked first.
"""

from __future__ import annotations

import re

# A token mixing letters and digits, optionally hyphen-joined: MT-4471, N-11, K2, v1.8.0 is not one.
_IDENT = re.compile(r"(?<![A-Za-z0-9])([A-Za-z]{1,8}-?\d{1,8}(?:-[A-Za-z0-9]+)*|\d{1,8}-[A-Za-z]{1,8}\d*)(?![A-Za-z0-9])")


def query_identifiers(query: str) -> list[str]:
    seen: dict[str, None] = {}
    for m in _IDENT.finditer(query):
        seen.setdefault(m.group(1).upper(), None)
    return list(seen)


def identifier_pattern(ident: str) -> re.Pattern[str]:
    """`MT-4471` also matches `MT 4471` and `mt4471`, never `MT-44711` or `XMT-4471`."""
    parts = re.findall(r"[A-Za-z]+|\d+", ident)
    body = r"[-\s_]?".join(re.escape(p) for p in parts)
    return re.compile(rf"(?<![A-Za-z0-9]){body}(?![A-Za-z0-9])", re.IGNORECASE)


def count_identifiers(text: str, patterns: list[re.Pattern[str]]) -> int:
    return sum(1 for p in patterns if p.search(text))
