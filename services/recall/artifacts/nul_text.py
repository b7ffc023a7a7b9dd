"""No text of the realm surface holds a NUL character (U+0000): PostgreSQL text cannot store
one, so on PostgreSQL it failed deep in the driver (an unnamed tool error, a bare 500), while
SQLite kept it. Both databases now refuse it the same way, at the boundary, naming the field:
every argument of a realm tool (they all take `realm_id`) and every part of an HTTP request
of AgentMemory's API."""

from __future__ import annotations

from typing import Any

from fastmcp.exceptions import ToolError
from fastmcp.server.middleware import Middleware


class NulText(ValueError):
    def __init__(self, field: str) -> None:
        super().__init__(f"invalid {field}: text must not contain a NUL character (U+0000)")
        self.field = field


def refuse_nul(value: Any) -> None:
    """NulText naming the first field of `value` that holds a NUL."""
    field = nul_field(value)
    if field:
        raise NulText(field)


def nul_field(value: Any) -> str | None:
    """The dotted path of the first string in `value` holding a NUL (of the mapping, for a key),
    if any. Iterative: a body nested as deep as the JSON parser allows is walked without recursion."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str) and "\x00" in item:
            return path or "input"
        if isinstance(item, dict):
            if any("\x00" in str(key) for key in item):
                return path or "input"
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
                raise ToolError(str(exc)) from None
        return await call_next(context)
