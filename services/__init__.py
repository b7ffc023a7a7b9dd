"""The three recall services: ingest (HTTP → stream), indexer (stream → memory), recall (MCP)."""
