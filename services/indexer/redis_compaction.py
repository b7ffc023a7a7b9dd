"""After a deletion, Redis's memory and files must not keep the deleted text either.

Two places keep it after XDEL:
- the stream itself: XDEL only flags an entry as deleted inside its listpack node; the bytes
  stay (in memory, and in every AOF rewrite or RDB dump) until every entry of that node is
  gone. So the streams are rebuilt from their live entries, with their consumer groups and
  pending entries (owner, idle time, delivery count) and last id, in one atomic script;
- the append-only file (and an RDB snapshot, where one is configured), which holds the XADD
  until Redis rewrites it: BGREWRITEAOF / BGSAVE, waited for until Redis reports success.

`DurableCompaction.compact()` does both; the forget receipt becomes `done` after it. Forgets
that arrive while one runs share the next, so a burst of deletions costs a few rewrites, not
one each. The rebuild costs time in proportion to the stream backlog (normally near zero:
processed entries are deleted at once).
"""

from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis

from shared.logging_setup import get_logger

log = get_logger("recall.indexer.compaction")


class CompactionFailed(Exception):
    pass


# KEYS[1]: a stream, KEYS[2]: a scratch key. Rebuild the stream from its live entries, keeping
# ids, groups, pending entries and the last generated id. Returns the number of live entries
# (-1: nothing to rebuild). The old stream is renamed to the scratch key and moved over 500
# entries at a time, each batch deleted from it as it goes (emptied nodes are freed), so the
# rebuild needs about one copy of the backlog: reading it all into the script first held it
# three times over (stream, script copy, new stream), and a forget during a large backlog (when
# memory is high anyway) could take Redis past its container limit.
_REBUILD_STREAM = """
local key, scratch = KEYS[1], KEYS[2]
if redis.call('EXISTS', key) == 0 or redis.call('XLEN', key) == 0 then return -1 end
local function field(flat, name)
  for i = 1, #flat, 2 do if flat[i] == name then return flat[i + 1] end end
end
local last_id = field(redis.call('XINFO', 'STREAM', key), 'last-generated-id')
local groups = {}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  local name = field(g, 'name')
  table.insert(groups, {name, field(g, 'last-delivered-id'), redis.call('XPENDING', key, name, '-', '+', 2147483647)})
end
redis.call('DEL', scratch)
redis.call('RENAME', key, scratch)
local moved = 0
while true do
  local batch = redis.call('XRANGE', scratch, '-', '+', 'COUNT', 500)
  if #batch == 0 then break end
  local ids = {}
  for i, e in ipairs(batch) do
    redis.call('XADD', key, e[1], unpack(e[2]))
    ids[i] = e[1]
  end
  redis.call('XDEL', scratch, unpack(ids))
  moved = moved + #batch
end
redis.call('DEL', scratch)
redis.call('XSETID', key, last_id)
for _, g in ipairs(groups) do
  redis.call('XGROUP', 'CREATE', key, g[1], g[2])
  for _, p in ipairs(g[3]) do
    redis.call('XCLAIM', key, g[1], p[2], 0, p[1], 'IDLE', p[3], 'RETRYCOUNT', p[4], 'FORCE', 'JUSTID')
  end
end
return moved
"""


class DurableCompaction:
    def __init__(self, client: aioredis.Redis, streams: list[str], timeout_s: float = 120.0, poll_s: float = 0.05) -> None:
        self.client = client
        self.streams = streams
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self._lock = asyncio.Lock()
        self._requested = 0
        self._completed = 0

    async def compact(self) -> None:
        """Call after the deletes: returns when a rewrite that started after them has finished."""
        self._requested += 1
        ticket = self._requested
        async with self._lock:
            if self._completed >= ticket:
                return  # a rewrite that started after our deletes already finished
            covered = self._requested
            await self._rewrite()
            self._completed = covered

    async def _rewrite(self) -> None:
        for stream in self.streams:
            await self.client.eval(_REBUILD_STREAM, 2, stream, f"{stream}:rebuilding")
        info = await self.client.info("persistence")
        if int(info.get("aof_enabled", 0)):
            await self._background("BGREWRITEAOF", "aof_rewrite_in_progress", "aof_last_bgrewrite_status",
                                   scheduled="aof_rewrite_scheduled")
        if await self._rdb_configured():
            await self._background("BGSAVE", "rdb_bgsave_in_progress", "rdb_last_bgsave_status")

    async def _rdb_configured(self) -> bool:
        try:
            save = (await self.client.config_get("save")).get("save", "")
        except aioredis.ResponseError:  # CONFIG disabled (managed Redis): cannot tell, so do not guess
            return False
        return bool(save and str(save).strip())

    async def _background(self, command: str, in_progress: str, status: str, scheduled: str | None = None) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                await self.client.execute_command(command)
                break
            except aioredis.ResponseError as exc:
                if "in progress" not in str(exc):
                    raise CompactionFailed(f"{command}: {exc}") from exc
                await self._wait_idle(in_progress, scheduled, deadline)  # then start our own
        await self._wait_idle(in_progress, scheduled, deadline)
        info = await self.client.info("persistence")
        if str(info.get(status, "ok")) != "ok":
            raise CompactionFailed(f"{command} finished with status {info.get(status)}")

    async def _wait_idle(self, in_progress: str, scheduled: str | None, deadline: float) -> None:
        while True:
            info = await self.client.info("persistence")
            if not int(info.get(in_progress, 0)) and not (scheduled and int(info.get(scheduled, 0))):
                return
            if time.monotonic() > deadline:
                raise CompactionFailed(f"{in_progress} still set after {self.timeout_s:.0f}s")
            await asyncio.sleep(self.poll_s)
