"""A request body read with a size limit: the services' JSON endpoints never buffer more than
they would accept."""

from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Awaitable, Callable

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    """The body, read no further than `limit` bytes; BodyTooLarge past it (a declared
    Content-Length over the limit is refused before anything is read)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise BodyTooLarge
    return bytes(body)


class BodyLimit:
    """ASGI middleware: a request to `path` whose body passes `limit` bytes is answered 413
    (`body_size`) before the app sees any of it. The endpoint behind it buffers and parses
    whole bodies (the MCP SDK takes 4 MiB), so its own limit would let every caller spend
    CPU parsing megabytes no tool argument can hold.

    A request `admit` turns away (no valid bearer token) goes to the app unread, which refuses it
    (401) without its body: buffered first, 1,500 stalled callers without a token held up to a
    MiB each and took a replica from 362 MB to 1.75 GB (a security review's trial)."""

    def __init__(self, app: ASGIApp, path: str, limit: int,
                 admit: Callable[[Scope], Awaitable[bool]] | None = None) -> None:
        self.app, self.path, self.limit, self.admit = app, path, limit, admit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].rstrip("/") != self.path:
            return await self.app(scope, receive, send)
        if self.admit is not None and not await self.admit(scope):
            return await self.app(scope, receive, send)
        declared = Headers(scope=scope).get("content-length")
        if declared and declared.isdigit() and int(declared) > self.limit:
            return await self._refuse(scope, receive, send)
        messages: list[Message] = []
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # the client went away: the app hears it as it would have
            size += len(message.get("body", b""))
            if size > self.limit:
                return await self._refuse(scope, receive, send)
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"the request body is over {self.limit:,} bytes, the most {self.path} reads"
        await JSONResponse({"error": "body_size", "detail": detail}, status_code=413)(scope, receive, send)


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
