from __future__ import annotations

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from shared.secret_policy import check_secret
from shared.settings_base import CommonSettings


class IngestSettings(CommonSettings):
    model_config = SettingsConfigDict(hide_input_in_errors=True)  # a refused secret must not reach the logs

    ingest_port: int = Field(8001, description="Port of the ingest API.")
    ingest_host: str = Field("127.0.0.1", description="Bind address of the ingest API.")
    ingest_key: SecretStr = Field(SecretStr(""), description="Shared key the gateway sends as x-ingest-key.")
    ingest_key_next: SecretStr = Field(SecretStr(""), description="During a key rotation: a second key accepted as well (unset otherwise).")
    ingest_max_body_bytes: int = Field(4 * 2**20, ge=1024, description="Largest accepted request body.")
    ingest_max_turns: int = Field(2000, ge=1, description="Most turns in one conversation snapshot.")
    ingest_max_turn_chars: int = Field(200_000, ge=1, description="Longest text of one turn.")
    redact_pii: bool = Field(False, description="Also redact e-mail addresses and phone numbers (secrets are always redacted).")
    drop_recall_echoes: bool = Field(True, description="Do not store turns that are recall_my_conversations output.")
    deletion_receipt_ttl_days: int = Field(30, ge=1, description="How long GET /deletions/{id} remembers a receipt.")
    ingest_redis_memory_share: float = Field(0.95, gt=0, le=1, description="Share of Redis's maxmemory past which new turns are refused with 503: the rest stays for the indexers, which need a little memory (locks, schedules) to drain the backlog; at maxmemory itself they could not, and nothing would free it.")
    stream_maxlen: int = Field(1_000_000, ge=1000, description="Unprocessed stream entries past which new turns are refused with 503 (a backlog guard; nothing is ever trimmed, forget requests are always accepted).")

    @field_validator("ingest_key", "ingest_key_next")
    @classmethod
    def _no_weak_ingest_key(cls, v: SecretStr, info) -> SecretStr:
        if v.get_secret_value():
            check_secret(f"RECALL_{info.field_name.upper()}", v.get_secret_value(), min_length=24)
        return v

    @model_validator(mode="after")
    def _budget_holds_a_whole_body(self) -> "IngestSettings":
        # Below the largest body, one caller alone could never post it: refused as busy, for good.
        if self.body_buffer_bytes < self.ingest_max_body_bytes:
            raise ValueError(f"RECALL_BODY_BUFFER_BYTES ({self.body_buffer_bytes}) must be at least "
                             f"RECALL_INGEST_MAX_BODY_BYTES ({self.ingest_max_body_bytes})")
        return self
