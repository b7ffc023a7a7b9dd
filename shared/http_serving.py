"""How the HTTP services (ingest, recall) run under uvicorn.

uvloop's event loop and httptools' request parser, both named rather than left to uvicorn's
"auto" (which silently falls back to asyncio and the pure-Python h11): through the recall
service they took 0.35-0.5 ms of CPU off each call and served ~4 % more calls/s at 8 clients
(docs/benchmarks.md, round 14). uvicorn's own logging config and access log stay off: the
services log their events as JSON lines (`shared/logging_setup.py`).

On SIGTERM uvicorn lets the requests in flight finish, and by default waits for them without
end: one that never ends (a client that stalls in the middle of its body) held the process
until it was killed. After `stop_grace_s` (RECALL_STOP_GRACE_S) it cancels them and exits.

uvicorn also waits without end for a request to arrive: its keep-alive timer starts only after
a response, so a connection that sends nothing, half its headers or half its body stayed open
for good, and ~20,000 of them (no key or token needed) took every file descriptor: /healthz
and every caller got connection resets. Each request now has `read_timeout_s`
(RECALL_REQUEST_READ_TIMEOUT_S) from its first byte, or from the connection's opening, to
arrive whole; then the connection is closed. A request whose headers came but whose body did
not is the app's to answer (408, `shared/http_body.py`, which reads the deadline from the scope):
the connection is closed only if no answer has started `ANSWER_GRACE_S` later. Closed at once,
a caller with a valid key or token that stalled its body got no answer, the MCP endpoint logged
the disconnect as an error with its stack, and nothing counted it.

uvicorn closes a connection idle for 5 s after its last response, as long as httpx keeps an idle
connection in its pool: a caller that reuses one just as the timer fires sends a request into a
closing socket and gets a ReadError (behind a load balancer, a 502). A busy process makes that
window wide, since its loop runs the timer before it reads the socket: a pool of httpx clients
posting every 4.9-5 s to ingest beside large posts lost ~1 in 10 of its requests
(docs/benchmarks.md, round 35). The keep-alive is RECALL_HTTP_KEEP_ALIVE_S (75 s: longer than
common clients' and load balancers' idle timeouts, so the caller closes first).

httptools keeps a request's headers in memory until their end, however long they are: four
connections without a key, each sending a 64 MiB header, took ingest from 74 to 336 MB (its pod's
limit is 512). A request whose request line and headers pass `max_header_bytes`
(RECALL_MAX_HEADER_BYTES, 64 KiB, as AWS's load balancers allow) is answered 431 and its connection
closed; one socket read (at most 256 KiB) is the most it holds past that.

On SIGTERM uvicorn closed every idle kept-alive connection at once, and a request a caller had
just sent on one was lost (ReadError: the caller cannot tell whether its turn was stored): 40
pooled callers lost 43 posts over 10 stops (docs/benchmarks.md, round 35). A stop now first drains for up to DRAIN_S: it takes no new connection, and every answer
closes its own (`connection: close`), so a caller in the middle of its traffic leaves cleanly;
uvicorn's shutdown then closes what is left, connections idle all that while.

uvicorn queues every request a connection pipelines while an earlier one is answered, without a
bound: four connections without a key writing 16 MiB of `GET /healthz` each, and reading no
answer, took ingest from 74 MB to 3.6 GB, kept after they closed. A connection with more than
MAX_PIPELINED requests waiting is cut off (HTTP clients in use do not pipeline at all).

After a graceful stop uvicorn re-raises the signal that asked for it, so a stopped ingest or
recall service exited 143 (-15) and an orchestrator saw a clean stop as an error, unlike the
indexer's 0. `GracefulServer` exits 0 once it has shut down as asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

from prometheus_client import Counter
from starlette.types import ASGIApp

from shared.http_body import READ_DEADLINE
from shared.logging_setup import get_logger
from shared.settings_base import CommonSettings

log = get_logger("recall.http")

CONNECTIONS_CUT = Counter("recall_http_connections_cut_total",
                          "Connections closed mid-request by reason: headers_too_large (431: a request line and "
                          "headers past RECALL_MAX_HEADER_BYTES), pipeline_too_deep (400: more than MAX_PIPELINED "
                          "requests pipelined behind the one being answered).", ["reason"])
for _reason in ("headers_too_large", "pipeline_too_deep"):
    CONNECTIONS_CUT.labels(_reason)

ANSWER_GRACE_S = 2.0  # for the app's 408 once the read deadline has passed
DRAIN_S = 2.0  # a stop's drain: a caller sending every second or more often has left by then
MAX_PIPELINED = 16  # requests one connection may have waiting behind the one being answered


def serve_http(app: ASGIApp, host: str, port: int, settings: CommonSettings) -> None:
    import uvicorn

    protocol = bounded_read_protocol(settings)
    config = uvicorn.Config(app, host=host, port=port, loop="uvloop", http=protocol,
                            log_config=None, access_log=False, timeout_graceful_shutdown=settings.stop_grace_s,
                            timeout_keep_alive=settings.http_keep_alive_s)

    class GracefulServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                yield
                self._captured_signals.clear()  # it shut down as asked: nothing is left for the signal to do

        async def shutdown(self, sockets: list | None = None) -> None:
            if not self.force_exit:  # a second Ctrl-C skips the drain
                await self._drain(sockets)
            await super().shutdown(sockets)

        async def _drain(self, sockets: list | None) -> None:
            for server in self.servers:
                server.close()  # no new connection
            for sock in sockets or []:
                sock.close()
            protocol.draining = True
            for connection in list(self.server_state.connections):
                connection.close_after_answer()
            deadline = asyncio.get_running_loop().time() + DRAIN_S
            while self.server_state.connections and not self.force_exit and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)

    GracefulServer(config).run()


class PipelineTooDeep(Exception):
    pass


def bounded_read_protocol(settings: CommonSettings) -> type[asyncio.Protocol]:
    """httptools' protocol (uvicorn's) with a deadline on reading each request whole, limits on the
    size of its headers and on the requests pipelined behind it, and the stop's drain."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    read_timeout_s, max_header_bytes = settings.request_read_timeout_s, settings.max_header_bytes

    class BoundedReadProtocol(HttpToolsProtocol):
        _read_deadline: asyncio.TimerHandle | None = None
        _answer_grace = False  # the app was given ANSWER_GRACE_S past this request's deadline
        _awaiting_headers = True  # the next bytes belong to a request line and headers not yet whole
        _header_bytes = 0  # bytes received of them
        _boundary = False  # a request's headers or body ended within the read being parsed
        draining = False  # set on the class when the service stops: every answer then closes its connection

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            self._boundary = False
            super().data_received(data)
            # Counted once the parser has had them, and only reads that all belong to one request's
            # headers: one that ended a request holds its body too (a pipelined request's headers
            # may start in it: at most one read more then).
            if self._boundary or not self._awaiting_headers or self.transport.is_closing():
                return
            self._header_bytes += len(data)
            if self._header_bytes > max_header_bytes:
                self._refuse_headers()

        def on_headers_complete(self) -> None:
            self._awaiting_headers, self._header_bytes, self._boundary = False, 0, True
            super().on_headers_complete()
            if self.draining:
                self.close_after_answer()
            if len(self.pipeline) > MAX_PIPELINED:
                CONNECTIONS_CUT.labels("pipeline_too_deep").inc()
                log.warning("http.pipeline_too_deep", waiting=len(self.pipeline))
                # Raised from the parser's callback, it stops the parse of this read: uvicorn answers 400 and closes.
                raise PipelineTooDeep(f"more than {MAX_PIPELINED} pipelined requests waiting")

        def close_after_answer(self) -> None:
            """The answer in progress, or the next one, says `connection: close` and ends the connection."""
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.keep_alive = False

        def on_message_begin(self) -> None:  # a request's first byte (a kept-alive connection's next one too)
            super().on_message_begin()
            self._answer_grace = False
            self._arm()
            self.scope["extensions"] = {READ_DEADLINE: self._read_deadline.when()}

        def on_message_complete(self) -> None:
            self._disarm()
            self._awaiting_headers, self._header_bytes, self._boundary = True, 0, True
            super().on_message_complete()

        def _refuse_headers(self) -> None:
            CONNECTIONS_CUT.labels("headers_too_large").inc()
            log.warning("http.headers_too_large", received_bytes=self._header_bytes, limit_bytes=max_header_bytes)
            detail = json.dumps({"error": "headers_too_large",
                                 "detail": f"the request line and headers passed {max_header_bytes:,} bytes (RECALL_MAX_HEADER_BYTES)"})
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(detail), detail.encode()))
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, delay_s: float = read_timeout_s) -> None:
            self._disarm()
            self._read_deadline = self.loop.call_later(delay_s, self._read_timed_out)

        def _disarm(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
                self._read_deadline = None

        def _read_timed_out(self) -> None:
            self._read_deadline = None
            if self._awaits_answer():
                self._answer_grace = True
                self._arm(ANSWER_GRACE_S)
                return
            if not self.transport.is_closing():
                self.transport.close()  # a handler still reading the body sees the client gone

        def _awaits_answer(self) -> bool:
            """This request's headers arrived (its cycle runs the app) and nothing is answered yet:
            the app is timing its body out too, once."""
            cycle = self.cycle
            return not self._answer_grace and cycle is not None and cycle.scope is self.scope and not cycle.response_started

    return BoundedReadProtocol
