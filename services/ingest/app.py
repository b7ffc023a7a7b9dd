"""The ingest API. It only validates, redacts and publishes: it never touches tenant files, so
a bad request cannot damage what is stored, and it answers 202 only once Redis has the event
(XADD returned; Redis persists it with AOF). Every error body names the field at fault.

- `POST /turns`: a conversation snapshot (secrets redacted, recall echoes dropped);
- `DELETE /conversations/{id}` (user in the query or body) and `DELETE /users/{user}` (or
  `DELETE /users` with the user in the query or body, for any user id): forget,
  through the same stream so the order against in-flight turns is exact; both return a receipt;
- `GET /deletions/{receipt}`: pending or done, with what was removed;
- `PUT /users/{user}/retention`: a per-user retention override (`DELETE` clears it).

Turns are refused with 503 (not accepted and lost later) while an indexer reports that the data
dir is not writable (`STORAGE_UNWRITABLE` in Redis, refreshed by the indexers' probe).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

import redis.asyncio as aioredis
from redis.exceptions import OutOfMemoryError
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.convertors import PathConvertor, register_url_convertor
from starlette.exceptions import HTTPException
from starlette.routing import Route

from services.ingest.api_models import Accepted, ForgetUser, IngestRequest, IngestTurn, RetentionOverride
from services.ingest.metrics import INGEST_LATENCY, INGEST_REDACTIONS, INGEST_REQUESTS, INGEST_TURNS
from services.ingest.openapi import openapi_document
from services.ingest.redaction import Redacted, Redactor
from services.ingest.settings import IngestSettings
from services.ingest.stream_readers import StreamReaders, group_readers
from shared.error_site import exception_site, new_incident
from shared.body_budget import BodyBudget
from shared.http_body import BodyBusy, BodyCompressed, BodyNotUtf8, BodyStalled, BodyTooLarge, huge_integer, read_body, utf8_text
from shared.logging_setup import get_logger
from shared.metrics_http import metrics_endpoint
from shared.raw_url import NOT_UTF8, not_utf8_parameters, query_pairs
from shared.recall_answer_format import looks_like_recall_answer
from shared.redis_client import READY_CHECK_S, async_redis
from shared.stream_schema import (
    RETENTION_OVERRIDES,
    STORAGE_UNWRITABLE,
    DeletionReceipt,
    StreamTurn,
    TurnsEvent,
    deletion_key,
    ensure_group,
    request_forget,
)
from shared.tenant_paths import CONVERSATION_ID, user_hash
from shared.unknown_route import unknown_route

log = get_logger("recall.ingest")
RECALL_TOOL = "recall_my_conversations"
RECEIPT = re.compile(r"[0-9a-f]{24}")


class AnyText(PathConvertor):
    """A user id in the path may hold any character, newlines included (`path` stops at them).
    It may be empty so that `DELETE /users/` is a 422 naming `user`, not a redirect to `/users`."""

    regex = "(?s:.*)"


register_url_convertor("anytext", AnyText())


class StorageState(NamedTuple):
    unwritable: bytes | None  # an indexer's reason, while the data dir is not writable
    backlog: int  # stream entries
    used_memory: int
    maxmemory: int  # 0: no limit
    readers: int | None  # consumers of the indexers' group on this stream; None: not known


# An error body lists at most this many fields: a 2 MB body of 200,000 unknown keys (or a URL of
# thousands of unknown query parameters) must not earn a reply several times its own size.
MAX_LISTED_FIELDS = 20
REDIS_TIMEOUT_S = 2.0  # any other command's answer
# Text one step of cleaning redacts (a few ms of CPU): the posts in flight take turns in the
# cleaning thread at this grain (IngestAPI._clean_snapshot).
CLEANING_STEP_CHARS = 50_000


class HTTPProblem(Exception):
    def __init__(self, status: int, error: str, fields: list[tuple[str, str]]) -> None:
        self.status, self.error = status, error
        unlisted = len(fields) - MAX_LISTED_FIELDS
        self.fields = fields if unlisted <= 0 else [
            *fields[:MAX_LISTED_FIELDS], ("body", f"{unlisted} more problems not listed; fix the ones above first")]


def _printable(text: str) -> str:
    """Field names echo the client's keys, which may hold lone surrogates; the error body must still encode."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return _printable(out) or "body"


def _redis_problem(exc: Exception) -> str:
    if isinstance(exc, OutOfMemoryError):
        return "full (maxmemory reached): the indexers' backlog must drain first"
    if isinstance(exc, aioredis.ResponseError):
        return f"refused the write ({type(exc).__name__})"
    return "unreachable"


def _user_hash_of(request: Request) -> str | None:
    """The tenant of a request, hashed, as far as it was read (body, path or query); None for none."""
    user = getattr(request.state, "user", None) or request.path_params.get("user") or request.query_params.get("user")
    return user_hash(user) if isinstance(user, str) else None


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _query_and_path_problems(request: Request, allowed: frozenset[str]) -> list[tuple[str, str]]:
    """What is wrong with the URL, checked on its raw bytes (`shared.raw_url`): `?user=%ff` would
    otherwise forget a user named "\ufffd" and answer 202 for it."""
    # Like unknown body fields: a typo must not be silently ignored.
    unknown = [name for name, _ in query_pairs(request.scope) if name not in allowed]
    return ([(_printable(name), "unknown query parameter") for name in unknown]
            + [(name, NOT_UTF8) for name in not_utf8_parameters(request.scope, request.path_params) if name not in unknown])


class _HugeInteger:
    """An integer of more digits than Python converts (sys.get_int_max_str_digits(), 4,300), in
    place of its value: json.loads would stop at it with Python's own hint (use
    sys.set_int_max_str_digits), where the answer must name the field it sits in."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


class _KeyGivenTwice(dict):
    """A parsed JSON object in which `key` was given more than once (the first such key)."""

    def __init__(self, pairs: list[tuple[str, Any]], key: str) -> None:
        super().__init__(pairs)
        self.key = key


def _object_marking_a_duplicate_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json.loads keeps the last of two equal keys, where another reader of the same body (a
    proxy, an audit log) may take the first: {"user": "a", "user": "b"} must name no tenant.
    The object is only marked here: objects are built innermost first, so where it sits
    (`turns[3].text`) is known once the whole body is parsed."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return _KeyGivenTwice(pairs, key)
        seen.add(key)
    return dict(pairs)


def _loads_marking_problems(text: str) -> tuple[Any, bool]:
    """The parsed body, and whether some object in it gave a key twice or some integer was too
    long for Python."""
    marked = False

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal marked
        obj = _object_marking_a_duplicate_key(pairs)
        marked = marked or isinstance(obj, _KeyGivenTwice)
        return obj

    def parse_int(digits: str) -> int | _HugeInteger:
        nonlocal marked
        try:
            return int(digits)
        except ValueError:
            marked = True
            return _HugeInteger(len(digits.lstrip("-")))

    return json.loads(text, object_pairs_hook=hook, parse_int=parse_int), marked


def _first_marked_problem(payload: Any) -> tuple[str, str]:
    """Where the first key given twice or integer too long is, in document order, and what it is.
    Iterative: the body may be nested as deeply as json.loads allows."""
    stack: list[tuple[Any, tuple]] = [(payload, ())]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, _KeyGivenTwice):
            return _loc((*loc, value.key)), "given more than once in one JSON object"
        if isinstance(value, _HugeInteger):
            return _loc(loc), huge_integer(value.digits)
        if isinstance(value, dict):
            stack.extend((v, (*loc, k)) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((v, (*loc, i)) for i, v in reversed(list(enumerate(value))))
    raise AssertionError("walked only once json.loads marked something in it")


def _validate(model: type[BaseModel], payload: Any) -> Any:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        # A validator's own message is already the reason: pydantic's "Value error, " adds nothing.
        raise HTTPProblem(422, "invalid request", [(_loc(e["loc"]), e["msg"].removeprefix("Value error, "))
                                                   for e in exc.errors(include_url=False)])


class IngestAPI:
    def __init__(self, settings: IngestSettings) -> None:
        self.s = settings
        self.key = settings.ingest_key.get_secret_value().encode()
        if not self.key:
            raise RuntimeError("RECALL_INGEST_KEY must be set: the ingest API never runs without a key")
        # Rotation: while RECALL_INGEST_KEY_NEXT is set, both keys are accepted (docs/operations.md).
        self.next_key = settings.ingest_key_next.get_secret_value().encode() or None
        # A Redis that stops answering costs each request 2 s before its 503, not the client's default 5 s:
        # the gateway retries sooner, and its own timeout is not spent waiting here.
        self.redis = async_redis(settings.redis, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=2)
        self.redactor = Redactor(pii=settings.redact_pii)
        self._memory_unknown_logged = False
        self.readers = StreamReaders(settings.stream, settings.group)
        self.bodies = BodyBudget(settings.body_buffer_bytes)  # what every body still arriving holds, together
        # Snapshots are checked and redacted in one thread of their own. That work holds the GIL
        # (regular expressions, pydantic), so more threads clean no faster; through asyncio's
        # default pool (min(32, cores + 4) threads, the node's cores in a pod) every post in
        # flight took a thread, and the event loop, one more GIL waiter among them, answered
        # /healthz in up to 0.95 s and /readyz in up to 2.3 s on 2 cores (docs/benchmarks.md,
        # round 34). The posts in flight take turns in it a step at a time (_clean_snapshot).
        self.cleaner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ingest-clean")

    # ---- plumbing -------------------------------------------------------------------------------
    def route(self, path: str, handler, methods: list[str], query: frozenset[str] = frozenset()) -> Route:
        for status in ("500", "503"):  # at 0 from the start: increase() sees the first unexpected error, the first 503
            INGEST_REQUESTS.labels(path, status)
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            try:
                keys = request.headers.getlist("x-ingest-key")
                key = keys[0] if len(keys) == 1 else None
                if not self._key_matches((key or "").encode()):
                    problem = ("missing: send the ingest key in this header" if not keys else
                               "given more than once: send it once" if len(keys) > 1 else "does not match RECALL_INGEST_KEY")
                    raise HTTPProblem(401, "missing or wrong ingest key", [("x-ingest-key", problem)])
                problems = _query_and_path_problems(request, query)
                if problems:
                    raise HTTPProblem(422, "invalid request", problems)
                status, body = await handler(request)
            except HTTPProblem as p:
                status, body = p.status, {"error": p.error, "fields": [{"field": f, "message": m} for f, m in p.fields]}
            except ClientDisconnect:
                # The gateway went away mid-body (a timeout, a restart): nothing was stored and
                # nobody reads an answer. Counted as nginx does, not logged as a server error.
                status, body = 499, {"error": "client closed the request", "fields": [{"field": "body", "message": "incomplete"}]}
            except (aioredis.RedisError, OSError) as exc:
                # Unreachable, or reachable but refusing the write: full (maxmemory with
                # noeviction, as deployed), a read-only replica, a missing ACL permission.
                # Nothing was stored either way; the gateway retries a 503.
                log.warning("ingest.redis_unavailable", error=type(exc).__name__)
                status, body = 503, {"error": "memory store unavailable, retry later",
                                     "fields": [{"field": "redis", "message": _redis_problem(exc)}]}
            except Exception as exc:
                # A bug, or a failure nothing above expected (a corrupt record in Redis): a JSON
                # 500 that shows nothing of the internals, counted (RecallIngestUnexpectedErrors)
                # and logged where it was raised, never with its message (it may quote the request).
                incident = new_incident()
                log.error("ingest.unexpected_error", route=path, method=request.method, user_hash=_user_hash_of(request),
                          incident=incident, **exception_site(exc))
                status, body = 500, {"error": "internal error", "fields": [
                    {"field": "server", "message": f"unexpected error, logged as incident {incident}"}]}
            INGEST_REQUESTS.labels(path, str(status)).inc()
            INGEST_LATENCY.labels(path).observe(time.perf_counter() - started)
            # After a 408 the rest of the body may still come: the connection ends with the answer.
            return JSONResponse(body, status_code=status, headers={"connection": "close"} if status == 408 else None)

        return Route(path, endpoint, methods=methods)

    def _key_matches(self, given: bytes) -> bool:
        # Both comparisons always run, so the time taken says nothing about which key (if any) matched.
        current = hmac.compare_digest(given, self.key)
        upcoming = hmac.compare_digest(given, self.next_key if self.next_key is not None else self.key)
        return current | (upcoming and self.next_key is not None)

    async def _json(self, request: Request, required: bool = True) -> Any:
        limit = self.s.ingest_max_body_bytes
        try:
            raw = await read_body(request, limit, self.bodies)
        except BodyTooLarge:
            raise HTTPProblem(413, "request body too large", [("body", f"at most {limit} bytes")]) from None
        except BodyStalled as exc:
            raise HTTPProblem(408, "request body timeout", [("body", exc.detail)]) from None
        except BodyBusy as exc:  # load, not a failure: the gateway retries a 503
            raise HTTPProblem(503, "busy, retry later", [("body", exc.detail)]) from None
        except BodyCompressed as exc:
            raise HTTPProblem(415, "unsupported content encoding", [("content-encoding", exc.detail)]) from None
        if not raw and not required:
            return None
        if not _is_json(request.headers.get("content-type", "")):
            raise HTTPProblem(415, "unsupported media type", [("content-type", "must be application/json")])
        try:
            payload, marked = _loads_marking_problems(utf8_text(raw))
        except BodyNotUtf8 as exc:
            raise HTTPProblem(exc.status, "unsupported body encoding" if exc.status == 415 else "malformed JSON",
                              [("body", exc.detail)]) from None
        except ValueError as exc:
            raise HTTPProblem(400, "malformed JSON", [("body", _printable(str(exc)))])
        except RecursionError:
            raise HTTPProblem(400, "malformed JSON", [("body", "nested too deeply")]) from None
        if not isinstance(payload, dict):
            raise HTTPProblem(400, "malformed JSON", [("body", "expected a JSON object")])
        if marked:  # walked for the path only then: a body may hold millions of values
            raise HTTPProblem(422, "invalid request", [_first_marked_problem(payload)])
        request.state.user = payload.get("user")  # hashed by the log line of an unexpected error
        return payload

    # ---- POST /turns ------------------------------------------------------------------------------
    async def post_turns(self, request: Request) -> tuple[int, dict]:
        payload = await self._json(request)
        req, turns, redactions = await self._clean_snapshot(payload)
        event = TurnsEvent(user_hash=user_hash(req.user), conversation_id=req.conversation_id, turns=turns,
                           received_at=time.time())
        await self._refuse_if_unable_to_store()
        await self.redis.xadd(self.s.stream, event.fields())
        # Counted once stored: a refused snapshot is posted again, and would be counted twice.
        INGEST_TURNS.inc(len(turns))
        for kind, n in redactions.items():
            INGEST_REDACTIONS.labels(kind).inc(n)
        redacted = sum(redactions.values())
        log.info("ingest.accepted", user_hash=event.user_hash, conversation_id=req.conversation_id, turns=len(turns),
                 dropped_echoes=len(req.turns) - len(turns), redacted=redacted)
        return 202, Accepted(stored=req.conversation_id, turns=len(turns), redacted=redacted).model_dump()

    async def _storage_state(self) -> StorageState:
        """redis-py retries single commands on a dead pooled connection (after a Redis restart)
        but not pipelines: this read-only one is asked again once, so the first post after a
        restart is not refused."""
        try:
            state = await self._ask_storage_state()
        except aioredis.ConnectionError:
            state = await self._ask_storage_state()
        self.readers.observe(state.backlog, state.readers)
        return state

    async def _ask_storage_state(self) -> StorageState:
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(STORAGE_UNWRITABLE)
        pipe.xlen(self.s.stream)
        pipe.info("memory")
        pipe.xinfo_groups(self.s.stream)
        reason, backlog, memory, groups = await pipe.execute(raise_on_error=False)
        for answer in (reason, backlog):
            if isinstance(answer, Exception):
                raise answer
        if isinstance(memory, Exception):  # INFO not allowed (an older ACL): no memory guard
            if not self._memory_unknown_logged:
                self._memory_unknown_logged = True
                log.warning("ingest.redis_memory_unknown", error=type(memory).__name__,
                            consequence="turns are taken up to maxmemory, where the indexers cannot drain the backlog")
            memory = {}
        # Refused by an older ACL without XINFO, or no stream yet (a FLUSHALL): readers unknown.
        readers = None if isinstance(groups, Exception) else group_readers(groups, self.s.group)
        return StorageState(reason, backlog, int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0)), readers)

    async def _clean_snapshot(self, payload: dict) -> tuple[IngestRequest, list[StreamTurn], Counter]:
        """The request validated, and its turns as they are stored: recall echoes dropped,
        secrets (and PII if configured) redacted; with the redactions made, by kind.

        CPU work in proportion to the body (~2 s for 4 MiB), done in the cleaning thread a step at
        a time (the check, then runs of turns: _cleaning_steps), so the posts in flight take turns
        in it and a small post waits for a step of each large one, not for all of them: behind 8
        connections posting ~3.6 MB, a small post took a median 0.2 s (0.5 s through the default
        pool; 1.5 s with each snapshot cleaned whole in one step), ingest alone on 2 cores."""
        loop = asyncio.get_running_loop()
        req = await loop.run_in_executor(self.cleaner, self._checked_request, payload)
        turns, redactions = [], Counter()
        for step in _cleaning_steps(req.turns):
            for i, clean in await loop.run_in_executor(self.cleaner, self._clean_turns, req.turns, step):
                if clean is None:
                    continue
                redactions.update(clean.kinds)
                t = req.turns[i]
                turns.append(StreamTurn(id=req.turn_id(i), role=t.role, text=clean.text, ts=t.ts))
        return req, turns, redactions

    def _checked_request(self, payload: dict) -> IngestRequest:
        if isinstance(payload.get("turns"), list) and len(payload["turns"]) > self.s.ingest_max_turns:
            raise HTTPProblem(413, "too many turns", [("turns", f"at most {self.s.ingest_max_turns} turns")])
        req: IngestRequest = _validate(IngestRequest, payload)
        for i, t in enumerate(req.turns):
            if len(t.text) > self.s.ingest_max_turn_chars:
                raise HTTPProblem(413, "turn text too long", [(f"turns[{i}].text", f"at most {self.s.ingest_max_turn_chars} characters")])
        return req

    def _clean_turns(self, turns: list[IngestTurn], step: range) -> list[tuple[int, Redacted | None]]:
        """Each turn of `step` with its text redacted; None for a recall echo (dropped)."""
        return [(i, None if self.s.drop_recall_echoes and self._is_recall_echo(turns[i]) else self.redactor.redact(turns[i].text))
                for i in step]

    async def _refuse_if_unable_to_store(self) -> None:
        """503 when an indexer reports the data dir unwritable, the backlog is full or Redis's
        memory nearly so; all asked in one round trip."""
        refusal = self._store_refusal(await self._storage_state())
        if refusal is not None:
            raise refusal

    def _store_refusal(self, state) -> HTTPProblem | None:
        """Why turns are refused now (503), or None: the one rule for the requests and /readyz."""
        if state.unwritable is not None:
            return HTTPProblem(503, "memory store cannot write, retry later",
                               [("data_dir", f"not writable ({state.unwritable.decode(errors='replace')})")])
        # The stream is never trimmed (MAXLEN would drop the oldest entries, processed or not:
        # accepted turns and forget events). Past the cap new turns wait at the gateway instead;
        # forget requests are always taken.
        if state.backlog >= self.s.stream_maxlen:
            return HTTPProblem(503, "memory store backlog full, retry later",
                               [("redis", f"{self.s.stream} holds RECALL_STREAM_MAXLEN={self.s.stream_maxlen} unprocessed "
                                          "entries: the indexers must catch up")])
        # Redis at maxmemory (noeviction) refuses the indexers' locks and schedules too, so they
        # could never drain what filled it: turns stop short of it (forget requests still go).
        if state.maxmemory and state.used_memory >= self.s.ingest_redis_memory_share * state.maxmemory:
            return HTTPProblem(503, "memory store nearly full, retry later",
                               [("redis", f"nearly full: uses {state.used_memory} of maxmemory {state.maxmemory} bytes (past "
                                          f"RECALL_INGEST_REDIS_MEMORY_SHARE={self.s.ingest_redis_memory_share}): "
                                          "the indexers' backlog must drain first")])
        return None

    @staticmethod
    def _is_recall_echo(turn: IngestTurn) -> bool:
        return turn.tool_name == RECALL_TOOL or looks_like_recall_answer(turn.text)

    # ---- forgetting -------------------------------------------------------------------------------
    async def _forget(self, kind: str, user: str, conversation_id: str | None) -> tuple[int, dict]:
        record = await request_forget(self.redis, self.s.stream, kind=kind, user_hash=user_hash(user),
                                      conversation_id=conversation_id,
                                      receipt_ttl_s=self.s.deletion_receipt_ttl_days * 86400)
        log.info("ingest.forget_requested", kind=kind, user_hash=user_hash(user), conversation_id=conversation_id,
                 receipt=record.receipt)
        return 202, record.model_dump()

    async def _user_from_query_or_body(self, request: Request) -> str:
        """The user of a forget given as `?user=` or a body `{"user": …}`: path segments cannot carry
        every user id (one ending in "/retention" names the retention route)."""
        named = request.query_params.getlist("user")
        if len(named) > 1:  # a forget must name one user: the last value would be taken silently
            raise HTTPProblem(422, "invalid request", [("user", f"given {len(named)} times in the query; give it once")])
        in_query = named[0] if named else None
        body = await self._json(request, required=False)
        in_body = _validate(ForgetUser, body).user if body is not None else None
        if in_query is not None and in_body is not None and in_query != in_body:
            raise HTTPProblem(422, "invalid request", [("user", "given in the query and the body with different values")])
        user = in_query if in_query is not None else in_body
        if user is None:
            raise HTTPProblem(422, "invalid request", [("user", "required, in the query string or the body")])
        return _validate(ForgetUser, {"user": user}).user

    async def delete_conversation(self, request: Request) -> tuple[int, dict]:
        cid = request.path_params["conversation_id"]
        if not CONVERSATION_ID.fullmatch(cid):
            raise HTTPProblem(422, "invalid request", [("conversation_id", "must match [A-Za-z0-9_-]{1,128}")])
        return await self._forget("forget_conversation", await self._user_from_query_or_body(request), cid)

    async def delete_user(self, request: Request) -> tuple[int, dict]:
        forget: ForgetUser = _validate(ForgetUser, {"user": request.path_params["user"]})
        return await self._forget("forget_user", forget.user, None)

    async def delete_user_named_elsewhere(self, request: Request) -> tuple[int, dict]:
        return await self._forget("forget_user", await self._user_from_query_or_body(request), None)

    async def get_deletion(self, request: Request) -> tuple[int, dict]:
        receipt = request.path_params["receipt"]
        raw = await self.redis.hget(deletion_key(receipt), "record") if RECEIPT.fullmatch(receipt) else None
        if raw is None:
            raise HTTPProblem(404, "unknown receipt", [("receipt", "no deletion with this id (receipts expire)")])
        return 200, DeletionReceipt.model_validate_json(raw).model_dump()

    async def put_retention(self, request: Request) -> tuple[int, dict]:
        forget: ForgetUser = _validate(ForgetUser, {"user": request.path_params["user"]})
        override: RetentionOverride = _validate(RetentionOverride, await self._json(request))
        uhash = user_hash(forget.user)
        if override.days is None:
            await self.redis.hdel(RETENTION_OVERRIDES, uhash)
        else:
            await self.redis.hset(RETENTION_OVERRIDES, uhash, override.days)
        return 200, {"days": override.days}

    async def delete_retention(self, request: Request) -> tuple[int, dict]:
        """Clear the override, as PUT with null does. Without this route a DELETE here was read
        as forgetting a user named "<user>/retention": 202 and a receipt, override untouched."""
        forget: ForgetUser = _validate(ForgetUser, {"user": request.path_params["user"]})
        await self.redis.hdel(RETENTION_OVERRIDES, user_hash(forget.user))
        return 200, {"days": None}

    # ---- probes ---------------------------------------------------------------------------------------
    async def readyz(self, request: Request) -> Response:
        """Ready while the process serves: a shared dependency's failure is said here, and each
        request gets its own 503 naming it. Were readiness to follow Redis or the data dir (both
        shared by every replica), all replicas would leave the Service at once and callers would
        get connection errors, not the 503 they can retry on."""
        try:
            state = await asyncio.wait_for(self._storage_state(), READY_CHECK_S)
        except Exception:
            return JSONResponse({"status": "ready; turns and forgets refused (503): redis unreachable"})
        refusal = self._store_refusal(state)  # forgets are still accepted
        if refusal is not None:
            field, detail = refusal.fields[0]
            return JSONResponse({"status": f"ready; turns refused (503): {field.replace('_', ' ')} {detail}"})
        unread = self.readers.problem(state.backlog, state.readers)
        if unread is not None:  # turns are still taken: they wait for an indexer on this stream
            return JSONResponse({"status": f"ready; {unread}"})
        return JSONResponse({"status": "ready"})


def _cleaning_steps(turns: list[IngestTurn]) -> Iterator[range]:
    """The turns in runs of about CLEANING_STEP_CHARS of text (a turn longer than that is a step
    of its own): a step per turn would cost a post of 2,000 short turns 2,000 hand-offs."""
    start, chars = 0, 0
    for i, t in enumerate(turns):
        chars += len(t.text)
        if chars >= CLEANING_STEP_CHARS:
            yield range(start, i + 1)
            start, chars = i + 1, 0
    if start < len(turns):
        yield range(start, len(turns))


def create_app(settings: IngestSettings) -> Starlette:
    api = IngestAPI(settings)

    @asynccontextmanager
    async def lifespan(app: Starlette):
        import redis

        sync = redis.Redis.from_url(settings.redis, socket_connect_timeout=2, socket_timeout=2)
        try:
            ensure_group(sync, settings.stream, settings.group)
        except (redis.ConnectionError, redis.TimeoutError):  # refused, or accepted and never answered
            log.warning("ingest.group_not_created", reason="redis unreachable at start; indexers create it too")
        finally:
            sync.close()
        yield
        api.cleaner.shutdown(wait=False)
        await api.redis.aclose()

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document())

    return Starlette(
        exception_handlers={404: _no_such_endpoint, 405: _no_such_endpoint},
        routes=[
            api.route("/turns", api.post_turns, ["POST"]),
            api.route("/conversations/{conversation_id}", api.delete_conversation, ["DELETE"], frozenset({"user"})),
            api.route("/users", api.delete_user_named_elsewhere, ["DELETE"], frozenset({"user"})),
            api.route("/users/{user:anytext}/retention", api.put_retention, ["PUT"]),
            api.route("/users/{user:anytext}/retention", api.delete_retention, ["DELETE"]),
            api.route("/users/{user:anytext}", api.delete_user, ["DELETE"]),
            api.route("/deletions/{receipt}", api.get_deletion, ["GET"]),
            Route("/healthz", healthz), Route("/readyz", api.readyz),
            Route("/metrics", metrics_endpoint), Route("/openapi.json", openapi),
        ],
        lifespan=lifespan,
    )


async def _no_such_endpoint(request: Request, exc: HTTPException) -> Response:
    field, message = unknown_route(request, exc, "see /openapi.json")
    error = "not found" if field == "path" else "method not allowed"
    return JSONResponse({"error": error, "fields": [{"field": field, "message": message}]}, status_code=exc.status_code,
                        headers=exc.headers)
