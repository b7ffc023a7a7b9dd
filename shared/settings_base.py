"""Settings every service shares. Each service has one pydantic-settings class deriving from
this one; all read `RECALL_*` environment variables (and an optional `.env`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RECALL_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path("data"), description="Root of every tenant's files (shared volume in production).")
    redis_url: str | None = Field(None, description="Redis URL; unset under `recall up` starts an embedded redis-server.")
    stream: str = Field("recall:turns", description="The Redis stream carrying ingest events.")
    group: str = Field("indexers", description="Consumer group of the indexer workers.")
    log_level: str = Field("INFO", description="Log level of the JSON logs.")
    debug: bool = Field(False, description="Debug logging (the only mode in which query text may be logged).")
    engine: str = Field("embedded", pattern="^(embedded|funes)$", description="embedded: the project's engine in-process; funes: drive a funes-compatible binary.")
    funes_bin: str = Field("funes", description="The funes-compatible binary used when engine=funes.")

    @property
    def redis(self) -> str:
        if not self.redis_url:
            raise RuntimeError("RECALL_REDIS_URL is not set (only `recall up` starts an embedded Redis)")
        return self.redis_url
