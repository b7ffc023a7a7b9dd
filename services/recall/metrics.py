from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from shared.engine.embedder import loaded_embedders
from shared.unexpected_http import UNEXPECTED_ERRORS

RECALL_LATENCY = Histogram(
    "recall_tool_latency_seconds", "recall_my_conversations latency by outcome (hit, empty, no_memory, indexing: stored "
    "conversations before their first index run, unavailable, busy).",
    ["outcome"], buckets=(0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5, 5, 10, 30))
RECALL_IN_FLIGHT = Gauge("recall_in_flight", "Searches running in this replica (one whose caller timed out counts until it stops).")
RECALL_QUEUED = Gauge("recall_queued", "Recalls waiting for a free slot.")
RECALL_BUSY = Counter("recall_busy_total", "Calls answered 'busy, try again': the queue was full, no slot freed in time, the search ran past its deadline, or a tool call ran out of time.", ["reason"])
RECALL_CONCURRENCY_LIMIT = Gauge("recall_concurrency_limit", "RECALL_MAX_CONCURRENCY of this replica.")
POOL_SIZE = Gauge("recall_pool_processes", "Live engine children (funes mode) or open tenant memories (embedded).")
READER_CACHE_BYTES = Gauge("recall_reader_cache_bytes", "Embedded engine: bytes of vectors and indexes held by open tenant memories.")
POOL_SPAWNS = Counter("recall_pool_spawns_total", "Engine children started (funes mode).")
POOL_EVICTIONS = Counter("recall_pool_evictions_total", "Children or memory handles closed to stay under the cap or when idle.", ["reason"])
# A replica whose RECALL_JWT_SECRET (or JWKS, issuer, audience) differs from the gateway's refuses
# every call it gets: behind a load balancer, one call in N fails, and only this shows which.
TOKENS_REJECTED = Counter("recall_tokens_rejected_total", "Requests refused 401: no bearer token (missing), or one this "
                          "replica cannot verify (invalid: malformed, expired, or another key, issuer or audience).",
                          ["reason"])
POOL_CRASH_RESTARTS = Counter("recall_pool_crash_restarts_total", "Children replaced after a crash, timeout or protocol error.", ["reason"])

# Series exist from the start (at 0), so dashboards and alerts see them before the first event.
for _outcome in ("hit", "empty", "no_memory", "indexing", "unavailable", "busy"):
    RECALL_LATENCY.labels(_outcome)
for _reason in ("queue_full", "queue_timeout", "search_deadline", "tool_timeout"):
    RECALL_BUSY.labels(_reason)
for _reason in ("lru", "idle"):
    POOL_EVICTIONS.labels(_reason)
for _reason in ("crash", "timeout", "error"):
    POOL_CRASH_RESTARTS.labels(_reason)
for _reason in ("missing", "invalid"):
    TOKENS_REJECTED.labels(_reason)

# Memory artifacts, population and AgentMemory calls (MCP realm tools and the HTTP API). A
# `database_unavailable` outcome means PostgreSQL (RECALL_ARTIFACTS_DB_URL) could not be reached:
# conversation recall goes on, the realm surface answers "database is unavailable".
REALM_CALLS = Counter("recall_realm_calls_total", "Realm (memory artifacts, population, AgentMemory) calls by surface and outcome.",
                      ["surface", "outcome"])
for _surface in ("mcp", "http"):
    for _outcome in ("ok", "refused", "database_unavailable", "timeout"):
        REALM_CALLS.labels(_surface, _outcome)

# Failures nothing expected (a bug, a damaged database): a tool call answered with a masked
# tool error, an HTTP request with a JSON 500. Each is one `recall.unexpected_error` log line.
for _surface in ("mcp", "http"):
    UNEXPECTED_ERRORS.labels(_surface)


class QueryBatchingCollector:
    """Query embeddings and the model runs that computed them (embedded engine, e5): their ratio
    is how many queries a run shares (1 = no batching; `RECALL_EMBED_QUERY_LANES`). Read from the
    engine's counts at each scrape, so they live in the engine, not in the service."""

    def collect(self):
        batchers = [b for b in (getattr(e, "query_batcher", None) for e in loaded_embedders()) if b is not None]
        yield CounterMetricFamily("recall_query_embeddings", "Queries embedded by the embedded engine's model.",
                                  value=sum(b.queries for b in batchers))
        yield CounterMetricFamily("recall_query_model_runs", "Model runs that embedded them (several queries share a run under load).",
                                  value=sum(b.runs for b in batchers))


REGISTRY.register(QueryBatchingCollector())  # at 0 until a query is embedded here (always 0 in funes mode)
