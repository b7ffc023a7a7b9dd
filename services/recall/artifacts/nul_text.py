"""No text of the realm surface holds what a database cannot store, refused the same way on
both databases, at the boundary, naming the field: every argument of a realm tool (they all
take `realm_id`) and every part of an HTTP request of AgentMemory's API.

- a NUL character (U+0000): PostgreSQL text cannot store one, so on PostgreSQL it failed deep in
  the driver (an unnamed tool error, a bare 500), while SQLite kept it;
- a lone surrogate (U+D800..U+DFFF, which JSON can write as `"\\ud800"`): it is no character,
  UTF-8 cannot encode it, and either driver failed on it (a bare 500 on the HTTP API).
"""

from __future__ import annotations

import re
from typing import Any

from fastmcp.server.middleware import Middleware

from services.recall.artifacts.tool_access import refusal

UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class NulText(ValueError):
    def __init__(self, field: str, found: str = "\x00") -> None:
        what = "a NUL character (U+0000)" if found == "\x00" else f"a lone surrogate (U+{ord(found):04X}): not valid Unicode"
        super().__init__(f"invalid {field}: text must not contain {what}")
        self.field = field


def refuse_nul(value: Any) -> None:
    """NulText naming the first field of `value` holding a NUL or a lone surrogate."""
    found = unstorable_field(value)
    if found:
        raise NulText(*found)


def unstorable_field(value: Any) -> tuple[str, str] | None:
    """The dotted path of the first string in `value` (of the mapping, for a key) holding a NUL
    or a lone surrogate, and that character. Iterative: a body nested as deep as the JSON parser
    allows is walked without recursion."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str) and (bad := UNSTORABLE.search(item)):
            return path or "input", bad.group()
        if isinstance(item, dict):
            for key in item:
                if bad := UNSTORABLE.search(str(key)):
                    return path or "input", bad.group()
            stack.extend((f"{path}.{key}" if path else str(key), v) for key, v in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((f"{path}.{i}" if path else str(i), v) for i, v in reversed(list(enumerate(item))))
    return None


class RefuseNulInRealmTools(Middleware):
    async def on_call_tool(self, context, call_next):
        arguments = context.message.arguments or {}
        if "realm_id" in arguments:
            try:
                refuse_nul(arguments)
            except NulText as exc:
                raise refusal(str(exc)) from None
        return await call_next(context)
