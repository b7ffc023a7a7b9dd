"""The realm surface's blocking work (database transactions, artifact search) runs in threads of
its own: a slow or silent artifacts database then holds these, never the default executor
(`asyncio.to_thread`) where every tenant's conversation search runs."""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

REALM_THREADS = 8  # also the most database connections these open (one per thread; the index queue has one more)
T = TypeVar("T")

_pool = ThreadPoolExecutor(max_workers=REALM_THREADS, thread_name_prefix="realm")


async def in_realm_thread(fn: Callable[..., T], /, *args: Any) -> T:
    """`asyncio.to_thread`, in the realm surface's threads (the caller's context goes along)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_pool, call)
