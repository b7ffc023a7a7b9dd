"""The embedded recall engine: a funes-compatible hybrid search over `.funes.jsonl` transcripts.

Layers inside this package (see docs/architecture.md):
- transcript.py / chunking.py: the input format and how it becomes chunks;
- embedder.py / reranker.py: the local models;
- store.py: the on-disk memory (SQLite rows + vectors, tantivy BM25) and its commit protocol;
- memory_lock.py / index_run.py: writing a memory;
- hybrid_search.py / identifiers.py: reading it;
- agent_format.py: funes' byte-stable output contract;
- cli.py / mcp_stdio.py: the two front doors.
"""

import os

# onnxruntime 1.2x+ on Linux collects telemetry by default: it writes a device id under
# ~/.cache/Microsoft and may upload events. A memory service sends nothing anywhere; set before
# any onnxruntime session exists (an operator's own setting wins).
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
