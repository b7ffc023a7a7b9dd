"""How the HTTP services (ingest, recall) run under uvicorn.

uvloop's event loop and httptools' request parser, both named rather than left to uvicorn's
"auto" (which silently falls back to asyncio and the pure-Python h11): through the recall
service they took 0.35-0.5 ms of CPU off each call and served ~4 % more calls/s at 8 clients
(docs/benchmarks.md, round 14). uvicorn's own logging config and access log stay off: the
services log their events as JSON lines (`shared/logging_setup.py`).

On SIGTERM uvicorn lets the requests in flight finish, and by default waits for them without
end: one that never ends would hold the process until it is killed. After GRACEFUL_STOP_S it
cancels them and exits, inside Kubernetes' default 30 s grace and `recall up`'s.
"""

from __future__ import annotations

from starlette.types import ASGIApp

GRACEFUL_STOP_S = 25


def serve_http(app: ASGIApp, host: str, port: int) -> None:
    import uvicorn

    uvicorn.run(app, host=host, port=port, loop="uvloop", http="httptools", log_config=None, access_log=False,
                timeout_graceful_shutdown=GRACEFUL_STOP_S)
