"""Ports are checked before anything starts: a taken port is one line naming the variable."""

from __future__ import annotations

import errno
import socket


def port_problems(wanted: list[tuple[str, str, int]]) -> list[str]:
    """One line per (variable, host, port) that is out of range, repeated or already bound."""
    problems: list[str] = []
    first_user: dict[int, str] = {}
    for var, host, port in wanted:
        if not 1 <= port <= 65535:
            problems.append(f"{var}={port} is not allowed: a port is 1 to 65535")
        elif port in first_user:
            problems.append(f"{var}={port} is not allowed: {first_user[port]} uses that port too; give each service its own")
        elif (error := _bind_error(host, port)) is not None:
            if error.errno == errno.EADDRINUSE:
                problems.append(f"{var}={port} is not allowed: {host}:{port} is already in use (another recall up or "
                                f"another program); set {var} to a free port")
            else:  # the address itself: not one of this host's, or not an address at all
                host_var = var.removesuffix("_PORT") + "_HOST"
                problems.append(f"{host_var}={host!r} is not allowed: cannot listen on {host}:{port} "
                                f"({error.strerror or error}); use an address of this host, e.g. 127.0.0.1 or 0.0.0.0")
        first_user.setdefault(port, var)
    return problems


def _bind_error(host: str, port: int) -> OSError | None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As uvicorn and redis-server bind: SO_REUSEADDR, so a port in TIME_WAIT counts as free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:  # socket.gaierror (a name that does not resolve) is an OSError too
            return exc
    return None
