"""Who sees which realm tool, and the caller of a tool call, both from the verified token.

A tool is listed (and callable) only for a token that could use it: any realm role for the
read tools, member or owner somewhere for the write tools, owner somewhere for the owners'
tools. A token without realms sees `recall_my_conversations` alone. Per-realm rules are still
checked on every call (a member of realm A is refused in realm B).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastmcp.exceptions import ToolError
from fastmcp.server.auth import AuthContext
from fastmcp.server.dependencies import get_access_token
from pydantic import ValidationError

from services.recall.artifacts.artifact_store import Conflict, StoreUnavailable
from services.recall.artifacts.models import Role
from services.recall.artifacts.realm_threads import in_realm_thread
from services.recall.artifacts.rules import RuleBroken
from services.recall.artifacts.service import Caller
from services.recall.metrics import REALM_CALLS


DATABASE_UNAVAILABLE = "database is unavailable: the realm's memory cannot be read or written right now"
CONCURRENT_CHANGE = "a concurrent change of the same thing won; nothing was written, read it again and retry"


def refusal(message: str) -> ToolError:
    """A tool error for the caller's mistake or a rule it broke: fastmcp logs it at INFO, not
    ERROR (refusals are routine and counted in recall_realm_calls_total{outcome="refused"}; an
    alert on error lines should see the service's own faults only)."""
    return ToolError(message, log_level=logging.INFO)


def _roles(ctx: AuthContext) -> set[Role]:
    if ctx.token is None or not ctx.token.claims.get("sub"):
        return set()
    return set(Caller.from_claims(ctx.token.claims).realms.values())


def any_realm(ctx: AuthContext) -> bool:
    return bool(_roles(ctx))


def writer_somewhere(ctx: AuthContext) -> bool:
    return bool(_roles(ctx) & {Role.OWNER, Role.MEMBER})


def owner_somewhere(ctx: AuthContext) -> bool:
    return Role.OWNER in _roles(ctx)


def caller() -> Caller:
    token = get_access_token()
    if token is None or not token.claims.get("sub"):
        raise refusal("authentication: the access token names no principal (sub claim)")
    return Caller.from_claims(token.claims)


async def run(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking operation in the realm's threads as the token's caller; refusals become tool
    errors whose text names the broken rule (or the invalid field)."""
    try:
        result = await in_realm_thread(fn, caller(), *args)
    except RuleBroken as exc:
        REALM_CALLS.labels("mcp", "refused").inc()
        raise refusal(str(exc)) from None
    except StoreUnavailable:
        REALM_CALLS.labels("mcp", "database_unavailable").inc()
        raise ToolError(f"{DATABASE_UNAVAILABLE}; retry in a moment", log_level=logging.WARNING) from None
    except Conflict:
        REALM_CALLS.labels("mcp", "refused").inc()  # a lost race: the caller retries
        raise refusal(f"concurrency: {CONCURRENT_CHANGE}") from None
    except ValidationError as exc:
        REALM_CALLS.labels("mcp", "refused").inc()
        first = exc.errors(include_url=False)[0]
        raise refusal(f"invalid {'.'.join(str(p) for p in first['loc']) or 'input'}: {first['msg']}") from None
    REALM_CALLS.labels("mcp", "ok").inc()
    return result
