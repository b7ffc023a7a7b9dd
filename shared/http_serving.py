"""How the HTTP services (ingest, recall) run under uvicorn.

uvloop's event loop and httptools' request parser, both named rather than left to uvicorn's
"auto" (which silently falls back to asyncio and the pure-Python h11): through the recall
service they took 0.35-0.5 ms of CPU off each call and served ~4 % more calls/s at 8 clients
(docs/benchmarks.md, round 14). uvicorn's own logging config and access log stay off: the
services log their events as JSON lines (`shared/logging_setup.py`).

On SIGTERM uvicorn lets the requests in flight finish, and by default waits for them without
end: one that never ends (a client that stalls in the middle of its body) held the process
until it was killed. After `stop_grace_s` (RECALL_STOP_GRACE_S) it cancels them and exits.
"""

from __future__ import annotations

from starlette.types import ASGIApp


def serve_http(app: ASGIApp, host: str, port: int, stop_grace_s: float) -> None:
    import uvicorn

    uvicorn.run(app, host=host, port=port, loop="uvloop", http="httptools", log_config=None, access_log=False,
                timeout_graceful_shutdown=stop_grace_s)
