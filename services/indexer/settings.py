from __future__ import annotations

import os
import socket

from pydantic import Field

from shared.settings_base import CommonSettings
from shared.stream_schema import MAX_RETENTION_DAYS


def _default_consumer() -> str:
    # Worker processes of one host share HOSTNAME, so the pid makes the name unique.
    return f"{socket.gethostname()}-{os.getpid()}"


class IndexerSettings(CommonSettings):
    indexer_port: int = Field(8002, description="Port of the indexer's /healthz, /readyz and /metrics.")
    indexer_host: str = Field("127.0.0.1", description="Bind address of the indexer's HTTP endpoints.")
    consumer: str = Field(default_factory=_default_consumer, description="Consumer name in the group; unique per worker.")
    index_debounce_s: float = Field(1.0, ge=0, description="Wait after a user's first new write before indexing.")
    index_concurrency: int = Field(2, ge=1, description="Index jobs one worker runs at once, for different users (onnxruntime, SQLite and tantivy release the GIL).")
    index_heavy_bytes: int = Field(65_536, ge=1, description="A user's index run is heavy when its transcripts grew by at least this many bytes since its last run (~7 s of e5 CPU for English prose, less for a token per character: a 150,000-character paste is 150-450 KB); one worker runs one heavy run at a time, so its other slots keep indexing everyone else's new turns.")
    forget_concurrency: int = Field(2, ge=1, description="Forgets one worker carries out at once, for different users (one user's run one at a time), counted from when each holds its user's index lock; they wait beside the stream's message slots, so turns keep flowing.")
    forgets_held: int = Field(10_000, ge=1, description="Forgets one worker holds (running or waiting; each costs a task and a share of one XCLAIM per period) before it takes no more messages until one is done: a bound on memory, set far above one user's mass deletion, since at the bound every message waits.")
    index_lock_ttl_s: float = Field(30.0, gt=0, description="Expiry of a user's index lock; renewed while the job runs.")
    index_timeout_s: float = Field(900.0, gt=0, description="An index job is stopped after this long (funes: the child is killed; embedded: it stops at its next checkpoint; what it committed before, every 2,048 new chunks, stays and the next run goes on from there).")
    max_deliveries: int = Field(5, ge=1, description="Deliveries before a message goes to the dead-letter stream.")
    reclaim_idle_ms: int = Field(10_000, ge=100, description="Idle time after which another worker claims a pending message.")
    retry_backoff_s: float = Field(0.5, ge=0, description="Base of the exponential backoff between deliveries.")
    retention_days: int | None = Field(None, ge=1, le=MAX_RETENTION_DAYS, description="Forget conversations whose last turn is older (off when unset); PUT /users/{user}/retention overrides it per user.")
    retention_sweep_s: float = Field(3600.0, gt=0, description="Seconds between retention sweeps (one worker sweeps at a time).")
