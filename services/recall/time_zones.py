"""Whose calendar time words are read in: "yesterday" and "in October" start at the user's midnight.

A token may name its user's zone in OIDC's standard `zoneinfo` claim (an IANA name such as
`Europe/Berlin`); without one the replica's `RECALL_DEFAULT_TIME_ZONE` (UTC) applies. The data
comes from the `tzdata` package when the system has no zone database (slim container images).
"""

from __future__ import annotations

import re
from functools import lru_cache
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
