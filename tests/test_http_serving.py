"""The HTTP services run on uvloop's event loop and httptools' parser (shared/http_serving.py),
not on uvicorn's silent fallback to asyncio and h11."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest


def loaded_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("command", ["ingest", "serve"])
def test_a_service_answers_http_through_uvloop_and_httptools(services, command):
    proc = services(command)
    assert httpx.get(proc.health_url, timeout=10).status_code == 200
    maps = loaded_libraries(proc.proc.pid)
    assert "/uvloop/" in maps, "uvloop's loop is not loaded"
    assert "/httptools/" in maps, "httptools' parser is not loaded"
