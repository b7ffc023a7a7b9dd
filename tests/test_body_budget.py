"""The process-wide budget for request bodies still arriving (shared/body_budget.py): a body whose
next chunk would pass it is refused at once, and what each body held goes back to the budget
however reading it ends. A leak would make the service refuse every body, for good."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from structlog.testing import capture_logs

from services.ingest.settings import IngestSettings
from services.recall.settings import RecallSettings
from shared.body_budget import BodyBudget
from shared.http_body import READ_DEADLINE, BodyBusy, BodyLimit, BodyStalled, BodyTooLarge, read_body
from shared.settings_base import CommonSettings

KIB = 1024


def refused(reason: str) -> float:
    return REGISTRY.get_sample_value("recall_http_bodies_refused_total", {"reason": reason}) or 0.0


class Caller:
    """The ASGI side of one request: `chunks` arrive as its body, then it stalls (`then="stall"`),
    hangs up (`"hang up"`) or ends (`"end"`, the last chunk closes the body)."""

    def __init__(self, chunks: list[bytes], then: str = "end", deadline_s: float | None = None) -> None:
        self.chunks, self.then = list(chunks), then
        self.scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": [], "query_string": b"",
                      "extensions": {READ_DEADLINE: asyncio.get_running_loop().time() + deadline_s} if deadline_s else {}}
        self.sent: list[dict] = []

    async def receive(self) -> dict:
        if self.chunks:
            chunk = self.chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks) or self.then != "end"}
        if self.then == "hang up":
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # stalls: nothing more ever comes
        raise AssertionError("unreachable")

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def request(self) -> Request:
        return Request(self.scope, self.receive)

    def answer(self) -> tuple[int, dict]:
        return self.sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in self.sent[1:]))


async def held_by_another(budget: BodyBudget, size: int) -> asyncio.Task:
    """A body that holds `size` bytes of `budget` and stalls; cancel it to hang it up."""
    task = asyncio.create_task(read_body(Caller([b"x" * size], then="stall").request(), 4 * 2**20, budget))
    while budget.held < size:
        await asyncio.sleep(0)
    return task


async def test_a_whole_body_holds_its_bytes_while_it_arrives_and_gives_them_back_once_read():
    budget = BodyBudget(2**20)
    caller = Caller([b"a" * 300 * KIB, b"b" * 200 * KIB])
    body = await read_body(caller.request(), 2**20, budget)
    assert len(body) == 500 * KIB and budget.held == 0


async def test_a_body_whose_next_chunk_would_pass_the_budget_is_refused_at_once_and_counted():
    budget = BodyBudget(2**20)
    other = await held_by_another(budget, 700 * KIB)
    before = refused("budget")
    with capture_logs() as logs:
        with pytest.raises(BodyBusy) as busy:
            await read_body(Caller([b"a" * 200 * KIB, b"b" * 200 * KIB], then="stall").request(), 2**20, budget)
    assert "busy" in busy.value.detail and "RECALL_BODY_BUFFER_BYTES" in busy.value.detail
    assert refused("budget") == before + 1
    [line] = logs
    assert line["event"] == "http.body_budget" and line["log_level"] == "warning"
    assert (line["received_bytes"], line["held_bytes"], line["budget_bytes"]) == (200 * KIB, 900 * KIB, 2**20)
    assert budget.held == 700 * KIB, "the refused body's 200 KiB went back; the other body keeps its own"
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await other
    assert budget.held == 0


@pytest.mark.parametrize("way_out, chunks, then, deadline_s, raised", [
    ("too large", [b"a" * 600 * KIB, b"b" * 600 * KIB], "stall", None, BodyTooLarge),
    ("stalled past the read deadline", [b"a" * 600 * KIB], "stall", 0.2, BodyStalled),
    ("the caller hung up", [b"a" * 600 * KIB], "hang up", None, ClientDisconnect),
])
async def test_what_a_body_held_goes_back_to_the_budget_however_reading_it_ends(way_out, chunks, then, deadline_s, raised):
    budget = BodyBudget(4 * 2**20)
    with pytest.raises(raised):
        await read_body(Caller(chunks, then, deadline_s).request(), 2**20, budget)
    assert budget.held == 0, way_out


async def test_a_request_cancelled_while_its_body_arrives_gives_its_bytes_back():
    """uvicorn cancels the requests still in flight at the end of the stop grace."""
    budget = BodyBudget(4 * 2**20)
    task = await held_by_another(budget, 600 * KIB)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert budget.held == 0


async def test_many_small_bodies_at_once_are_all_read_within_the_default_budget():
    """A burst of well-behaved callers (200 bodies of 64 KiB arriving together) is far below it."""
    budget = BodyBudget(CommonSettings.model_fields["body_buffer_bytes"].default)
    callers = [Caller([b"a" * 32 * KIB, b"b" * 32 * KIB]) for _ in range(200)]
    bodies = await asyncio.gather(*(read_body(c.request(), 2**20, budget) for c in callers))
    assert [len(b) for b in bodies] == [64 * KIB] * 200 and budget.held == 0


# ---- /mcp: BodyLimit buffers the body before the MCP SDK sees it ------------------------------------
async def reached_app(caller: Caller, budget: BodyBudget, limit: int = 2**20) -> list[int]:
    """Runs BodyLimit for the caller; the bytes the budget held when the app got the request."""
    seen: list[int] = []

    async def app(scope, receive, send) -> None:
        seen.append(budget.held)

    await BodyLimit(app, "/mcp", limit, budget)(caller.scope, caller.receive, caller.send)
    return seen


async def test_mcp_gives_a_body_back_to_the_budget_before_the_app_parses_it():
    budget = BodyBudget(2**20)
    assert await reached_app(Caller([b"a" * 300 * KIB, b"b" * 300 * KIB]), budget) == [0]


async def test_mcp_answers_busy_503_for_a_body_past_the_budget_and_keeps_nothing_of_it():
    budget = BodyBudget(2**20)
    other = await held_by_another(budget, 900 * KIB)
    caller = Caller([b"a" * 64 * KIB, b"b" * 64 * KIB, b"c" * 64 * KIB], then="stall")
    before = refused("budget")
    assert await reached_app(caller, budget) == [], "refused before the MCP SDK saw it"
    status, body = caller.answer()
    assert status == 503 and body["error"] == "busy" and "retry" in body["detail"]
    assert refused("budget") == before + 1 and budget.held == 900 * KIB
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await other
    assert budget.held == 0


@pytest.mark.parametrize("way_out, chunks, then, deadline_s, status", [
    ("too large", [b"a" * 600 * KIB, b"b" * 600 * KIB], "stall", None, 413),
    ("stalled past the read deadline", [b"a" * 600 * KIB], "stall", 0.2, 408),
    ("the caller hung up", [b"a" * 600 * KIB], "hang up", None, None),
])
async def test_mcp_gives_what_a_body_held_back_however_reading_it_ends(way_out, chunks, then, deadline_s, status):
    budget = BodyBudget(4 * 2**20)
    caller = Caller(chunks, then, deadline_s)
    assert await reached_app(caller, budget) == []
    assert (caller.answer()[0] if caller.sent else None) == status, way_out
    assert budget.held == 0, way_out


async def test_mcp_request_cancelled_while_its_body_arrives_gives_its_bytes_back():
    budget = BodyBudget(4 * 2**20)
    task = asyncio.create_task(reached_app(Caller([b"a" * 600 * KIB], then="stall"), budget))
    while budget.held < 600 * KIB:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert budget.held == 0


@pytest.mark.parametrize("settings, named", [
    (lambda: IngestSettings(body_buffer_bytes=2 * 2**20), "RECALL_INGEST_MAX_BODY_BYTES (4194304)"),
    (lambda: RecallSettings(body_buffer_bytes=2 * 2**20, realm_max_text_bytes=512 * KIB), "the largest request /mcp reads"),
])
def test_a_budget_smaller_than_the_largest_body_is_refused_at_start(settings, named):
    """Such a body could never be read: every caller sending one would be told 'busy' for good."""
    with pytest.raises(ValidationError, match=re.escape(named)):
        settings()
