"""What a client reads when its bearer token is refused.

fastmcp answers a token it cannot verify with 401 `invalid_token` and a text for OAuth clients
("clear authentication tokens ... your client should automatically re-register"). recall's
tokens are JWTs a gateway signs (or `recall token` mints in development): there is nothing to
re-register, and that text sent newcomers looking for an OAuth flow. The status, the error
code and the challenge stay as RFC 6750 has them; only the description says what is wrong and
what to do. A request without a token (401 with no body) passes unchanged.

Every 401 is counted (`recall_tokens_rejected_total{reason}`) and logged as `token.rejected`, at
most once per LOG_EVERY_S per reason with the count since: a replica given another signing
secret than the gateway's refused every call with nothing in its logs or metrics.
"""

from __future__ import annotations

import json
import time

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.recall.metrics import TOKENS_REJECTED
from shared.logging_setup import get_logger

log = get_logger("recall.tokens")
LOG_EVERY_S = 10.0

DESCRIPTION = ("The bearer token was not accepted: it is malformed, expired, or not signed for this service "
               "(its key, issuer or audience). Ask the gateway for a new token; in development, "
               "`recall token --user <id>` mints one.")
TWICE = "The Authorization header is given more than once; send one bearer token."


class RejectedTokenText:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._unlogged: dict[str, int] = {}
        self._logged_at: dict[str, float] = {}

    def _rejected(self, reason: str) -> None:
        TOKENS_REJECTED.labels(reason).inc()
        self._unlogged[reason] = self._unlogged.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._logged_at.get(reason, -LOG_EVERY_S) >= LOG_EVERY_S:
            log.warning("token.rejected", reason=reason, requests=self._unlogged.pop(reason))
            self._logged_at[reason] = now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if sum(name == b"authorization" for name, _ in scope["headers"]) > 1:
            # The verifier reads the first: a proxy that appends its own header would decide who calls.
            self._rejected("invalid")
            await JSONResponse({"error": "invalid_request", "error_description": TWICE}, status_code=400)(scope, receive, send)
            return
        held: Message | None = None  # a 401's start, sent once its body says which error it is

        async def send_described(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] == 401:
                held = message
                return
            if held is not None and message["type"] == "http.response.body":
                start, held = held, None
                body = message.get("body", b"")
                invalid = b'"invalid_token"' in body
                self._rejected("invalid" if invalid else "missing")
                if invalid and not message.get("more_body"):
                    body = json.dumps({"error": "invalid_token", "error_description": DESCRIPTION}).encode()
                    challenge = f'Bearer error="invalid_token", error_description="{DESCRIPTION}"'.encode()
                    headers = [(k, v) for k, v in start["headers"] if k.lower() not in (b"content-length", b"www-authenticate")]
                    start = {**start, "headers": [*headers, (b"content-length", str(len(body)).encode()),
                                                  (b"www-authenticate", challenge)]}
                    message = {**message, "body": body}
                await send(start)
            await send(message)

        await self.app(scope, receive, send_described)
