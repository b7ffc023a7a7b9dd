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


# A letter-first word joined to digits by "-" or "_" (K-3, ZEPHYR-8, billing-stg-03, GPT-4).
_CODE = re.compile(r"(?<![^\W_])[^\W\d_][^\W_]*(?:[-_][^\W_]+)+(?![^\W_])")


def query_codes(query: str) -> list[str]:
    """What a query names by code, for the answer's note that no passage holds one: its
    identifiers (upper-cased, as ranked), then every other letter-first word joined to digits,
    as written. The ranking's rule above is narrower, since a boost for `top-10` would bend the
    ranking; saying that no passage holds K-3 or billing-stg-03 is true of any code."""
    found = dict.fromkeys(query_identifiers(query))
    for m in _CODE.finditer(query):
        code = m.group(0)
        if any(c.isdigit() for c in code) and code.upper() not in found:
            found.setdefault(code, None)
    return list(found)


class IdentifierPattern:
    """`MT-4471` also matches `MT 4471` and `mt4471`, never `MT-44711` or `XMT-4471`.

    A match holds every digit run of the identifier as it is (digits have no case), so a text
    without them is answered by a substring test. The expression compiled is the identifier's
    shape (`MT-4471`: the letters `MT`, four digits), so the queries naming units of one series
    share it through `re`'s cache (compiling costs ~45 us, and most questions name a new
    identifier); a match of the shape is one of the identifier when its digits are the
    identifier's. It is compiled only for a text holding those digits (a recall tests ~70 turns)."""

    def __init__(self, ident: str) -> None:
        self.ident = ident
        self.digits = tuple(re.findall(r"\d+", ident))
        self._regex: re.Pattern[str] | None = None

    @property
    def regex(self) -> re.Pattern[str]:
        """The shape: each digit run a group of as many digits, the letters as they are."""
        if self._regex is None:
            parts = re.findall(r"[^\W\d_]+|\d+", self.ident)
            body = r"[-\s_]?".join(rf"(\d{{{len(p)}}})" if p.isdecimal() else re.escape(p) for p in parts)
            self._regex = re.compile(rf"(?<![^\W_]){body}(?![^\W_])", re.IGNORECASE)
        return self._regex

    def search(self, text: str) -> bool:
        """Whether the identifier's own expression (its digits in place of the shape's groups)
        matches `text`. At a given start the shape matches at most one way (a separator is never
        a letter or a digit, so each optional separator is taken exactly when one is there), so
        the identifier matches there exactly when the shape does with the identifier's digits;
        every start where the shape matches is tried, overlapping ones too."""
        for digits in self.digits:  # a loop, not all(): asked of ~70 texts per recall
            if digits not in text:
                return False
        regex, start = self.regex, 0
        while (m := regex.search(text, start)) is not None:
            if m.groups() == self.digits:
                return True
            start = m.start() + 1
        return False
