"""`recall-engine mcp [memory]`: funes' stdio MCP server (tools recall, get, status).

Models are loaded once at start, so the first call is as fast as the rest: this is the child
the recall service's process pool keeps alive per tenant. Tool errors come back as text
(`recall error: …`), never as protocol errors, exactly as funes does. Nothing but JSON-RPC
may reach stdout, so logging goes to stderr.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from shared.engine.hybrid_search import RecallParams


def serve(default_memory: Path) -> None:
    from mcp.server.mcpserver import MCPServer

    from shared.engine.api import Engine, status_text

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING)
    engine = Engine(max_readers=4)
    server = MCPServer("funes", version="1.8.0-recall-engine", log_level="WARNING")

    def resolve(memory: str | None) -> Path:
        return Path(memory) if memory and memory.strip() else default_memory

    @server.tool(description="Ranked hybrid search over past conversations.")
    def recall(query: str, k: int | None = None, block_type: str | None = None,
               harness: str | None = None, memory: str | None = None, candidates: int | None = None,
               explain: bool = False) -> str:
        # candidates and explain are additions to funes' tool: omitted, the output is funes'.
        if (k is not None and k < 1) or (candidates is not None and candidates < 1):
            return "recall error: k and candidates must be at least 1"  # funes' are unsigned
        try:
            params = RecallParams(k=k or 8, candidates=candidates or RecallParams.candidates,
                                  block_type=block_type or None, harness=harness or None, floor=True,
                                  explain=bool(explain))
            return engine.recall(resolve(memory), query, params)
        except Exception as exc:
            return f"recall error: {exc}"

    @server.tool(description="Read the turns around one turn of a session.")
    def get(session_id: str, turn_uuid: str, window: int | None = None, memory: str | None = None) -> str:
        if window is not None and window < 0:
            return "get error: window must be at least 0"
        try:
            return engine.get(resolve(memory), session_id, turn_uuid, 3 if window is None else window)
        except Exception as exc:
            return f"get error: {exc}"

    @server.tool(description="What the memory holds and when it was last indexed.")
    def status(memory: str | None = None) -> str:
        try:
            return status_text(resolve(memory))
        except Exception as exc:
            return f"status error: {exc}"

    server.run("stdio")
