"""An HTTP request that fails unexpectedly, in any service: a JSON 500 carrying an incident id
instead of Starlette's plain-text 500 and uvicorn's traceback (which holds the message, and a
message may quote the request). What to count and log is the service's (`record`)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Counter
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Defined once for every service that imports it (the recall service and the indexer; tests import
# both); each exports only its own surfaces, at 0 from the start (RecallServiceUnexpectedErrors).
UNEXPECTED_ERRORS = Counter("recall_unexpected_errors_total",
                            "MCP tool calls and HTTP requests that failed unexpectedly, by surface.", ["surface"])

# Counts and logs one failure (the scope says who asked and which route, as far as it got);
# returns the incident id.
Record = Callable[[BaseException, Scope], str]


def route_of(scope: Scope) -> str:
    """The route's template (never the path, which may name a user); none before routing, e.g.
    while the bearer token is verified."""
    return getattr(scope.get("route"), "path", "before routing")


class UnexpectedHTTPErrors:
    """ASGI middleware; add it last (`app.add_middleware`), so it is the outermost one inside
    Starlette's ServerErrorMiddleware and sees what authentication raises too. Inner middleware
    writes into the same scope, so `record` still finds the verified token and the route."""

    def __init__(self, app: ASGIApp, record: Record) -> None:
        self.app = app
        self.record = record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except ClientDisconnect:
            return  # the caller hung up mid-request (a cancelled call, a gateway timeout): nobody to answer, no fault here
        except Exception as exc:
            incident = self.record(exc, scope)
            if started:
                return  # the answer is under way: the connection just ends
            await JSONResponse({"error": "internal", "detail": f"unexpected error, logged as incident {incident}"},
                               status_code=500)(scope, receive, send)
