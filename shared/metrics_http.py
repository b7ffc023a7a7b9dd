"""The `/metrics` endpoint every service serves from its process's default registry.

One process per container (scale by replicas), so no multiprocess collector is needed.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

import shared.process_metrics  # noqa: F401  (registers process_threads)


async def metrics_endpoint(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
