"""`recall-engine mcp` speaks real MCP over stdio to a real client."""

from __future__ import annotations

from fastmcp import Client
from fastmcp.client.transports import StdioTransport

from shared.engine.index_run import index_tree, memory_dir
from tests.conftest import engine_cli, write_conversation


async def test_mcp_server_answers_recall_get_and_status(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "plant", ["What did we decide on N-11?", "Proceed once MT-4471 is closed.", "ok"])
    home = tmp_path / "home"
    index_tree(home, src, embedder)
    transport = StdioTransport(engine_cli(), ["mcp", str(memory_dir(home))], keep_alive=True)
    async with Client(transport) as client:
        names = {t.name for t in await client.list_tools()}
        assert {"recall", "get", "status"} <= names
        res = await client.call_tool("recall", {"query": "MT-4471", "k": 1})
        text = res.content[0].text
        assert "Proceed once MT-4471 is closed." in text and "→ get plant plant-1" in text
        res = await client.call_tool("get", {"session_id": "plant", "turn_uuid": "plant-1", "window": 1})
        assert "seq0 turn=plant-0" in res.content[0].text and "seq2 turn=plant-2" in res.content[0].text
        res = await client.call_tool("status", {})
        assert "chunks: 3" in res.content[0].text and "sessions: 1" in res.content[0].text
        res = await client.call_tool("recall", {"query": "anything", "memory": str(tmp_path / "missing")})
        assert res.content[0].text.startswith("recall error: no index yet") and not res.is_error
        res = await client.call_tool("recall", {"query": "zzzz qqqq", "block_type": "thinking"})
        assert res.content[0].text == "no results"
        # funes' k and window are unsigned: a negative one is an error, not the whole candidate pool.
        res = await client.call_tool("recall", {"query": "MT-4471", "k": -1})
        assert res.content[0].text.startswith("recall error:") and not res.is_error
        res = await client.call_tool("get", {"session_id": "plant", "turn_uuid": "plant-1", "window": -1})
        assert res.content[0].text.startswith("get error:")
