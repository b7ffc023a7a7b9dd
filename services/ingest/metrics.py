from prometheus_client import Counter, Gauge, Histogram

INGEST_REQUESTS = Counter("recall_ingest_requests_total", "Ingest API requests by route and HTTP status.", ["route", "status"])
INGEST_TURNS = Counter("recall_ingest_turns_total", "Turns accepted onto the stream.")
INGEST_LATENCY = Histogram("recall_ingest_request_seconds", "Ingest request handling time.", ["route"],
                           buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
INGEST_REDACTIONS = Counter("recall_ingest_redactions_total", "Secrets and PII replaced before publishing, by kind.", ["kind"])
INGEST_STREAM_LENGTH = Gauge("recall_ingest_stream_length", "Entries in the stream ingest writes to (RECALL_STREAM), as ingest last saw it.")
INGEST_STREAM_READERS = Gauge("recall_ingest_stream_readers",
                              "Consumers in the indexers' group (RECALL_GROUP) on the stream ingest writes to: 0 with entries "
                              "waiting means no indexer reads what ingest accepts.")
