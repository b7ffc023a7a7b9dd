"""The indexer worker process: faststream consumers on the stream, the index scheduler, and
a small HTTP server for /healthz, /readyz and /metrics. SIGTERM: stop taking messages, let
in-flight handlers finish, stop the running index job (index_scheduler.IndexScheduler.stop), exit."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import redis.asyncio as aioredis
import uvicorn
from faststream import AckPolicy
from faststream.redis import RedisBroker, RedisStreamMessage, StreamSub
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Scope

from services.indexer import redis_keys
from services.indexer.consumer_reaper import reap_forever
from services.indexer.forgetting import Forgetter
from services.indexer.index_job import EmbeddedIndexJob, make_index_job
from services.indexer.index_scheduler import FINISH_ON_STOP_S, IndexScheduler
from services.indexer.metrics import INDEX_DUE, INDEX_DUE_OLDEST, REEMBED_PENDING, STREAM_LENGTH, STREAM_PENDING, UNEXPECTED_ERRORS
from services.indexer.reembed_job import schedule_stale_tenants
from services.indexer.retention import RetentionSweeper
from services.indexer.settings import IndexerSettings
from services.indexer.storage_probe import StorageProbe
from services.indexer.stream_consumer import StreamConsumer
from shared.data_dir_identity import SharedDirWatch
from shared.engine.embedder import Embedder
from shared.error_site import exception_site, loggable_failure, new_incident
from shared.http_serving import bounded_read_protocol
from shared.logging_setup import get_logger
from shared.metrics_http import metrics_endpoint
from shared.redis_client import READY_CHECK_S, async_redis, retry_options
from shared.stream_schema import decode_fields, ensure_group, ensure_group_async
from shared.task_cancel import cancel_and_wait
from shared.unexpected_http import UnexpectedHTTPErrors, route_of

log = get_logger("recall.indexer")


# Entries a worker reads at a time. Read without a count, one worker took the whole backlog
# into its pending list, and a kill -9 stranded all of it for the reclaimer, which takes entries
# back one by one, each waiting out the retry backoff (1,200 entries took ~10 minutes); now a
# kill strands at most this many beside the ones its workers hold, and the rest stay unread.
READ_BATCH = 16
WORKERS = 4


def build_broker(settings: IndexerSettings, consumer: StreamConsumer) -> RedisBroker:
    broker = RedisBroker(settings.redis, logger=None, **retry_options())

    @broker.subscriber(stream=StreamSub(settings.stream, group=settings.group, consumer=settings.consumer,
                                        max_records=READ_BATCH),
                       ack_policy=AckPolicy.MANUAL, max_workers=WORKERS)
    # Several at once: each redelivery waits out its backoff before it is handled.
    @broker.subscriber(stream=StreamSub(settings.stream, group=settings.group, consumer=f"{settings.consumer}-reclaim",
                                        min_idle_time=settings.reclaim_idle_ms, polling_interval=200),
                       ack_policy=AckPolicy.MANUAL, max_workers=WORKERS)
    async def on_message(msg: RedisStreamMessage) -> None:
        # The stream entry id (not faststream's message_id) is the snapshot's version; acking
        # is the consumer's own (XACK + XDEL together).
        raw = msg.raw_message
        entry_id = raw["message_ids"][0]
        entry_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        try:
            await consumer.handle(entry_id, decode_fields(raw["data"]), await msg.get_delivery_count())
        except Exception as exc:
            log.warning("message.failed", entry_id=entry_id, **loggable_failure(exc))
            raise  # stays pending; the reclaimer redelivers it

    return broker


async def _sample_stream(client: aioredis.Redis, settings: IndexerSettings) -> None:
    while True:
        try:
            STREAM_LENGTH.set(await client.xlen(settings.stream))
            STREAM_PENDING.set((await client.xpending(settings.stream, settings.group))["pending"])
            INDEX_DUE.set(await client.zcard(redis_keys.DUE))
            oldest = await client.zrange(redis_keys.DUE, 0, 0, withscores=True)  # scores: when each run may start
            INDEX_DUE_OLDEST.set(max(0.0, time.time() - oldest[0][1]) if oldest else 0.0)
            REEMBED_PENDING.set(await client.scard(redis_keys.REEMBED_PENDING))
        except aioredis.RedisError:
            pass
        await asyncio.sleep(2.0)


async def _keep_consuming(broker: RedisBroker, client: aioredis.Redis, settings: IndexerSettings) -> None:
    """faststream stops a subscriber for good when its consumer group is gone (Redis came back
    without its data: no persistence, a new volume); ingest went on answering 202 and no entry
    was ever delivered again, silently. The group is made again at id 0 (faststream would make
    it at `$`, skipping what was published meanwhile) and the subscribers restarted."""
    while True:
        await asyncio.sleep(2.0)
        if all(sub.running for sub in broker.subscribers):
            continue
        try:
            await ensure_group_async(client, settings.stream, settings.group)
            await broker.stop()
            await broker.start()
            log.warning("indexer.consumers_restarted", stream=settings.stream, group=settings.group,
                        reason="the consumer group was gone (Redis without its data?)")
        except aioredis.RedisError as exc:
            log.warning("indexer.consumers_restart_failed", error=type(exc).__name__)


def _record_http_failure(exc: BaseException, scope: Scope) -> str:
    """A probe or /metrics failing unexpectedly (a bug): counted with the recall service's
    (`recall_unexpected_errors_total{surface="indexer_http"}`), logged without the message."""
    incident = new_incident()
    UNEXPECTED_ERRORS.labels("indexer_http").inc()
    log.error("indexer.unexpected_error", route=route_of(scope), method=scope["method"], incident=incident,
              **exception_site(exc))
    return incident


def _http_app(client: aioredis.Redis, storage: StorageProbe, shared_dir: SharedDirWatch) -> Starlette:
    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        try:
            await asyncio.wait_for(client.ping(), READY_CHECK_S)
        except Exception:
            return JSONResponse({"status": "redis unreachable"}, status_code=503)
        if shared_dir.problem is not None:
            return JSONResponse({"status": shared_dir.problem}, status_code=503)
        if storage.reason is not None:
            return JSONResponse({"status": f"data dir not writable: {storage.reason}"}, status_code=503)
        return JSONResponse({"status": "ready"})

    return Starlette(routes=[Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", metrics_endpoint)],
                     middleware=[Middleware(UnexpectedHTTPErrors, record=_record_http_failure)])


async def _schedule_stale_tenants(client: aioredis.Redis, data_dir: Path, embedder: Embedder) -> None:
    """reembed_job.schedule_stale_tenants in the background; Redis away is one warning line (a
    stale tenant's own next run still re-embeds it, and the next start scans again)."""
    try:
        await schedule_stale_tenants(client, data_dir, embedder)
    except aioredis.RedisError as exc:
        log.warning("reembed.schedule_failed", error=type(exc).__name__)


async def run_worker(settings: IndexerSettings) -> None:
    import redis

    sync = redis.Redis.from_url(settings.redis, socket_connect_timeout=5, socket_timeout=10)  # a hung Redis fails the start, not hangs it
    ensure_group(sync, settings.stream, settings.group)
    sync.close()
    client = async_redis(settings.redis, socket_timeout=10)
    job = make_index_job(settings.engine, settings.funes_bin, settings.index_timeout_s)
    scheduler = IndexScheduler(client, job, settings.data_dir, settings.index_debounce_s, settings.index_lock_ttl_s,
                               settings.index_concurrency, settings.index_heavy_bytes)
    consumer = StreamConsumer(client, settings, Forgetter(client, settings, job))
    broker = build_broker(settings, consumer)
    storage = StorageProbe(client, settings.data_dir, settings.consumer)
    shared_dir = SharedDirWatch(client, settings.data_dir, register=True)
    await storage.check()
    http = uvicorn.Server(uvicorn.Config(_http_app(client, storage, shared_dir), host=settings.indexer_host, port=settings.indexer_port,
                                         http=bounded_read_protocol(settings), log_config=None, lifespan="off",
                                         timeout_graceful_shutdown=settings.stop_grace_s,
                                         timeout_keep_alive=settings.http_keep_alive_s))
    http.install_signal_handlers = lambda: None  # this process handles SIGTERM itself

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    await broker.start()
    # The start's scan of every tenant runs beside the rest: it opens each memory (~1 ms a tenant
    # warm), so at 100k tenants it outlasted the startup probe, which /healthz had to wait for.
    scan = [asyncio.create_task(_schedule_stale_tenants(client, settings.data_dir, job.embedder))] \
        if isinstance(job, EmbeddedIndexJob) else []
    tasks = [*scan, asyncio.create_task(scheduler.run_forever()), asyncio.create_task(_sample_stream(client, settings)),
             asyncio.create_task(RetentionSweeper(client, settings).run_forever()),
             asyncio.create_task(storage.run_forever()), asyncio.create_task(shared_dir.run_forever()),
             asyncio.create_task(reap_forever(client, settings.stream, settings.group, {settings.consumer, f"{settings.consumer}-reclaim"})),
             asyncio.create_task(http.serve())]
    watchdog = asyncio.create_task(_keep_consuming(broker, client, settings))
    log.info("indexer.started", consumer=settings.consumer, engine=settings.engine, stream=settings.stream)
    await stop.wait()
    log.info("indexer.stopping")
    await cancel_and_wait([watchdog])  # before the broker stops: its stopped subscribers are no fault then
    # The broker waits for in-flight handlers, and a handler may wait for room among the held
    # forgets, so those stop alongside: a running one gets a few seconds, then is cancelled (it
    # stays pending and is redelivered to another worker). The index runs stop alongside too, at
    # once taking no new user: stopped after the forgets, the scheduler went on starting runs
    # for up to their few seconds, each then given up in turn.
    await asyncio.gather(broker.stop(), consumer.forgets.stop(FINISH_ON_STOP_S), scheduler.stop())
    http.should_exit = True
    await cancel_and_wait(tasks[:-1])
    await asyncio.gather(tasks[-1], return_exceptions=True)
    # Whatever else still runs (the broker's readers, lock renewals) is cancelled here, not by
    # asyncio.run's single cancellation, which a lost one (shared/task_cancel.py) makes wait for good.
    left = await cancel_and_wait(asyncio.all_tasks() - {asyncio.current_task()})
    await client.aclose()
    if left:
        # asyncio.run would cancel them once more and wait for good: the process ends here
        # (what they held stays pending in the stream, or expires).
        log.warning("indexer.tasks_not_stopped", tasks=len(left))
        sys.stdout.flush()
        os._exit(0)
    log.info("indexer.stopped")
