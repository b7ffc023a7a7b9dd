"""The ingest API's OpenAPI 3.1 document, generated from the same pydantic models it validates with."""

from __future__ import annotations

from functools import lru_cache

from pydantic.json_schema import models_json_schema

from services.ingest.api_models import Accepted, ErrorBody, ForgetUser, IngestRequest, RetentionOverride
from shared.stream_schema import DeletionReceipt
from shared.tenant_paths import CONVERSATION_ID

USER_PARAM = {"type": "string", "minLength": 1, "maxLength": 256}


@lru_cache(maxsize=1)
def openapi_document() -> dict:
    _, defs = models_json_schema([(m, "validation") for m in (IngestRequest, Accepted, ErrorBody, ForgetUser, DeletionReceipt, RetentionOverride)],
                                 ref_template="#/components/schemas/{model}")
    schemas = defs["$defs"]
    ref = lambda name: {"$ref": f"#/components/schemas/{name}"}  # noqa: E731
    err = lambda text: {"description": text, "content": {"application/json": {"schema": ref("ErrorBody")}}}  # noqa: E731

    def forget_naming_the_user(summary: str, path_params: list[dict], unprocessable: str) -> dict:
        """A forget whose user comes as `?user=` or a body `{"user": …}` (never in the path)."""
        return {
            "summary": summary,
            "security": [{"ingestKey": []}],
            "parameters": [*path_params, {"name": "user", "in": "query", "required": False, "schema": USER_PARAM}],
            "requestBody": {"required": False, "content": {"application/json": {"schema": ref("ForgetUser")}}},
            "responses": {"202": {"description": "Receipt; poll GET /deletions/{receipt}",
                                  "content": {"application/json": {"schema": ref("DeletionReceipt")}}},
                          "400": err("Malformed JSON body"), "401": err("Missing or wrong ingest key"),
                          "413": err("Body too large"), "415": err("A body that is not application/json, not UTF-8 (UTF-16, UTF-32, a byte order mark), or sent compressed (a Content-Encoding)"),
                          "422": err(unprocessable),
                          "503": err("Redis unreachable, or busy (the bodies arriving hold RECALL_BODY_BUFFER_BYTES); retry")},
        }

    return {
        "openapi": "3.1.0",
        "info": {"title": "recall ingest API", "version": "1",
                 "description": "The gateway posts each conversation, whole, after every completed turn."},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"ingestKey": {"type": "apiKey", "in": "header", "name": "x-ingest-key"}},
        },
        "paths": {
            "/turns": {"post": {
                "summary": "Store a conversation snapshot (idempotent; the newest accepted snapshot wins)",
                "security": [{"ingestKey": []}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref("IngestRequest")}}},
                "responses": {
                    "202": {"description": "On the stream; searchable seconds later",
                            "content": {"application/json": {"schema": ref("Accepted")}}},
                    "400": err("Malformed JSON (or nested too deeply)"), "401": err("Missing or wrong ingest key"),
                    "413": err("Over a configured limit (body size, turn count, turn text)"),
                    "415": err("The body is not application/json, not UTF-8 (UTF-16, UTF-32, a byte order mark), or sent compressed (a Content-Encoding)"),
                    "422": err("A field is invalid; `fields` names it"),
                    "503": err("Redis unreachable, the data dir not writable, or busy (the bodies arriving hold "
                               "RECALL_BODY_BUFFER_BYTES); retry"),
                },
            }},
            "/conversations/{conversation_id}": {"delete": forget_naming_the_user(
                "Forget one conversation of a user (user in the query string or the body)",
                [{"name": "conversation_id", "in": "path", "required": True,
                  "schema": {"type": "string", "pattern": f"^{CONVERSATION_ID.pattern}$"}}],
                "No user, an empty user, a user named twice in the query, query and body disagreeing, or an unsafe id")},
            "/users": {"delete": forget_naming_the_user(
                "Forget everything of a user named in the query string or the body (any user id, "
                "including one ending in /retention)", [],
                "No user, an empty user, a user named twice in the query, or query and body disagreeing")},
            "/users/{user}": {"delete": {
                "summary": "Forget everything of a user",
                "security": [{"ingestKey": []}],
                "parameters": [{"name": "user", "in": "path", "required": True, "schema": USER_PARAM}],
                "responses": {"202": {"description": "Receipt", "content": {"application/json": {"schema": ref("DeletionReceipt")}}},
                              "401": err("Missing or wrong ingest key"), "422": err("Invalid user"),
                              "503": err("Redis unreachable; retry")},
            }},
            "/users/{user}/retention": {"put": {
                "summary": "Set (or clear with null) a user's retention override in days",
                "security": [{"ingestKey": []}],
                "parameters": [{"name": "user", "in": "path", "required": True, "schema": USER_PARAM}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref("RetentionOverride")}}},
                "responses": {"200": {"description": "Stored", "content": {"application/json": {"schema": ref("RetentionOverride")}}},
                              "400": err("Malformed JSON"), "401": err("Missing or wrong ingest key"),
                              "413": err("Body too large"), "415": err("The body is not application/json, not UTF-8 (UTF-16, UTF-32, a byte order mark), or sent compressed (a Content-Encoding)"),
                              "422": err("Invalid days (1-36500 or null) or user"),
                              "503": err("Redis unreachable, or busy (the bodies arriving hold RECALL_BODY_BUFFER_BYTES); retry")},
            }, "delete": {
                "summary": "Clear a user's retention override (the service default applies again)",
                "security": [{"ingestKey": []}],
                "parameters": [{"name": "user", "in": "path", "required": True, "schema": USER_PARAM}],
                "responses": {"200": {"description": "Cleared", "content": {"application/json": {"schema": ref("RetentionOverride")}}},
                              "401": err("Missing or wrong ingest key"), "422": err("Invalid user"),
                              "503": err("Redis unreachable; retry")},
            }},
            "/deletions/{receipt}": {"get": {
                "summary": "Status of a deletion: pending or done, with what was removed",
                "security": [{"ingestKey": []}],
                "parameters": [{"name": "receipt", "in": "path", "required": True, "schema": {"type": "string"}}],
                "responses": {"200": {"description": "The receipt", "content": {"application/json": {"schema": ref("DeletionReceipt")}}},
                              "401": err("Missing or wrong ingest key"), "404": err("Unknown or expired receipt"),
                              "503": err("Redis unreachable; retry")},
            }},
            "/healthz": {"get": {"summary": "Process is up", "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Redis reachable and the data dir writable", "responses": {"200": {"description": "ready"},
                                                                            "503": {"description": "not ready"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text exposition"}}}},
        },
    }
