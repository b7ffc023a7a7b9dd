"""Ingest: the gateway posts completed turns here; they go onto the Redis stream."""
