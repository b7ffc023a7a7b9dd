"""structlog JSON logs for every service; stdlib loggers (uvicorn, faststream) go the same way.

Rules: tenants appear only as `user_hash`; message and query text never appear (query text
only with RECALL_DEBUG=true); tracebacks carry no frame locals, which could hold secrets.
"""

from __future__ import annotations

import asyncio
import logging
import sys

import structlog

from shared.tenant_paths import user_hash


def _drop_color_message(_: object, __: str, event: dict) -> dict:
    # uvicorn puts an ANSI-coloured copy of its message in `extra`; JSON carries the plain one.
    event.pop("color_message", None)
    return event


FASTMCP_TOKEN_LOGGER = "fastmcp.server.auth.providers.jwt"
_REJECTED = "Bearer token rejected for client %s"


class HashedTokenSubjects(logging.Filter):
    """fastmcp logs a refused bearer token with its subject (the user id, when the token names no
    client): that id becomes its user_hash, as everywhere else in the logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_REJECTED) and isinstance(record.args, tuple) and record.args:
            record.args = (user_hash(str(record.args[0])), *record.args[1:])
            record.msg = record.msg.replace(_REJECTED, "Bearer token rejected for user_hash %s", 1)
        return True


class CancelledAtShutdown(logging.Filter):
    """uvicorn logs each request it cancels at the end of its stop grace as an ERROR with the
    whole stack ("Exception in ASGI application", CancelledError): a stop with 50 stalled
    clients looked like 50 failures. Such a request is one WARNING line, without the stack."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError):
            record.msg, record.args, record.exc_info = "request cancelled: the stop grace (RECALL_STOP_GRACE_S) passed", (), None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def configure_logging(level: str = "INFO") -> None:
    lvl = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    shared = [structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
              structlog.processors.TimeStamper(fmt="iso", utc=True)]
    tracebacks = structlog.processors.ExceptionRenderer(structlog.tracebacks.ExceptionDictTransformer(show_locals=False))
    structlog.configure(
        processors=[*shared, tracebacks, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder(), _drop_color_message],
        # Libraries' exceptions (uvicorn, fastmcp, faststream) as frames too, not a repr of exc_info.
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, tracebacks,
                    structlog.processors.JSONRenderer()]))
    logging.basicConfig(handlers=[handler], level=lvl, force=True)
    for noisy in ("uvicorn.access", "httpx", "mcp", "fastmcp", "faststream.access.redis"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # fastmcp gives its loggers a console handler of their own at import and stops them
    # propagating: their lines would be plain text on stderr, outside these rules.
    fastmcp_root = logging.getLogger("fastmcp")
    for own in fastmcp_root.handlers[:]:
        fastmcp_root.removeHandler(own)
    fastmcp_root.propagate = True
    uvicorn_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, CancelledAtShutdown) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(CancelledAtShutdown())
    token_log = logging.getLogger(FASTMCP_TOKEN_LOGGER)
    if not any(isinstance(f, HashedTokenSubjects) for f in token_log.filters):
        token_log.addFilter(HashedTokenSubjects())


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)
