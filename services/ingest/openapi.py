"""The ingest API's OpenAPI 3.1 document, generated from the same pydantic models it validates with."""

from __future__ import annotations

from functools import lru_cache

from pydantic.json_schema import models_json_schema

from services.ingest.api_models import Accepted, ErrorBody, IngestRequest


@lru_cache(maxsize=1)
def openapi_document() -> dict:
    _, defs = models_json_schema([(m, "validation") for m in (IngestRequest, Accepted, ErrorBody)],
                                 ref_template="#/components/schemas/{model}")
    schemas = defs["$defs"]
    ref = lambda name: {"$ref": f"#/components/schemas/{name}"}  # noqa: E731
    err = lambda text: {"description": text, "content": {"application/json": {"schema": ref("ErrorBody")}}}  # noqa: E731
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
                    "400": err("Malformed JSON"), "401": err("Missing or wrong ingest key"),
                    "413": err("Over a configured limit (body size, turn count, turn text)"),
                    "422": err("A field is invalid; `fields` names it"),
                    "503": err("Redis unreachable; retry"),
                },
            }},
            "/healthz": {"get": {"summary": "Process is up", "responses": {"200": {"description": "ok"}}}},
            "/readyz": {"get": {"summary": "Redis reachable", "responses": {"200": {"description": "ready"},
                                                                            "503": {"description": "not ready"}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text exposition"}}}},
        },
    }
