"""The recall MCP service: one tool, the tenant taken only from the verified bearer token.

Streamable HTTP at /mcp in stateless mode, so any replica behind a load balancer answers any
call; /healthz, /readyz and /metrics are plain routes (they carry no tenant data).
"""

from __future__ import annotations

import asyncio
import json
import time
import unicodedata
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Annotated

import redis.asyncio as aioredis
from fastmcp import FastMCP
from fastmcp.server.dependencies import get_access_token
from pydantic import Field
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.recall.admission import Admission, Busy
from services.recall.artifacts.artifact_search import ArtifactSearch
from services.recall.artifacts.artifact_store import ArtifactStore, StoreUnavailable
from services.recall.artifacts.service import ArtifactService
from services.recall.artifacts.surface import register_realm_surface
from services.recall.artifacts.text_limits import max_body_bytes
from services.recall.artifacts.tool_access import refusal
from services.recall.backend import BackendOverloaded, BackendUnavailable, MemoryNeedsRebuild, RecallBackend
from services.recall.embedded_backend import EmbeddedBackend
from services.recall.fd_budget import raise_open_file_limit, readers_within
from services.recall.metrics import RECALL_BUSY, RECALL_CONCURRENCY_LIMIT, RECALL_IN_FLIGHT, RECALL_LATENCY
from services.recall.process_pool import ProcessPool
from services.recall.settings import RecallSettings
from services.recall.time_window import TimeWindow, asked_conversations, read_time, without_request
from services.recall.time_zones import time_zone
from services.recall.token_errors import RejectedTokenText
from services.recall.tokens import bearer_admitted, build_verifier
from services.recall.tool_output import RECALL_TOOL, TOOL_DESCRIPTION, AgentHit, DatedAnswer, render_for_agent
from services.recall.unexpected_errors import UnexpectedToolErrors, record_http_failure
from shared.body_budget import BodyBudget
from shared.data_dir_identity import SharedDirWatch
from shared.engine.api import Engine, MemoryState, NoIndex
from shared.engine.identifiers import query_codes
from shared.engine.version import recall_version
from shared.http_body import BodyLimit
from shared.http_serving import serve_http
from shared.index_requests import IndexRequests
from shared.logging_setup import configure_logging, get_logger
from shared.metrics_http import metrics_endpoint
from shared.recall_answer_format import (BUSY, EMPTY_QUERY, INDEXING, NO_MEMORY, NOTHING, STILL_INDEXING, UNAVAILABLE,
                                         nothing_then)
from shared.redis_client import async_redis
from shared.stream_schema import FORGET_CHANNEL
from shared.tenant_paths import TenantPaths, user_hash
from shared.unexpected_http import UnexpectedHTTPErrors
from shared.unknown_route import unknown_route

log = get_logger("recall.service")
TIME_WINDOW_POOL = 4  # passages asked of the engine per returned one when the query names a time
# An embedded search stops at its first stage boundary past the deadline; the caller waits this
# much longer for that, then answers without it (the search keeps its slot until it stops).
CALLER_GRACE_S = 1.0
ARTIFACT_READERS = 64  # the artifact search's own reader cache


def make_backend(s: RecallSettings, open_file_limit: int | None = None) -> RecallBackend:
    if s.engine == "funes":
        return ProcessPool(s.funes_bin, s.pool_max_processes, s.pool_idle_s, s.timeout_s, s.pool_start_timeout_s)
    readers = s.reader_cache
    if open_file_limit is not None:
        readers = readers_within(open_file_limit, s.reader_cache, ARTIFACT_READERS)
        if readers < s.reader_cache:
            log.warning("recall.reader_cache_capped", setting="RECALL_READER_CACHE", wanted=s.reader_cache,
                        readers=readers, open_file_limit=open_file_limit,
                        hint="raise the hard limit on open files (ulimit -Hn, LimitNOFILE) to keep more memories open")
    return EmbeddedBackend(readers, s.timeout_s, s.reader_cache_bytes, s.pool_idle_s)


def caller_user() -> str:
    token = get_access_token()
    subject = token.claims.get("sub") if token is not None else None
    if not subject or not isinstance(subject, str):
        raise refusal("the access token names no user (sub claim)")
    return subject


def caller_zone() -> tzinfo | None:
    """The time zone the token's OIDC `zoneinfo` claim names; None without a usable one (then the
    replica's default applies: a wrong zone name does not cost the user their recall)."""
    token = get_access_token()
    named = token.claims.get("zoneinfo") if token is not None else None
    zone = time_zone(named) if named is not None else None
    if named is not None and zone is None:
        log.info("recall.zoneinfo_ignored", reason="not an IANA time zone name")
    return zone


class RecallService:
    def __init__(self, settings: RecallSettings, backend: RecallBackend, index_requests: IndexRequests | None = None) -> None:
        self.s = settings
        self.backend = backend
        self.index_requests = index_requests  # None without Redis: a lost memory waits for the indexer
        self.admission = Admission(settings.max_concurrency, settings.queue_max, settings.queue_wait_s)
        self.default_zone = time_zone(settings.default_time_zone) or timezone.utc  # validated by the settings
        # The funes pool bounds every step itself (a child's start, each call, killing the child).
        self.caller_wait_s = None if settings.engine == "funes" else settings.timeout_s + CALLER_GRACE_S
        RECALL_CONCURRENCY_LIMIT.set(settings.max_concurrency)

    async def recall_for(self, user: str, query: str, zone: tzinfo | None = None) -> str:
        """The tool's answer; `zone`: where the user's days are (time words, shown dates), else
        RECALL_DEFAULT_TIME_ZONE's."""
        started = time.perf_counter()
        outcome, text = await self._answer(user, query, zone or self.default_zone)
        RECALL_LATENCY.labels(outcome).observe(time.perf_counter() - started)
        fields = {"user_hash": user_hash(user), "outcome": outcome, "ms": round((time.perf_counter() - started) * 1000, 1)}
        if self.s.debug:
            fields["query"] = query[: self.s.max_query_chars]
        log.info("recall", **fields)
        return text

    async def _answer(self, user: str, query: str, zone: tzinfo) -> tuple[str, str]:
        query = " ".join(query[: self.s.max_query_chars].split())
        if all(unicodedata.category(c) in ("Cc", "Cf", "Zs") for c in query):  # control or format characters alone
            return "empty", EMPTY_QUERY
        paths = TenantPaths.for_user(self.s.data_dir, user)
        search_query, window, upcoming = read_time(query, datetime.now(timezone.utc), zone)
        # The conversations of a time answer a question without a topic (their passages are wanted
        # for their date, whatever their words); "last time" and no time at all ask for the latest.
        dated = asked_conversations(search_query, window)
        if window is None:
            window = dated
        elif window.latest and dated is None:
            search_query, window = query, None  # a topic with "last time" is searched as if no time were named
        if dated is None:
            search_query = without_request(search_query)  # "remind me about X" is searched as "X"
        # A time window reorders a wider pool, so the in-window passages have a chance to be in it.
        k = self.s.k * TIME_WINDOW_POOL if window else self.s.k
        try:
            await self.admission.acquire()
        except Busy as busy:
            RECALL_BUSY.labels(busy.reason).inc()
            log.warning("recall.busy", user_hash=paths.uhash, reason=busy.reason)
            return "busy", BUSY
        search = asyncio.ensure_future(self._search(paths, search_query, k, fill=window is not None, dated=dated))
        search.add_done_callback(_consume_outcome)
        try:
            raw = await asyncio.wait_for(asyncio.shield(search), self.caller_wait_s)
        except (asyncio.TimeoutError, BackendOverloaded):
            # The search ran out of time on a loaded replica; the memory itself is fine.
            RECALL_BUSY.labels("search_deadline").inc()
            log.warning("recall.busy", user_hash=paths.uhash, reason="search_deadline")
            return "busy", BUSY
        except NoIndex:
            return await self._no_memory(paths)
        except NothingThen:
            text = NOTHING if dated.latest else nothing_then(dated.start, dated.end - timedelta(microseconds=1))
            return "empty", await self._unless_indexing(paths, text)
        except BackendUnavailable as exc:
            log.warning("recall.unavailable", user_hash=paths.uhash, error=str(exc)[:200])
            if isinstance(exc, MemoryNeedsRebuild):
                await self._ask_for_index_run(paths)
            return "unavailable", UNAVAILABLE
        if raw is None:
            return await self._no_memory(paths)
        if isinstance(raw, DatedAnswer):
            text = render_for_agent(raw.hits, self.s.max_result_chars, self.s.k, window, raw.conversations, zone=zone)
        else:
            text = render_for_agent(raw, self.s.max_result_chars, self.s.k, window,
                                    identifiers=query_codes(search_query), zone=zone, upcoming=upcoming)
        if text == NOTHING:
            return "empty", await self._unless_indexing(paths, text)
        return "hit", text

    async def _unless_indexing(self, paths: TenantPaths, nothing: str) -> str:
        """An answer of nothing, and a note when conversations stored just now were not searched."""
        return f"{nothing}\n{STILL_INDEXING}" if await self._index_run_due(paths) else nothing

    async def _index_run_due(self, paths: TenantPaths) -> bool:
        return self.index_requests is not None and await self.index_requests.pending(paths.uhash)

    async def _no_memory(self, paths: TenantPaths) -> tuple[str, str]:
        """No memory to search. Conversations stored without one (its first index run is due, or
        it was lost) make memory unavailable, not empty: "nothing stored" would tell the agent
        something false; the indexers are asked for the run that builds it."""
        if not await asyncio.to_thread(paths.has_conversations):
            return "no_memory", NO_MEMORY
        # Before a new user's first index run ends, "indexing": the soft-failure alert counts
        # only memories that should be there (an SRE's trial: new users' first calls set it off).
        due = await self._index_run_due(paths)
        log.info("recall.memory_missing", user_hash=paths.uhash, index_run_due=due)
        await self._ask_for_index_run(paths)
        return ("indexing", INDEXING) if due else ("unavailable", UNAVAILABLE)

    async def _ask_for_index_run(self, paths: TenantPaths) -> None:
        if self.index_requests is not None:
            await self.index_requests.ask(paths.uhash)

    async def _search(self, paths: TenantPaths, query: str, k: int, fill: bool,
                      dated: TimeWindow | None = None) -> list[AgentHit] | DatedAnswer | None:
        """Runs holding an admission slot and gives it back when the work ends, whether or not
        its caller still waits; None when the tenant has no memory (asked of the backend).
        `dated`: the question names only this time, so its conversations answer it, when the
        engine can list them (else the search as for any question); NothingThen if it holds none."""
        RECALL_IN_FLIGHT.inc()
        try:
            if await self.backend.memory_state(paths) is MemoryState.ABSENT:
                return None
            if dated is not None and (then := await self.backend.dated(paths, dated.start, dated.end, self.s.k)) is not None:
                if not then.hits:
                    raise NothingThen
                return then
            return await self.backend.recall(paths, query, k, max(self.s.candidates, 2 * k), fill)
        finally:
            RECALL_IN_FLIGHT.dec()
            self.admission.release()


class NothingThen(Exception):
    """A question naming only a time, and no stored conversation is from that time."""


def _consume_outcome(search: asyncio.Future) -> None:
    """A search whose caller gave up still ends in a result or error; fetch it so asyncio does
    not log 'exception was never retrieved'."""
    if not search.cancelled():
        search.exception()


async def _drop_forgotten(s: RecallSettings, backend: RecallBackend) -> None:
    """Indexers announce every deletion; drop that tenant's cached readers and engine children.
    Pub/sub keeps nothing for an absent subscriber, so after the subscription was down every
    cached handle goes: one of them may belong to a tenant forgotten meanwhile."""
    missed = False
    while True:
        # Not the services' retrying client (shared/redis_client.py): its pub/sub would reconnect and
        # subscribe again by itself, and the gap (a forget announced meanwhile) would go unseen.
        client = aioredis.Redis.from_url(s.redis)
        try:
            async with client.pubsub() as pubsub:
                await pubsub.subscribe(FORGET_CHANNEL)
                if missed:
                    await backend.forget_all()
                    log.info("recall.all_tenants_dropped", reason="forget announcements may have been missed")
                    missed = False
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        uhash = json.loads(message["data"])["user_hash"]
                        await backend.forget_tenant(TenantPaths.for_hash(s.data_dir, uhash))
                        log.info("recall.tenant_dropped", user_hash=uhash)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # Redis away: recall keeps answering; retry the subscription
            missed = True
            log.warning("recall.forget_listener_error", error=type(exc).__name__)
            await asyncio.sleep(2.0)
        finally:
            await client.aclose()


def build_artifact_service(s: RecallSettings) -> ArtifactService:
    url = s.artifacts_db_url or f"sqlite:///{(s.data_dir / 'artifacts.sqlite3').resolve()}"
    # Artifact search has its own engine handle (its own reader cache), sharing the loaded model.
    return ArtifactService(ArtifactStore(url), ArtifactSearch(s.data_dir, Engine(max_readers=ARTIFACT_READERS)), s.data_dir,
                           s.realm_max_text_bytes)


def check_artifacts_db(service: ArtifactService) -> None:
    """Make the artifact tables at start, and queue the refresh of every realm index left behind;
    a database that cannot be reached is one warning, and the service starts anyway (conversation
    recall does not need it; the realm surface answers "database is unavailable" until it is back,
    and a realm's first search catches its index up)."""
    try:
        service.store.check()
        service.sweep_at_start()
    except StoreUnavailable as exc:
        log.warning("recall.artifacts_db_unavailable", error=str(exc).splitlines()[0][:300],
                    hint="memory artifacts and AgentMemory answer 503 / 'database is unavailable' until it is reachable")


def build_app(settings: RecallSettings | None = None):
    s = settings or RecallSettings()
    backend = make_backend(s, raise_open_file_limit())
    index_requests = IndexRequests(s.redis) if s.redis_url else None
    shared_dir = SharedDirWatch(async_redis(s.redis), s.data_dir, register=False) if s.redis_url else None
    service = RecallService(s, backend, index_requests)
    verifier = build_verifier(s)
    # version: recall's, which MCP clients show and log (left unset, it was fastmcp's own).
    mcp = FastMCP("recall", version=recall_version(), auth=verifier, mask_error_details=True,
                  instructions="Memory of this user's earlier conversations. If the user refers to earlier work, "
                               "recall first, then answer.")
    mcp.add_middleware(UnexpectedToolErrors())  # first: the outermost

    @mcp.tool(name=RECALL_TOOL, description=TOOL_DESCRIPTION)
    async def recall_my_conversations(
            query: Annotated[str, Field(description="Short search words: identifiers, key nouns, optional time words.")]) -> str:
        return await service.recall_for(caller_user(), query, caller_zone())

    # One for the process: /mcp and AgentMemory's HTTP API buffer their bodies within the same bound.
    bodies = BodyBudget(s.body_buffer_bytes)
    artifacts = build_artifact_service(s)
    register_realm_surface(mcp, artifacts, bodies)
    check_artifacts_db(artifacts)

    @mcp.custom_route("/healthz", methods=["GET"])
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @mcp.custom_route("/readyz", methods=["GET"])
    async def readyz(request: Request) -> Response:
        if shared_dir is not None and shared_dir.problem is not None:
            return JSONResponse({"status": shared_dir.problem}, status_code=503)
        ok = backend.ready()
        return JSONResponse({"status": "ready" if ok else "engine unavailable"}, status_code=200 if ok else 503)

    @mcp.custom_route("/metrics", methods=["GET"])
    async def metrics(request: Request) -> Response:
        return await metrics_endpoint(request)

    # Plain JSON answers, not one SSE stream per call: sse-starlette ends every open stream the
    # moment the process is told to stop, so a rolling update cut off calls it had admitted;
    # a JSON response is an ordinary request uvicorn lets finish. The tools send no progress.
    app = mcp.http_app(path="/mcp", stateless_http=True, json_response=True)
    # The largest MCP request is a realm write whose text is at its limit (1 MiB by default).
    app.add_middleware(BodyLimit, path="/mcp", limit=max_body_bytes(s.realm_max_text_bytes), budget=bodies,
                       admit=bearer_admitted(verifier))
    for status in (404, 405):  # in the JSON shape of the service's other errors, not Starlette's text
        app.add_exception_handler(status, _no_such_endpoint)
    # Outermost: an exception while a bearer token is verified (an identity provider's JWKS
    # that breaks the verifier) is counted too, not Starlette's plain 500.
    app.add_middleware(RejectedTokenText)
    app.add_middleware(UnexpectedHTTPErrors, record=record_http_failure)
    inner_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a):
        backend.start()
        listener = asyncio.create_task(_drop_forgotten(s, backend)) if s.redis_url else None
        watching = asyncio.create_task(shared_dir.run_forever()) if shared_dir is not None else None
        async with inner_lifespan(a) as state:
            yield state
        for task in (listener, watching):
            if task is not None:
                task.cancel()
        if shared_dir is not None:
            await shared_dir.client.aclose()
        if index_requests is not None:
            await index_requests.close()
        await backend.close()
        artifacts.store.close()

    app.router.lifespan_context = lifespan
    return app


async def _no_such_endpoint(request: Request, exc: HTTPException) -> Response:
    field, detail = unknown_route(request, exc, "MCP is at /mcp, AgentMemory at /realms/<realm>/memory")
    error = "not_found" if field == "path" else "method_not_allowed"
    return JSONResponse({"error": error, "detail": detail}, status_code=exc.status_code, headers=exc.headers)


def serve() -> None:
    s = RecallSettings()
    configure_logging(s.log_level)
    serve_http(build_app(s), s.recall_host, s.recall_port, s)
