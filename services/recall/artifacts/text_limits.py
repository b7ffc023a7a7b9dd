"""How much text one field of the realm surface stores: an artifact's body (constitution,
registry and charters included), a journal entry, an AgentMemory record's content, and the JSON
of a `source_context`. Without it an agent could store a whole MCP request (1 MiB) in one field,
and every read of it (every page of search results opened, every agent restoring its state)
would carry it back.

The limit is bytes of UTF-8 (`RECALL_REALM_MAX_TEXT_BYTES`, default 64 KiB): what the database
stores and a response carries. Search reads the first 20,000 characters of a body or an entry
(`artifact_search.INDEXED_CHARS`), which are at most 60,000 bytes in any script of the Basic
Multilingual Plane (CJK: 3 bytes a character), so the default never cuts what search would read.
"""

from __future__ import annotations

import json
from typing import Any

from services.recall.artifacts.rules import RuleBroken

DEFAULT_MAX_TEXT_BYTES = 64 * 1024
SETTING = "RECALL_REALM_MAX_TEXT_BYTES"
# A JSON request carries a stored byte as at most 6 (a control character is sent as \u0001).
JSON_ESCAPE_FACTOR = 6
MIN_BODY_BYTES = 2**20  # a valid record is far smaller, whatever the text limit
MAX_JSON_DEPTH = 32  # provenance details are a few flat fields; a deeper value is a mistake or an attack


class TextTooLarge(RuleBroken):
    """A field over the limit: nothing was stored (HTTP 413 naming the field). `size` None: known
    to be over it without being measured."""

    def __init__(self, field: str, size: int | None, limit: int) -> None:
        measured = f"{size:,} bytes of UTF-8" if size is not None else \
            f"more than {limit:,} values, each at least a byte of JSON"
        super().__init__(field, f"{measured}, over the limit of {limit:,} ({SETTING}); nothing was stored")


def check_text(field: str, text: str | None, limit: int) -> None:
    if text is None or len(text) * 4 <= limit:  # at most 4 bytes a character: surely within
        return
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise TextTooLarge(field, size, limit)


def check_json(field: str, value: Any, limit: int) -> None:
    """`value` as it is stored (its JSON) within the limit, nested at most MAX_JSON_DEPTH deep
    (deeper, storing and reading it back recursed until Python gave up: a bare error).

    Every value takes at least one byte of JSON, so a value of more than `limit` values is over
    the limit without being written out: the walk stops there, and a 1 MiB list of half a million
    numbers is refused after `limit` of them, not after walking and dumping them all (~1 s)."""
    if value is None:
        return
    stack, values = [(value, 1)], 1
    while stack:
        item, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise RuleBroken(field, f"nested more than {MAX_JSON_DEPTH} levels deep; nothing was stored")
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        values += len(children)
        if values > limit:
            raise TextTooLarge(field, None, limit)
        stack.extend((child, depth + 1) for child in children)
    try:
        stored = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except ValueError:  # NaN or Infinity (kept, it was shown back as null), or an integer Python will not print
        raise RuleBroken(field, "holds a number JSON cannot carry (NaN, Infinity, or an integer of over 4,300 digits); "
                                "nothing was stored") from None
    check_text(field, stored, limit)


def request_bytes_for(limit: int, overhead: int = 64 * 1024) -> int:
    """The largest HTTP request that may carry one field of `limit` bytes (escaped at worst)
    beside the small fields of a record."""
    return JSON_ESCAPE_FACTOR * limit + overhead


def max_body_bytes(max_text_bytes: int) -> int:
    """The largest request read (`/mcp`, AgentMemory's HTTP API): one that can carry a record
    whose content is at the text limit (RECALL_REALM_MAX_TEXT_BYTES), however it is escaped, so
    such a record is refused naming `content`, not the body; at least 1 MiB."""
    return max(MIN_BODY_BYTES, request_bytes_for(max_text_bytes))
