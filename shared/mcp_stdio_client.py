"""A minimal MCP client for one long-lived stdio child (newline-delimited JSON-RPC 2.0).

Used by the recall service's process pool and the benchmarks. One pending future per request
id; when the child exits, every pending call fails at once instead of waiting for a timeout.
It has no dependency beyond asyncio because it sits on the hot path of every pooled recall.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import os
import signal
from collections.abc import Sequence
from typing import Any

from shared.child_process import die_with_parent

PROTOCOL_VERSION = "2024-11-05"


class ChildExited(Exception):
    pass


class ChildGone(ChildExited):
    """The child was already dead: the request never reached it, so retrying is safe."""


class ToolCallError(Exception):
    """The child answered the call with a JSON-RPC error or `isError: true`."""


class StdioMCPChild:
    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None) -> None:
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.proc: asyncio.subprocess.Process | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._write_lock = asyncio.Lock()
        self._reader: asyncio.Task | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def alive(self) -> bool:
        """Running, and not a zombie waiting to be reaped (a death asyncio has not noticed yet)."""
        if self.proc is None or self.proc.returncode is not None:
            return False
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (FileNotFoundError, IndexError):
            return not os.path.isdir("/proc/self")  # no procfs: trust returncode alone
        return state not in (b"Z", b"X")

    async def start(self, timeout: float = 60.0) -> "StdioMCPChild":
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, env=self.env, cwd=self.cwd, limit=16 * 2**20,
            # SIGKILL if this replica dies: an engine child only reads, and a hung (stopped) one
            # would hold a SIGTERM until it is continued.
            start_new_session=True, preexec_fn=functools.partial(die_with_parent, signal.SIGKILL))
        self._reader = asyncio.create_task(self._read_loop())
        await self.request("initialize", {"protocolVersion": PROTOCOL_VERSION, "capabilities": {},
                                          "clientInfo": {"name": "recall-pool", "version": "1"}}, timeout)
        await self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return self

    async def call_tool(self, name: str, arguments: dict[str, Any], timeout: float) -> str:
        """The text of a tool result; ToolCallError when the child flags it as an error."""
        result = await self.request("tools/call", {"name": name, "arguments": arguments}, timeout)
        text = "".join(part.get("text", "") for part in result.get("content", []) if part.get("type") == "text")
        if result.get("isError"):
            raise ToolCallError(text)
        return text

    async def request(self, method: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        if not self.alive:
            raise ChildGone(f"MCP child {self.argv[0]} is not running")
        req_id = next(self._ids)
        fut = self._pending[req_id] = asyncio.get_running_loop().create_future()
        try:
            await self._send({"jsonrpc": "2.0", "id": req_id, "method": method, "params": params})
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._pending.pop(req_id, None)

    async def _send(self, message: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        async with self._write_lock:
            try:
                self.proc.stdin.write(json.dumps(message).encode() + b"\n")
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise ChildGone("MCP child closed its stdin") from exc

    async def _read_loop(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # a stray non-protocol line must not kill the session
                fut = self._pending.get(msg.get("id")) if isinstance(msg, dict) else None
                if fut is None or fut.done():
                    continue
                if "error" in msg:
                    fut.set_exception(ToolCallError(str(msg["error"].get("message", msg["error"]))))
                else:
                    fut.set_result(msg.get("result", {}))
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(ChildExited("MCP child exited"))
            if self.proc.returncode is None and self.proc.stdout.at_eof():
                await self.proc.wait()  # reap it now rather than leave a zombie until the next call

    async def close(self, grace: float = 2.0) -> None:
        """Close stdin (the MCP way to end a stdio server), then terminate, then kill."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                await asyncio.wait_for(self.proc.wait(), grace)
            except (asyncio.TimeoutError, BrokenPipeError, ConnectionResetError):
                self.kill()
                await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
