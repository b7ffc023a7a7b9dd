"""Whose calendar time words are read in: "yesterday" and "in October" start at the user's midnight.

A token may name its user's zone in OIDC's standard `zoneinfo` claim (an IANA name such as
`Europe/Berlin`); without one the replica's `RECALL_DEFAULT_TIME_ZONE` (UTC) applies. The data
comes from the `tzdata` package when the system has no zone database (slim container images).
The zone's country also says in which order its people write a short date ("11/3": `month_first`).
"""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

# An IANA name's shape, checked before any lookup: the name comes from a token, and ZoneInfo
# reads a file named by it (it refuses absolute paths and "..", and this refuses the rest).
_ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+-]{0,30}(?:/[A-Za-z0-9_+-]{1,30}){0,2}")


def time_zone(name: object) -> ZoneInfo | None:
    """The zone an IANA name names, or None for anything else (a wrong type, a path, a table
    file of the zone database, an unknown name)."""
    return _zone(name) if isinstance(name, str) else None


@lru_cache(maxsize=512)
def _zone(name: str) -> ZoneInfo | None:
    """Kept per name: a token's claim is read on every call, and ZoneInfo caches only the zones
    it found (an unknown name would be looked up on disk again each time)."""
    if not _ZONE_NAME.fullmatch(name):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


# Countries that write a short date month first ("11/3" is 3 November): the United States and the
# places using its forms, and those writing the year first (East Asia, Hungary), whose "11/3" drops
# only the year. Canada writes both orders: no order is assumed there.
_MONTH_FIRST = frozenset("US PH FM MH PW GU MP AS PR VI UM CN TW JP KR KP MN HU".split())
_EITHER_ORDER = frozenset({"CA"})


def month_first(zone: object) -> bool | None:
    """Whether the people of a zone's country write "11/3" for 3 November (True) or for 11 March
    (False); None when the zone names no country (UTC, a fixed offset) or one writing both."""
    country = _countries().get(getattr(zone, "key", None) or "")
    if country is None or country in _EITHER_ORDER:
        return None
    return country in _MONTH_FIRST


@lru_cache(maxsize=1)
def _countries() -> dict[str, str]:
    """Each zone's country, from the zone database's own table (the `tzdata` package's copy, so
    the answer is the same with or without a system zone database)."""
    table = resources.files("tzdata").joinpath("zoneinfo", "zone.tab").read_text(encoding="utf-8")
    rows = (line.split("\t") for line in table.splitlines() if line and not line.startswith("#"))
    return {row[2]: row[0] for row in rows if len(row) >= 3}
