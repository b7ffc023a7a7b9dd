"""A request body read with a size limit and a deadline: the services' JSON endpoints never
buffer more than they would accept, nor wait for it longer than the request may take to arrive.

The deadline is the one `shared/http_serving.py` sets on each request (RECALL_REQUEST_READ_TIMEOUT_S
from its first byte), handed over in the scope. Before, a caller with a valid key or token that
sent its headers and part of its body, then nothing, held what it had sent (up to the body
limit, 1 MiB at /mcp) until that deadline closed the connection; the MCP endpoint then logged
the disconnect as an error with its stack, and no metric counted it. Now such a body is a 408
(`body_timeout`), one warning line and `recall_http_bodies_refused_total{reason="stalled"}`.

What the bodies still arriving hold, together, is bounded by the process's `BodyBudget`
(`shared/body_budget.py`, RECALL_BODY_BUFFER_BYTES): a body whose next chunk would pass it is a
503 "busy" at once, one warning line (`http.body_budget`) and `reason="budget"`.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable

from prometheus_client import Counter
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.body_budget import BodyBudget, BudgetSpent
from shared.logging_setup import get_logger
from shared.unexpected_http import route_of

log = get_logger("recall.http")

# The scope key under which the server puts the loop time by which the request must have arrived whole.
READ_DEADLINE = "recall.read_deadline"

# Every process defines it once (ingest and the recall service each export their own).
BODIES_REFUSED = Counter("recall_http_bodies_refused_total",
                         "Request bodies not read whole, by reason: stalled (answered 408: not whole by "
                         "RECALL_REQUEST_READ_TIMEOUT_S), too_large (413), client_closed (the caller hung up mid-body), "
                         "budget (503: the bodies arriving held RECALL_BODY_BUFFER_BYTES).",
                         ["reason"])
for _reason in ("stalled", "too_large", "client_closed", "budget"):
    BODIES_REFUSED.labels(_reason)


class BodyTooLarge(Exception):
    pass


class BodyBusy(Exception):
    """The bodies arriving hold the process's whole budget; `detail` says so, for a 503."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class BodyStalled(Exception):
    """The body had not arrived whole by the request's read deadline; `detail` says how far it got."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class BodyCompressed(Exception):
    """The body came with a Content-Encoding (gzip, br …); `detail` says so, for a 415."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def compressed_body(headers: Headers) -> str | None:
    """Why a body sent with a Content-Encoding is refused, or None for one sent as it is. The
    services read JSON as sent: a gzip body was answered "not UTF-8: byte 0x8b at offset 1" (ingest)
    or a JSON-RPC parse error (/mcp), which names the wrong thing; and inflating one would read
    past every size limit (a kilobyte of gzip inflates to megabytes)."""
    encoding = headers.get("content-encoding", "").strip()
    if encoding.lower() in ("", "identity"):
        return None
    return f"Content-Encoding {encoding[:40]!r} is not accepted: send the body uncompressed"


async def read_body(request: Request, limit: int, budget: BodyBudget) -> bytes:
    """The body, read no further than `limit` bytes; BodyCompressed for one sent compressed,
    BodyTooLarge past the limit (a declared Content-Length over it is refused before anything is
    read), BodyStalled when it has not arrived by the request's read deadline, BodyBusy when its
    next chunk would pass `budget`."""
    if problem := compressed_body(request.headers):
        raise BodyCompressed(problem)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        BODIES_REFUSED.labels("too_large").inc()
        raise BodyTooLarge
    body = bytearray()
    try:
        with budget.lease() as lease:
            async with _until_read_deadline(request.scope):
                async for chunk in request.stream():
                    if len(body) + len(chunk) > limit:
                        BODIES_REFUSED.labels("too_large").inc()
                        raise BodyTooLarge
                    lease.take(len(chunk))
                    body += chunk
    except TimeoutError:
        raise BodyStalled(_stalled(request.scope, route_of(request.scope), len(body))) from None
    except BudgetSpent as spent:
        raise BodyBusy(_over_budget(route_of(request.scope), len(body), spent.held, budget.limit)) from None
    except ClientDisconnect:
        BODIES_REFUSED.labels("client_closed").inc()
        raise
    return bytes(body)


def _until_read_deadline(scope: Scope) -> asyncio.Timeout:
    """A timeout at the request's read deadline; none for a request that came without one (an
    in-process test client)."""
    return asyncio.timeout_at(scope.get("extensions", {}).get(READ_DEADLINE))


def _stalled(scope: Scope, route: str, received: int) -> str:
    """Counts and logs a body that stalled (one line, no stack: nothing failed here); the detail
    for its 408. `route`: a template or a fixed path, never the path itself (it may name a user)."""
    BODIES_REFUSED.labels("stalled").inc()
    declared = Headers(scope=scope).get("content-length")
    log.warning("http.body_timeout", route=route, received_bytes=received, declared_bytes=declared)
    promised = f" of the {declared} its Content-Length announced" if declared and declared.isdigit() else ""
    return (f"the request body did not arrive in time: {received:,} bytes{promised} within the read timeout "
            "(RECALL_REQUEST_READ_TIMEOUT_S)")


def _over_budget(route: str, received: int, held: int, limit: int) -> str:
    """Counts and logs a body refused for the budget (one line, no stack: load, not a failure);
    the detail for its 503. `held`: what every body arriving held then, this one's included."""
    BODIES_REFUSED.labels("budget").inc()
    log.warning("http.body_budget", route=route, received_bytes=received, held_bytes=held, budget_bytes=limit)
    return (f"busy right now: the request bodies arriving hold the {limit:,} bytes this service keeps for "
            "them (RECALL_BODY_BUFFER_BYTES); retry in a moment")


class BodyLimit:
    """ASGI middleware: a request to `path` whose body passes `limit` bytes is answered 413
    (`body_size`) before the app sees any of it, and one whose body has not arrived by the
    request's read deadline 408 (`body_timeout`). The endpoint behind it buffers and parses
    whole bodies (the MCP SDK takes 4 MiB), so its own limit would let every caller spend
    CPU parsing megabytes no tool argument can hold.

    A request `admit` turns away (no valid bearer token) goes to the app unread, which refuses it
    (401) without its body: buffered first, 1,500 stalled callers without a token held up to a
    MiB each and took a replica from 362 MB to 1.75 GB (a security review's trial). One admitted
    is buffered within `budget`, shared with the process's other bodies: past it, 503 `busy`."""

    def __init__(self, app: ASGIApp, path: str, limit: int, budget: BodyBudget,
                 admit: Callable[[Scope], Awaitable[bool]] | None = None) -> None:
        self.app, self.path, self.limit, self.budget, self.admit = app, path, limit, budget, admit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != self.path:
            return await self.app(scope, receive, send)
        if self.admit is not None and not await self.admit(scope):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        if problem := compressed_body(headers):
            return await JSONResponse({"error": "body_encoding", "detail": problem}, status_code=415)(scope, receive, send)
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(scope, receive, send)
        messages: list[Message] = []
        size = 0
        try:
            with self.budget.lease() as lease:  # given back once the body is whole, before the app parses it
                async with _until_read_deadline(scope):
                    async for message in _messages(receive):
                        chunk = len(message.get("body", b""))
                        if size + chunk > self.limit:
                            raise BodyTooLarge
                        lease.take(chunk)
                        messages.append(message)
                        size += chunk
        except BodyTooLarge:
            messages.clear()
            return await self._refuse(scope, receive, send)
        except BudgetSpent as spent:
            messages.clear()
            detail = _over_budget(self.path, size, spent.held, self.budget.limit)
            return await JSONResponse({"error": "busy", "detail": detail}, status_code=503)(scope, receive, send)
        except TimeoutError:
            messages.clear()  # not held while the answer is sent
            detail = _stalled(scope, self.path, size)
            # The rest of the body may still come: the connection ends with this answer.
            return await JSONResponse({"error": "body_timeout", "detail": detail}, status_code=408,
                                      headers={"connection": "close"})(scope, receive, send)
        except ClientDisconnect:
            # The caller hung up before its body arrived: nobody to answer. The MCP SDK, given the
            # disconnect, logged it as an error with its stack.
            BODIES_REFUSED.labels("client_closed").inc()
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        BODIES_REFUSED.labels("too_large").inc()
        detail = f"the request body is over {self.limit:,} bytes, the most {self.path} reads"
        await JSONResponse({"error": "body_size", "detail": detail}, status_code=413)(scope, receive, send)


async def _messages(receive: Receive) -> AsyncIterator[Message]:
    """The request's body messages up to its last; ClientDisconnect if the client goes first."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise ClientDisconnect
        yield message
        if not message.get("more_body", False):
            return


class BodyNotUtf8(Exception):
    """The body is not UTF-8 text: `status` 415 for another encoding (named in `detail`), 400 for
    bytes that are no encoding at all."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def utf8_text(raw: bytes) -> str:
    """The body as text. JSON between systems is UTF-8 without a byte order mark (RFC 8259
    §8.1); json.loads would also take UTF-16 or UTF-32 and skip a UTF-8 BOM, where another reader
    of the same body (a proxy, an audit log) may not: both are refused, naming the encoding."""
    encoding = json.detect_encoding(raw)  # the guess json.loads makes, from a BOM or NUL bytes
    if encoding == "utf-8-sig":
        raise BodyNotUtf8(415, "starts with a UTF-8 byte order mark (EF BB BF): send UTF-8 without one (RFC 8259 §8.1)")
    if encoding != "utf-8":
        raise BodyNotUtf8(415, f"is {_encoding_name(raw, encoding)}, not UTF-8: JSON must be sent as UTF-8 (RFC 8259 §8.1)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyNotUtf8(400, f"not UTF-8: byte {raw[exc.start]:#04x} at offset {exc.start}") from None


def _encoding_name(raw: bytes, encoding: str) -> str:
    if encoding in ("utf-16", "utf-32"):  # json saw a BOM: its first bytes give the byte order
        order = "LE" if raw.startswith(codecs.BOM_LE) else "BE"
        return f"{encoding.upper()}{order} (with a byte order mark)"
    return f"{encoding.upper().replace('-LE', 'LE').replace('-BE', 'BE')} (by its NUL bytes)"


def huge_integer(digits: int) -> str:
    """What is wrong with an integer of more digits than Python converts (json.loads would stop
    at it with Python's hint to change `sys.set_int_max_str_digits`, a setting of ours)."""
    return f"an integer of {digits:,} digits; no field takes one of more than {sys.get_int_max_str_digits():,}"
