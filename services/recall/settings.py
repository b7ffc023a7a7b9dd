from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from services.recall.artifacts.text_limits import max_body_bytes
from services.recall.time_zones import time_zone
from shared.engine.native_threads import usable_cores
from shared.secret_policy import check_secret
from shared.settings_base import CommonSettings

LOOPBACK = {"127.0.0.1", "::1", "localhost"}


class RecallSettings(CommonSettings):
    model_config = SettingsConfigDict(hide_input_in_errors=True)  # a refused secret must not reach the logs

    recall_port: int = Field(8000, description="Port of the MCP service (streamable HTTP at /mcp).")
    recall_host: str = Field("127.0.0.1", description="Bind address of the MCP service.")
    jwt_secret: SecretStr = Field(SecretStr(""), description="HS256 shared secret (single-machine setups).")
    jwks_url: str | None = Field(None, description="JWKS URL for RS256 tokens (production); wins over jwt_secret.")
    jwt_issuer: str | None = Field(None, description="Required `iss` when set.")
    jwt_audience: str | None = Field(None, description="Required `aud` when set.")
    max_token_lifetime_s: int = Field(7 * 24 * 3600, ge=60, description="Tokens must carry `exp`, at most this far ahead (and after `iat`).")
    k: int = Field(3, ge=1, le=20, description="Passages returned per call.")
    candidates: int = Field(8, ge=1, le=200, description="Size of each search leg and of the fused pool.")
    max_result_chars: int = Field(4000, ge=200, description="Cap on what one call puts in the agent's context.")
    max_query_chars: int = Field(500, ge=10, description="Queries are cut to this length.")
    max_concurrency: int = Field(default_factory=usable_cores, ge=1, description="Searches running at once per replica (default: the cores it may use, from its CPU affinity and cgroup quota; more searches than cores slow each other: docs/benchmarks.md, round 14).")
    queue_max: int = Field(32, ge=0, description="Recalls that may wait for a free slot; past it the agent is told 'busy, try again'.")
    queue_wait_s: float = Field(1.0, gt=0, description="Longest wait for a free slot before the answer is 'busy, try again'.")
    timeout_s: float = Field(10.0, gt=0, description="A search slower than this stops at its next stage and answers 'busy, try again' (a funes child past it is killed: 'unavailable').")
    reader_cache: int = Field(256, ge=1, description="Embedded engine: tenant memories kept open (LRU); kept within the open-file limit (4 descriptors each).")
    reader_cache_bytes: int = Field(4 * 2**30, ge=2**20, description="Embedded engine: bytes of vectors and BM25 indexes the open memories may hold (LRU; a memory in use is closed when its search ends).")
    pool_max_processes: int = Field(16, ge=1, description="Funes engine: most `funes mcp` children alive at once.")
    pool_idle_s: float = Field(600.0, gt=0, description="A tenant's funes child, or its open memory (embedded engine), idle this long is closed.")
    artifacts_db_url: str | None = Field(None, description="Memory artifacts database: sqlite:///<file> (default DATA_DIR/artifacts.sqlite3) or postgresql://… for several replicas.")
    pool_start_timeout_s: float = Field(60.0, gt=0, description="Funes engine: time a child may take to start.")
    realm_max_text_bytes: int = Field(64 * 1024, ge=1024, le=512 * 1024, description="Largest text one field of a realm stores, in bytes of UTF-8: an artifact body (constitution, registry and charters included), a journal entry, an AgentMemory record's content, a source_context's JSON (more is refused naming the field; search reads a body's first 20,000 characters, at most 60,000 bytes; an MCP request is read up to 6 times this plus 64 KiB, at least 1 MiB).")
    replicas: int = Field(1, ge=1, description="How many recall replicas may run at once (the HPA's maxReplicas); above 1 the artifacts database must be PostgreSQL.")
    default_time_zone: str = Field("UTC", description="IANA time zone (e.g. Europe/Berlin) in which time words ('yesterday', 'in October') are read for tokens without a `zoneinfo` claim.")

    @field_validator("jwt_secret")
    @classmethod
    def _no_weak_jwt_secret(cls, v: SecretStr) -> SecretStr:
        if v.get_secret_value():
            check_secret("RECALL_JWT_SECRET", v.get_secret_value(), min_length=32)
        return v

    @field_validator("default_time_zone")
    @classmethod
    def _known_time_zone(cls, v: str) -> str:
        if time_zone(v) is None:
            raise ValueError("must be an IANA time zone name, e.g. UTC, Europe/Berlin or America/New_York")
        return v

    @field_validator("artifacts_db_url")
    @classmethod
    def _known_database(cls, v: str | None) -> str | None:
        # Checked here, not first when the artifact store opens: `recall up` must refuse it
        # before anything starts (the service would otherwise die after its siblings started).
        if v and not v.startswith(("sqlite:///", "postgresql://", "postgres://")):
            raise ValueError("must be sqlite:///<path> or postgresql://…")
        return v

    @field_validator("jwks_url")
    @classmethod
    def _https_url(cls, v: str | None) -> str | None:
        # Keys fetched over plain HTTP could be swapped on the way; only this host's own IdP may use it.
        url = urlsplit(v) if v else None
        if url and not (url.hostname and (url.scheme == "https" or url.scheme == "http" and url.hostname in LOOPBACK)):
            raise ValueError("must be an https:// URL of the issuer's JSON Web Key Set (http:// only on this host)")
        return v

    @model_validator(mode="after")
    def _jwks_names_issuer_and_audience(self) -> "RecallSettings":
        # An identity provider signs tokens for many services: without both checks a token it
        # issued for any of them would be taken here.
        if self.jwks_url and not (self.jwt_issuer and self.jwt_audience):
            raise ValueError("RECALL_JWKS_URL needs RECALL_JWT_ISSUER and RECALL_JWT_AUDIENCE (the `iss` and `aud` "
                             "your identity provider puts in tokens for this service)")
        return self

    @model_validator(mode="after")
    def _no_shared_sqlite(self) -> "RecallSettings":
        if self.replicas > 1 and not (self.artifacts_db_url or "").startswith(("postgresql://", "postgres://")):
            raise ValueError(f"RECALL_REPLICAS={self.replicas} needs RECALL_ARTIFACTS_DB_URL=postgresql://… "
                             "(a SQLite artifacts database is one host's file)")
        return self

    @model_validator(mode="after")
    def _budget_holds_a_whole_body(self) -> "RecallSettings":
        # Below the largest body /mcp reads, a realm write at the text limit could never be sent.
        largest = max_body_bytes(self.realm_max_text_bytes)
        if self.body_buffer_bytes < largest:
            raise ValueError(f"RECALL_BODY_BUFFER_BYTES ({self.body_buffer_bytes}) must be at least the largest "
                             f"request /mcp reads ({largest}, from RECALL_REALM_MAX_TEXT_BYTES)")
        return self
