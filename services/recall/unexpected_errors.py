"""Unexpected failures of the recall service, on both of its surfaces, answered without
internals, counted in `recall_unexpected_errors_total{surface}` (RecallServiceUnexpectedErrors)
and logged once as `recall.unexpected_error` with the caller's user hash, the exception's type
and where it was raised, never its message (it may quote stored or requested text).

- MCP tool calls: fastmcp turns an exception it does not know into a masked tool error
  (raised `from` the exception) and logs its traceback, message included; that line is
  replaced by ours, and the caller gets the incident id. A call that ran out of time (a
  TimeoutError, or fastmcp's own tool timeout) is load, not a bug: it reads "busy, try again",
  as recall_my_conversations' own busy answers do, and is counted in
  `recall_busy_total{reason="tool_timeout"}`.
- HTTP requests (AgentMemory's API, the probes, and the verification of any request's bearer
  token): Starlette answered a plain-text 500 and uvicorn logged the traceback; now a JSON 500
  like the API's other errors (shared/unexpected_http.py).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from fastmcp.exceptions import DisabledError, FastMCPError, NotFoundError, ToolError
from fastmcp.server.dependencies import get_access_token
from fastmcp.server.middleware import Middleware
from mcp.shared.exceptions import MCPError
from starlette.types import Scope

from services.recall.metrics import REALM_CALLS, RECALL_BUSY, UNEXPECTED_ERRORS
from services.recall.tool_output import RECALL_TOOL
from shared.error_site import exception_site, new_incident
from shared.logging_setup import get_logger
from shared.tenant_paths import user_hash
from shared.unexpected_http import route_of

log = get_logger("recall.service")
# What fastmcp answers itself: refusals, unknown or disabled tools, invalid arguments, protocol errors.
ANSWERED = (FastMCPError, NotFoundError, DisabledError, MCPError)
# fastmcp's answer to a tool past its `timeout` (function_tool.py): an MCPError told apart by its text alone.
FASTMCP_TIMEOUT = re.compile(r"Tool '.*' execution timed out after ")
TOOL_BUSY = "busy right now: the call took too long on a loaded server; try again in a moment"


def _hash_of(claims: dict | None) -> str | None:
    subject = (claims or {}).get("sub")
    return user_hash(subject) if isinstance(subject, str) and subject else None


def _timed_out(exc: BaseException | None) -> bool:
    return isinstance(exc, TimeoutError) or (isinstance(exc, MCPError) and bool(FASTMCP_TIMEOUT.match(exc.error.message)))


def _record(surface: str, exc: BaseException, user: str | None, **where: Any) -> str:
    incident = new_incident()
    UNEXPECTED_ERRORS.labels(surface).inc()
    log.error("recall.unexpected_error", surface=surface, user_hash=user, incident=incident, **where, **exception_site(exc))
    return incident


class _DropMaskedToolTracebacks(logging.Filter):
    """fastmcp's "Error calling tool" line with a traceback (an unexpected exception; the tool's
    own refusals come without one): the middleware below logs it, without the message."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and str(record.msg).startswith("Error calling tool"))


class UnexpectedToolErrors(Middleware):
    """Register first (outermost), so it sees what every other middleware and tool raise."""

    def __init__(self) -> None:
        logging.getLogger("fastmcp.server.server").addFilter(_DropMaskedToolTracebacks())

    async def on_call_tool(self, context, call_next):
        try:
            return await call_next(context)
        except ToolError as exc:
            # A tool's own refusal has no cause (raised `from None` or plainly); fastmcp's mask of
            # an unexpected exception is raised `from` it.
            if exc.__cause__ is None or (isinstance(exc.__cause__, ANSWERED) and not _timed_out(exc.__cause__)):
                raise
            failure: BaseException = exc.__cause__
        except ANSWERED:
            raise
        except Exception as exc:  # from a middleware, outside fastmcp's mask
            failure = exc
        token = get_access_token()
        user = _hash_of(token.claims if token else None)
        if _timed_out(failure):
            # Counted where its tool's calls are, so each busy ratio divides by its own calls.
            if context.message.name == RECALL_TOOL:
                RECALL_BUSY.labels("tool_timeout").inc()
            else:
                REALM_CALLS.labels("mcp", "timeout").inc()
            log.warning("recall.busy", reason="tool_timeout", tool=context.message.name, user_hash=user)
            raise ToolError(TOOL_BUSY) from None
        incident = _record("mcp", failure, user, tool=context.message.name)
        raise ToolError(f"internal error, logged as incident {incident}") from None


def record_http_failure(exc: BaseException, scope: Scope) -> str:
    """`record` of shared/unexpected_http.py: the verified token's subject, when authentication
    got that far."""
    token = getattr(scope.get("user"), "access_token", None)
    return _record("http", exc, _hash_of(getattr(token, "claims", None)), method=scope["method"], route=route_of(scope))
