"""Identifiers in queries (MT-4471, N-11, K-047, INV-80239) and how to match them exactly.

An identifier is letters, a separator and at least two digits: `MT-4471`, `INV_80239`,
`K-047`. Never `3-day`, `24-hour` (digits first), `UTF-8`, `GPT-4` (one digit), `S3`, `EC2`,
`python3`, `Q3` (no separator). Lower-case letters count only with three or more digits
(`mt-4471`), so `top-10` or `covid-19` in a sentence are words, not identifiers.
Hits holding the query's identifiers get a boost in the ranking (hybrid_search), not a hard
sort: among the turns that hold one, the rest of the query decides.
"""

from __future__ import annotations

import re

_IDENT = re.compile(r"(?<![^\W_])([^\W\d_]{1,6})[-_](\d{2,8})((?:-[^\W_]+)*)(?![^\W_])")


def query_identifiers(query: str) -> list[str]:
    seen: dict[str, None] = {}
    for m in _IDENT.finditer(query):
        letters, digits = m.group(1), m.group(2)
        if letters.isupper() or len(digits) >= 3:
            seen.setdefault(m.group(0).upper(), None)
    return list(seen)


class IdentifierPattern:
    """`MT-4471` also matches `MT 4471` and `mt4471`, never `MT-44711` or `XMT-4471`.

    A match holds every digit run of the identifier as it is (digits have no case), so a text
    without them is answered by a substring test; the expression is compiled only for a text
    that passes it (a recall tests ~70 turns, and most questions name a new identifier)."""

    def __init__(self, ident: str) -> None:
        self.ident = ident
        self.digits = re.findall(r"\d+", ident)
        self._regex: re.Pattern[str] | None = None

    @property
    def regex(self) -> re.Pattern[str]:
        if self._regex is None:
            parts = re.findall(r"[^\W\d_]+|\d+", self.ident)
            body = r"[-\s_]?".join(re.escape(p) for p in parts)
            self._regex = re.compile(rf"(?<![^\W_]){body}(?![^\W_])", re.IGNORECASE)
        return self._regex

    def search(self, text: str) -> bool:
        return all(d in text for d in self.digits) and self.regex.search(text) is not None


def count_identifiers(text: str, patterns: list[IdentifierPattern]) -> int:
    return sum(1 for p in patterns if p.search(text))
