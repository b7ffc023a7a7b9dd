"""Indexer workers: a consumer group on the stream; they write snapshots and run index jobs."""
