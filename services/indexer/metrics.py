from prometheus_client import Counter, Gauge, Histogram

from shared.unexpected_http import UNEXPECTED_ERRORS

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30, 60, 120, 300, 900)

SNAPSHOTS = Counter("recall_indexer_snapshots_total", "Conversation snapshots handled, by result.", ["result"])
INDEX_JOB_SECONDS = Histogram("recall_index_job_duration_seconds", "Index job duration by outcome.", ["outcome"],
                              buckets=LATENCY_BUCKETS)
INDEX_JOB_FAILURES = Counter("recall_index_job_failures_total", "Index jobs that failed (retried later).")
INGEST_TO_SEARCHABLE = Histogram("recall_ingest_to_searchable_seconds",
                                 "From a snapshot's acceptance by ingest to the commit of the index run that covers it.",
                                 buckets=LATENCY_BUCKETS)
RETRIES = Counter("recall_indexer_retries_total", "Redeliveries of stream messages (delivery count above 1).")
DEAD_LETTERS = Counter("recall_indexer_dead_letters_total", "Messages moved to the dead-letter stream, by reason.", ["reason"])
STREAM_LENGTH = Gauge("recall_stream_length", "Entries in the ingest stream (acked ones are deleted).")
STREAM_PENDING = Gauge("recall_stream_pending", "Entries delivered to a worker and not yet acked.")
INDEX_DUE = Gauge("recall_index_due_users", "Users whose memory waits for an index run.")
# Users due says how many wait, not how long: in a soak trial it sat at every tenant (40) while
# the backlog grew from seconds to 25 minutes.
INDEX_DUE_OLDEST = Gauge("recall_index_due_oldest_seconds",
                         "How long the user longest due has been due for an index run (a run in progress counts; 0 when none is).")
INDEX_RUNNING = Gauge("recall_index_jobs_running", "Index jobs running in this worker.")
INDEX_HEAVY_RUNNING = Gauge("recall_index_heavy_jobs_running",
                            "Heavy index jobs running in this worker (their user's transcripts grew by RECALL_INDEX_HEAVY_BYTES or more since its last run; at most 1).")
FORGETS_HELD = Gauge("recall_indexer_forgets_held",
                     "Forget events this worker holds beside its message slots: running, or waiting for room, their "
                     "user's earlier forget, its index lock or a free forget slot (their stream entries stay pending until done).")

# Series exist from the start (at 0), so dashboards and alerts see them before the first event.
for _reason in ("invalid event", "max deliveries exceeded"):
    DEAD_LETTERS.labels(_reason)
for _outcome in ("ok", "busy", "failed", "cancelled", "lock_lost", "yielded"):
    INDEX_JOB_SECONDS.labels(_outcome)
for _result in ("written", "stale"):
    SNAPSHOTS.labels(_result)
FORGOTTEN = Counter("recall_forgotten_total", "Forget events carried out, by kind and reason (request, retention).", ["kind", "reason"])
RETENTION_SWEEPS = Counter("recall_retention_sweeps_total", "Retention sweeps run by this worker.")
RETENTION_ERRORS = Counter("recall_retention_errors_total",
                           "Retention sweep errors by where (redis, sweep, tenant, override); the sweeper carries on.", ["where"])
for _where in ("redis", "sweep", "tenant", "override"):
    RETENTION_ERRORS.labels(_where)
RETENTION_EXPIRED = Counter("recall_retention_expired_conversations_total", "Conversations the retention sweeper asked to forget.")
for _kind in ("forget_conversation", "forget_user"):
    for _why in ("request", "retention"):
        FORGOTTEN.labels(_kind, _why)
REEMBED_PROGRESS = Gauge("recall_reembed_progress_ratio",
                         "Share of a tenant's chunks embedded with the configured model while its re-embed runs "
                         "(the series is removed when the new memory is live).", ["user_hash"])
REEMBEDS = Counter("recall_reembeds_total", "Memories moved to the configured embedding model, by outcome.", ["outcome"])
REEMBED_PENDING = Gauge("recall_reembed_pending_memories",
                        "Memories stamped with another embedding model and not yet re-embedded, shared by all "
                        "indexers (each reports the same count, sampled every 2 s: take the max, not the sum).")
for _outcome in ("ok", "failed"):
    REEMBEDS.labels(_outcome)
# Its HTTP routes (probes, /metrics) failing unexpectedly: the recall service's series, with a
# surface of its own, so RecallServiceUnexpectedErrors covers the indexer too.
UNEXPECTED_ERRORS.labels("indexer_http")
