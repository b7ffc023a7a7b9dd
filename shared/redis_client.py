"""The services' Redis connections (their own asyncio clients and faststream's), made one way.

redis-py (8.x) keeps idle connections in a pool and, unless told, tries nothing again: after a
Redis restart the first command on each pooled connection failed with "Connection closed by
server" (a stream entry then waited for the reclaimer, a forget for its retry). These
connections try a command, a pipeline or a script up to twice more on a fresh connection when
the connection itself failed. Not on a timeout: a Redis that hangs must cost a caller one
timeout, not three. Not for a pub/sub listener that must notice a gap (it would reconnect and
subscribe again unseen).
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

RETRIES = 2
# How long a /readyz waits for Redis: within the manifests' probe timeout (3 s), whatever the client's
# socket timeout (ingest 2 s, the indexer 10 s) would let a hung Redis take.
READY_CHECK_S = 1.0


def retry_options() -> dict[str, Any]:
    """Connection options of redis-py (and of faststream's RedisBroker, which passes them on)."""
    retry = Retry(ExponentialWithJitterBackoff(base=0.02, cap=0.25), RETRIES, supported_errors=(RedisConnectionError,))
    return {"retry": retry, "retry_on_error": [RedisConnectionError]}


def async_redis(url: str, socket_timeout: float | None = None, socket_connect_timeout: float | None = None) -> aioredis.Redis:
    return aioredis.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout,
                                   **retry_options())
