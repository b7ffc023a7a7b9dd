"""An unexpected error logged by a library's stdlib logger (uvicorn's 'Exception in ASGI
application', fastmcp's 'Error calling tool', faststream's handler errors) reached the JSON log
as `exc_info: ["<class …>", "…", "<traceback object at 0x…>"]`: the traceback an SRE needs was
lost. It is rendered like structlog's own (frames, no locals)."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import logging
from shared.logging_setup import configure_logging

configure_logging("INFO")


def handle_request():
    api_key = "LOCAL-SECRET-4471"  # a frame local: never in the log
    raise RuntimeError("database said no")


try:
    handle_request()
except RuntimeError:
    logging.getLogger("fastmcp.server.server").exception("Error calling tool 'search_memory_artifacts'")
"""


def test_a_library_loggers_exception_keeps_its_traceback_without_frame_locals():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True).stdout
    event = json.loads(out.strip().splitlines()[-1])
    assert event["event"] == "Error calling tool 'search_memory_artifacts'" and event["level"] == "error"
    assert "traceback object" not in out and "exc_info" not in event, out
    [exc] = event["exception"]
    assert exc["exc_type"] == "RuntimeError" and exc["exc_value"] == "database said no"
    assert [f["name"] for f in exc["frames"]] == ["<module>", "handle_request"]
    assert "LOCAL-SECRET-4471" not in out
