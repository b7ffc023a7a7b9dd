"""An unknown path (404) or method (405), said the same way by every service: the part of the
request that is wrong and why (Starlette answers both in plain text). Each service puts them in
its own error shape."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request


def unknown_route(request: Request, exc: HTTPException, where: str) -> tuple[str, str]:
    """(`path` or `method`, what is wrong with it); `where` says where the endpoints are."""
    if exc.status_code == 404:
        return "path", f"no endpoint {request.url.path}; {where}"
    return "method", f"{request.method} is not accepted on {request.url.path}"
