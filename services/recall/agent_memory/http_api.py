"""The people's HTTP API for AgentMemory, on the recall service, with the same bearer tokens as
MCP (verified by the same verifier; the realm role comes from the token's `realms` claim).

    POST   /realms/{realm_id}/memory                      create (owners, members)      201
    GET    /realms/{realm_id}/memory?memory_type=&reality=&tag=&target_kind=&target_id=&q=&valid_now=&limit=&offset=
    GET    /realms/{realm_id}/memory/{record_id}          read (any realm role)
    PATCH  /realms/{realm_id}/memory/{record_id}          change fields (owners, members)
    DELETE /realms/{realm_id}/memory/{record_id}?reason=  retire (its author, owners; or {"reason": …} as the JSON body)
    GET    /realms/{realm_id}/memory/{record_id}/audit?limit=&offset=    every change, a page at a time

Errors are JSON `{"error": <rule or field>, "detail": …}`: 401 without a valid token, 403 for a
realm or role refusal, 404 for an unknown record, 413 for a body over 1 MiB or a field over RECALL_REALM_MAX_TEXT_BYTES (naming it), 422 for invalid
input (naming the field; a body nested too deeply to parse is `body`; text holding a NUL
character, which PostgreSQL cannot store, is refused on either database), 503 `database` while the
artifacts database cannot be reached, 503 `busy` when the request bodies still arriving hold the
process's RECALL_BODY_BUFFER_BYTES (`shared/body_budget.py`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from fastmcp import FastMCP
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from services.recall.agent_memory.models import MemoryType, Reality, RecordFields, RecordInput, RetireInput
from services.recall.agent_memory.service import AgentMemoryService
from services.recall.artifacts.artifact_store import Conflict, StoreUnavailable
from services.recall.artifacts.models import REALM_ID, TargetKind
from services.recall.artifacts.nul_text import NulText, refuse_nul
from services.recall.artifacts.realm_threads import in_realm_thread
from services.recall.artifacts.rules import RuleBroken
from services.recall.artifacts.service import AUDIT_PAGE, MAX_TRAIL_OFFSET, Caller
from services.recall.artifacts.text_limits import TextTooLarge, max_body_bytes
from services.recall.artifacts.tool_access import CONCURRENT_CHANGE
from services.recall.artifacts.tools import next_offset
from services.recall.metrics import REALM_CALLS
from shared.body_budget import BodyBudget
from shared.http_body import BodyBusy, BodyCompressed, BodyNotUtf8, BodyStalled, BodyTooLarge, huge_integer, read_body, utf8_text
from shared.raw_url import NOT_UTF8, not_utf8_parameters

STATUS = {"realm_membership": 403, "realm_role": 403, "record_author": 403, "people_write": 403, "not_found": 404,
          "body_timeout": 408, "body_size": 413, "body_encoding": 415, "busy": 503}
Handler = Callable[[Request, Caller, str], Awaitable[Any]]


def _error(status: int, error: str, detail: str) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status)


class _HugeInteger(ValueError):
    pass


def _convertible_int(digits: str) -> int:
    # Python converts no integer of more digits than this; its own error names a setting of ours
    # to change (sys.set_int_max_str_digits) rather than what is wrong with the request.
    if len(digits.lstrip("-")) > sys.get_int_max_str_digits():
        raise _HugeInteger(f"the request body holds {huge_integer(len(digits.lstrip('-')))}")
    return int(digits)


async def _json(request: Request, model: type[BaseModel], limit: int, bodies: BodyBudget) -> Any:
    try:
        body = await read_body(request, limit, bodies)  # read no further than a record can be
    except BodyTooLarge:
        raise RuleBroken("body_size", f"the request body is over {limit} bytes") from None
    except BodyStalled as exc:
        raise RuleBroken("body_timeout", exc.detail) from None
    except BodyBusy as exc:
        raise RuleBroken("busy", exc.detail) from None
    except BodyCompressed as exc:
        raise RuleBroken("body_encoding", exc.detail) from None
    try:
        raw = json.loads(utf8_text(body), parse_int=_convertible_int)
    except BodyNotUtf8 as exc:
        raise RuleBroken("body_encoding" if exc.status == 415 else "body", f"the request body {exc.detail}") from None
    except _HugeInteger as exc:
        raise RuleBroken("body", str(exc)) from None
    except ValueError:  # malformed JSON
        raise RuleBroken("body", "the request body must be a JSON object") from None
    except RecursionError:
        raise RuleBroken("body", "the request body is nested too deeply") from None
    refuse_nul(raw)
    return model.model_validate(raw)


async def _retire_reason(request: Request, limit: int, bodies: BodyBudget) -> str | None:
    """The reason of a retirement, from `?reason=` or a JSON body {"reason": …}: one sent in the
    body was dropped without a word (the audit said null). Both at once is refused naming it."""
    in_query = request.query_params.get("reason")
    if not await _has_body(request):
        return in_query
    in_body = (await _json(request, RetireInput, limit, bodies)).reason
    if in_query is not None and in_body is not None:
        raise RuleBroken("reason", "give the reason once: in ?reason= or in the JSON body, not both")
    return in_body if in_body is not None else in_query


async def _has_body(request: Request) -> bool:
    if request.headers.get("content-length", "0").strip() not in ("", "0"):
        return True
    return "chunked" in request.headers.get("transfer-encoding", "").lower()


def register_agent_memory_routes(mcp: FastMCP, service: AgentMemoryService, bodies: BodyBudget) -> None:
    verifier = mcp.auth
    body_limit = max_body_bytes(service.artifacts.max_text_bytes)

    def route(path: str, method: str, status: int = 200) -> Callable[[Handler], None]:
        def wrap(handler: Handler) -> None:
            async def endpoint(request: Request) -> Response:
                header = request.headers.get("authorization", "")
                token = await verifier.verify_token(header[7:].strip()) if header.lower().startswith("bearer ") else None
                if token is None or not token.claims.get("sub"):
                    return _error(401, "authentication", "a valid bearer token is required")
                realm_id = request.path_params["realm_id"]
                if not REALM_ID.fullmatch(realm_id):
                    return _error(422, "realm_id", "not a realm id")
                not_utf8 = not_utf8_parameters(request.scope, request.path_params)
                if not_utf8:  # Starlette would hand over U+FFFD in place of each such byte
                    REALM_CALLS.labels("http", "refused").inc()
                    return _error(422, not_utf8[0], f"{not_utf8[0]}: {NOT_UTF8}")
                try:
                    refuse_nul({**request.query_params, **request.path_params})
                    result = await handler(request, Caller.from_claims(token.claims), realm_id)
                except TextTooLarge as exc:
                    REALM_CALLS.labels("http", "refused").inc()
                    return _error(413, exc.rule, str(exc))
                except RuleBroken as exc:
                    REALM_CALLS.labels("http", "refused").inc()
                    return _error(STATUS.get(exc.rule, 422), exc.rule, str(exc))
                except ValidationError as exc:
                    REALM_CALLS.labels("http", "refused").inc()
                    first = exc.errors(include_url=False)[0]
                    field = ".".join(str(p) for p in first["loc"]) or "body"
                    return _error(422, field, f"{field}: {first['msg']}")
                except NulText as exc:
                    REALM_CALLS.labels("http", "refused").inc()
                    return _error(422, exc.field, str(exc))
                except StoreUnavailable:
                    REALM_CALLS.labels("http", "database_unavailable").inc()
                    return _error(503, "database", "the artifacts database is unavailable; retry later")
                except Conflict:
                    REALM_CALLS.labels("http", "refused").inc()  # a lost race: the caller retries
                    return _error(409, "concurrency", CONCURRENT_CHANGE)
                REALM_CALLS.labels("http", "ok").inc()
                return JSONResponse(result, status_code=status)

            mcp.custom_route(path, methods=[method], name=f"{handler.__name__}")(endpoint)
        return wrap

    base = "/realms/{realm_id}/memory"

    @route(base, "POST", 201)
    async def create_memory(request: Request, caller: Caller, realm_id: str) -> Any:
        data = await _json(request, RecordInput, body_limit, bodies)
        return await in_realm_thread(service.create, caller, realm_id, data)

    @route(base, "GET")
    async def search_memory(request: Request, caller: Caller, realm_id: str) -> Any:
        q = SearchQuery.model_validate(dict(request.query_params))
        found = await in_realm_thread(lambda: service.search(
            caller, realm_id, memory_type=q.memory_type, reality=q.reality, tag=q.tag,
            target_kind=q.target_kind.value if q.target_kind else None, target_id=q.target_id, query=q.q, valid_now=q.valid_now, limit=q.limit, offset=q.offset))
        return {"records": found, "next_offset": next_offset(found, q.limit, q.offset)}

    @route(base + "/{record_id}", "GET")
    async def read_memory(request: Request, caller: Caller, realm_id: str) -> Any:
        return await in_realm_thread(service.get, caller, realm_id, request.path_params["record_id"])

    @route(base + "/{record_id}", "PATCH")
    async def change_memory(request: Request, caller: Caller, realm_id: str) -> Any:
        patch = await _json(request, RecordFields, body_limit, bodies)
        return await in_realm_thread(service.update, caller, realm_id, request.path_params["record_id"], patch)

    @route(base + "/{record_id}", "DELETE")
    async def retire_memory(request: Request, caller: Caller, realm_id: str) -> Any:
        return await in_realm_thread(service.retire, caller, realm_id, request.path_params["record_id"],
                                     await _retire_reason(request, body_limit, bodies))

    @route(base + "/{record_id}/audit", "GET")
    async def memory_audit(request: Request, caller: Caller, realm_id: str) -> Any:
        q = PageQuery.model_validate(dict(request.query_params))
        events = await in_realm_thread(service.audit, caller, realm_id, request.path_params["record_id"], q.limit, q.offset)
        return {"events": events, "next_offset": next_offset(events, q.limit, q.offset, MAX_TRAIL_OFFSET)}


class PageQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    limit: int = AUDIT_PAGE
    offset: int = 0


class SearchQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")
    memory_type: MemoryType | None = None
    reality: Reality | None = None
    # As the MCP tool's: a query word is matched against every record (LIKE), whatever its length.
    tag: str | None = Field(None, max_length=40)
    target_kind: TargetKind | None = None
    target_id: str | None = Field(None, max_length=200)
    q: str | None = Field(None, max_length=500)
    valid_now: bool = True
    limit: int = 10
    offset: int = 0
