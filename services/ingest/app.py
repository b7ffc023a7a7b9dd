"""The ingest API: `POST /turns` puts a conversation snapshot on the stream, nothing else.

It never touches tenant files, so a bad request cannot damage what is stored, and it answers
202 only once Redis has the event (XADD returned; Redis persists it with AOF). Every error
body names the field at fault.
"""

from __future__ import annotations

import hmac
import json
import time

import redis.asyncio as aioredis
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from services.ingest.api_models import Accepted, IngestRequest
from services.ingest.metrics import INGEST_LATENCY, INGEST_REQUESTS, INGEST_TURNS
from services.ingest.openapi import openapi_document
from services.ingest.settings import IngestSettings
from shared.logging_setup import get_logger
from shared.metrics_http import metrics_endpoint
from shared.stream_schema import StreamTurn, TurnsEvent, ensure_group
from shared.tenant_paths import user_hash

log = get_logger("recall.ingest")


def _error(status: int, error: str, fields: list[tuple[str, str]] = (), route: str = "/turns") -> JSONResponse:
    INGEST_REQUESTS.labels(route, str(status)).inc()
    return JSONResponse({"error": error, "fields": [{"field": f, "message": m} for f, m in fields]}, status_code=status)


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


class TooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLarge()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise TooLarge()
    return bytes(body)


def create_app(settings: IngestSettings) -> Starlette:
    client = aioredis.Redis.from_url(settings.redis, socket_timeout=5, socket_connect_timeout=2)
    key = settings.ingest_key.get_secret_value().encode()
    if not key:
        raise RuntimeError("RECALL_INGEST_KEY must be set: the ingest API never runs without a key")

    async def post_turns(request: Request) -> Response:
        started = time.perf_counter()
        try:
            return await _post_turns(request)
        finally:
            INGEST_LATENCY.labels("/turns").observe(time.perf_counter() - started)

    async def _post_turns(request: Request) -> Response:
        given = request.headers.get("x-ingest-key", "").encode()
        if not hmac.compare_digest(given, key):
            return _error(401, "missing or wrong ingest key", [("x-ingest-key", "does not match RECALL_INGEST_KEY")])
        try:
            raw = await _read_body(request, settings.ingest_max_body_bytes)
        except TooLarge:
            return _error(413, "request body too large", [("body", f"at most {settings.ingest_max_body_bytes} bytes")])
        try:
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return _error(400, "malformed JSON", [("body", str(exc))])
        if not isinstance(payload, dict):
            return _error(400, "malformed JSON", [("body", "expected a JSON object")])
        turns = payload.get("turns")
        if isinstance(turns, list) and len(turns) > settings.ingest_max_turns:
            return _error(413, "too many turns", [("turns", f"at most {settings.ingest_max_turns} turns")])
        try:
            req = IngestRequest.model_validate(payload)
        except ValidationError as exc:
            fields = [(_loc(e["loc"]), e["msg"]) for e in exc.errors(include_url=False)]
            return _error(422, "invalid request", fields)
        for i, t in enumerate(req.turns):
            if len(t.text) > settings.ingest_max_turn_chars:
                return _error(413, "turn text too long", [(f"turns[{i}].text", f"at most {settings.ingest_max_turn_chars} characters")])

        event = TurnsEvent(
            user_hash=user_hash(req.user), conversation_id=req.conversation_id, received_at=time.time(),
            turns=[StreamTurn(id=t.id or f"{req.conversation_id}-{i}", role=t.role, text=t.text, ts=t.ts)
                   for i, t in enumerate(req.turns)],
        )
        try:
            await client.xadd(settings.stream, event.fields(), maxlen=settings.stream_maxlen, approximate=True)
        except (aioredis.ConnectionError, aioredis.TimeoutError, OSError) as exc:
            log.warning("ingest.redis_unavailable", error=type(exc).__name__)
            return _error(503, "memory store unavailable, retry later", [("redis", "unreachable")])
        INGEST_REQUESTS.labels("/turns", "202").inc()
        INGEST_TURNS.inc(len(event.turns))
        log.info("ingest.accepted", user_hash=event.user_hash, conversation_id=req.conversation_id, turns=len(event.turns))
        return JSONResponse(Accepted(stored=req.conversation_id, turns=len(event.turns)).model_dump(), status_code=202)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        try:
            await client.ping()
        except Exception:
            return JSONResponse({"status": "redis unreachable"}, status_code=503)
        return JSONResponse({"status": "ready"})

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document())

    async def startup() -> None:
        import redis

        sync = redis.Redis.from_url(settings.redis, socket_connect_timeout=2)
        try:
            ensure_group(sync, settings.stream, settings.group)
        except redis.ConnectionError:
            log.warning("ingest.group_not_created", reason="redis unreachable at start; indexers create it too")
        finally:
            sync.close()

    async def shutdown() -> None:
        await client.aclose()

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        await startup()
        yield
        await shutdown()

    return Starlette(
        routes=[
            Route("/turns", post_turns, methods=["POST"]),
            Route("/healthz", healthz), Route("/readyz", readyz),
            Route("/metrics", metrics_endpoint), Route("/openapi.json", openapi),
        ],
        lifespan=lifespan,
    )
