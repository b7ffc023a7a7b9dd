"""Settings every service shares. Each service has one pydantic-settings class deriving from
this one; all read `RECALL_*` environment variables (and an optional `.env`)."""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.secret_policy import check_secret


class CommonSettings(BaseSettings):
    # `inf` or `nan` for a timeout or an interval is a typo, never a setting (it would never expire).
    # hide_input_in_errors: a refused secret must not reach the logs.
    model_config = SettingsConfigDict(env_prefix="RECALL_", env_file=".env", extra="ignore", allow_inf_nan=False,
                                      hide_input_in_errors=True)

    data_dir: Path = Field(Path("data"), description="Root of every tenant's files (shared volume in production).")
    redis_url: str | None = Field(None, description="Redis URL; unset under `recall up` starts an embedded redis-server.")
    stream: str = Field("recall:turns", min_length=1, description="The Redis stream carrying ingest events.")
    group: str = Field("indexers", min_length=1, description="Consumer group of the indexer workers.")
    log_level: str = Field("INFO", description="Log level of the JSON logs.")
    debug: bool = Field(False, description="Debug logging (the only mode in which query text may be logged).")
    engine: str = Field("embedded", pattern="^(embedded|funes)$", description="embedded: the project's engine in-process; funes: drive a funes-compatible binary.")
    funes_bin: str = Field("funes", description="The funes-compatible binary used when engine=funes.")
    stop_grace_s: float = Field(25.0, gt=0, description="After SIGTERM, how long ingest and the recall service let the requests "
                                "in flight finish before cancelling them (keep it under the orchestrator's grace: Kubernetes "
                                "gives 30 s); `recall up` kills a part still running 5 s past it.")
    request_read_timeout_s: float = Field(30.0, gt=0, description="How long ingest and the recall service wait for a request "
                                          "to arrive whole (headers and body, from its first byte or the connection's opening) "
                                          "before closing the connection: idle or stalled connections cannot pile up.")
    max_header_bytes: int = Field(64 * 1024, ge=8 * 1024, description="The most bytes a request line and its headers may "
                                  "take in ingest, the recall service and the indexer (a bearer token included): past it, 431 and the "
                                  "connection closed. The parser holds them until their end, so without a bound a few "
                                  "connections without a key could fill the process's memory.")
    http_keep_alive_s: float = Field(75.0, gt=0, description="How long ingest, the recall service and the indexer keep an "
                                     "idle connection open between requests. Keep it above the idle timeout of every client "
                                     "and proxy that reuses connections to them (httpx 5 s, aiohttp 15 s, AWS ALB 60 s; "
                                     "Go's http.Transport 90 s and Google's load balancers 600 s need more): a request sent "
                                     "as the service closes the connection fails at the caller (ReadError, 502).")
    body_buffer_bytes: int = Field(64 * 2**20, ge=2**20, description="Bytes that the request bodies still arriving may hold "
                                   "together in ingest or a recall replica (each until it is whole, refused, or "
                                   "RECALL_REQUEST_READ_TIMEOUT_S): a body whose next chunk would pass it is refused at "
                                   "once, 503 'busy'. At least the largest body the service reads; the default leaves "
                                   "room within the Kubernetes memory limits (ingest 512 MiB, recall 3 GiB).")

    user_hash_key: SecretStr = Field(SecretStr(""), description="Key of the user hash that names tenants' directories, "
                                     "Redis keys and log lines: HMAC-SHA256(key, user)[:24], useless without the key (at least 32 "
                                     "random characters; the same for every service). `recall up` generates one for a new data dir; "
                                     "unset = sha256(user)[:24], kept by a deployment that started without one (its tenants "
                                     "cannot be re-hashed: a key added to it is refused).")

    @field_validator("user_hash_key")
    @classmethod
    def _no_weak_user_hash_key(cls, v: SecretStr) -> SecretStr:
        if v.get_secret_value():
            check_secret("RECALL_USER_HASH_KEY", v.get_secret_value(), min_length=32)
        return v

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, v: str) -> str:
        # Each service configures logging only once it runs: an unknown level must stop
        # `recall up` at its settings check, not kill the children it already started.
        if not isinstance(logging.getLevelName(v.upper()), int):
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return v

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, v: str | None) -> str | None:
        # redis-py refuses any other at the first command: a traceback after the service started.
        if not v:
            return None  # set but empty, as a compose file's ${RECALL_REDIS_URL:-} passes it: unset
        if not v.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix:// (e.g. redis://redis:6379/0)")
        return v

    @property
    def redis(self) -> str:
        if not self.redis_url:
            raise RuntimeError("RECALL_REDIS_URL is not set (only `recall up` starts an embedded Redis)")
        return self.redis_url
