"""The recall service through a real MCP client over HTTP, with real tokens and the real engine."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import psutil
import pytest

from shared.engine.native_threads import usable_cores
from shared.index_requests import DUE
from shared.recall_answer_format import (BUSY, EMPTY_QUERY, INDEXING, NO_MEMORY, NOTHING, STILL_INDEXING, UNAVAILABLE,
                                         looks_like_recall_answer, without_notes)
from shared.tenant_paths import user_hash
from tests.conftest import (call_recall, engine_cli, funes_status_chunks, indexed_chunks, mint, post_conversation,
                            recall_url, wait_until, write_conversation)

ALICE = ["What did we decide on the N-11 upgrade?", "Proceed once ticket MT-4471 for the K-2 machine is closed.", "ok"]
BOB = ["The P-7 motor on South has bearing noise.", "I opened ticket MT-5120 for the P-7 bearing noise.", "thanks"]


def metric_value(metrics: str, series: str) -> float:
    """The value of one exact series (name plus labels) in a Prometheus text page; fails if absent."""
    for line in metrics.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{series} is not in /metrics")


def engine_children(server) -> list[psutil.Process]:
    out = []
    for p in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and "mcp" in p.cmdline():
                out.append(p)
        except psutil.Error:
            continue  # exited while we looked
    return out


def chunks_of(env: dict[str, str], user: str) -> int:
    """Chunks in the user's memory, asked the way the engine in use answers (the stand-in funes
    keeps no chunks.sqlite3)."""
    if env.get("RECALL_ENGINE") == "funes" and env.get("RECALL_FUNES_BIN", engine_cli()) != engine_cli():
        return funes_status_chunks(env["RECALL_FUNES_BIN"], Path(env["RECALL_DATA_DIR"]) / user_hash(user) / "memory")
    return indexed_chunks(env, user)


@pytest.fixture(params=["embedded", "funes", "stand-in-funes"])
def stack(request, services, service_env):
    """ingest + indexer + recall service, with alice's and bob's conversations indexed.

    funes: the recall service drives `recall-engine mcp` children; stand-in-funes: indexer and
    service both drive tests/data/fake_funes.py, which keeps real funes' layout and outputs."""
    if request.param == "stand-in-funes":
        engine = {"RECALL_ENGINE": "funes", "RECALL_FUNES_BIN": request.getfixturevalue("fake_funes")}
        service_env.update(engine)
        services("indexer", **engine)
    else:
        engine = {"RECALL_ENGINE": request.param, "RECALL_FUNES_BIN": engine_cli()}
        services("indexer")
    services("ingest")
    server = services("serve", **engine)
    post_conversation(service_env, "alice", "a1", ALICE)
    post_conversation(service_env, "bob", "b1", BOB)
    assert wait_until(lambda: chunks_of(service_env, "alice") == 3 and chunks_of(service_env, "bob") == 3, 30)
    return service_env, server, request.param


async def test_tenants_never_see_each_others_memory(stack):
    env, _, _ = stack
    # Passages only: a note above them may repeat an identifier the query names.
    alice_sees = without_notes(await call_recall(env, mint("alice"), "P-7 motor bearing noise MT-5120"))
    assert "MT-5120" not in alice_sees and "P-7" not in alice_sees
    bob_sees = await call_recall(env, mint("bob"), "P-7 motor bearing noise MT-5120")
    assert "I opened ticket MT-5120 for the P-7 bearing noise." in bob_sees
    assert "MT-4471" not in bob_sees
    # The query cannot pick the tenant either.
    assert "MT-4471" not in without_notes(await call_recall(env, mint("bob"), "alice's N-11 upgrade MT-4471 user:alice"))


async def test_answers_are_dated_verbatim_passages_without_internal_ids(stack):
    env, _, mode = stack
    out = await call_recall(env, mint("alice"), "N-11 decision")
    assert "Proceed once ticket MT-4471 for the K-2 machine is closed." in out
    said_by = " (user|assistant)" if mode == "embedded" else ""  # funes' recall output does not say
    assert re.search(rf"^\[2026-10-08 10:0\d UTC\]{said_by}$", out, re.M), out
    assert "→ get" not in out and env["RECALL_DATA_DIR"] not in out and user_hash("alice") not in out
    cites = re.findall(r"^  cite: session_id=(\S+) turn_uuid=(\S+)$", out, re.M)
    assert len(cites) == out.count("---") and all(c == "a1" and t.startswith("a1-t") for c, t in cites), \
        "each passage names its conversation and turn, to be cited as provenance"
    assert all("a1-t" not in line for line in out.splitlines() if not line.startswith("  cite: ")), "ids only there"
    assert out.count("---") <= 3, "at most RECALL_K passages"


async def test_a_memory_with_nothing_indexed_yet_is_unavailable_not_nothing_relevant(tmp_path, embedder):
    """A user's first index run makes the memory before it commits a row: for those seconds the
    service answered "Nothing relevant found", which tells the agent something false."""
    from services.recall.embedded_backend import EmbeddedBackend
    from services.recall.server import RecallService
    from services.recall.settings import RecallSettings
    from shared.engine.index_run import index_tree
    from shared.engine.reembed import remove_deleted_sources
    from shared.tenant_paths import TenantPaths
    from tests.conftest import JWT_SECRET

    paths = TenantPaths.for_user(tmp_path, "alice")
    write_conversation(paths.src, "a1", ALICE)
    index_tree(paths.root, paths.src, embedder)
    (paths.src / "a1.funes.jsonl").unlink()
    remove_deleted_sources(paths.root, paths.src, embedder)  # a memory that holds no row
    settings = RecallSettings(data_dir=tmp_path, jwt_secret=JWT_SECRET)
    service = RecallService(settings, EmbeddedBackend(reader_cache=4, timeout_s=settings.timeout_s))
    assert await service.recall_for("alice", "MT-4471") == NO_MEMORY  # nothing stored either
    write_conversation(paths.src, "a2", ALICE)  # stored, its index run not committed yet
    assert await service.recall_for("alice", "MT-4471") == UNAVAILABLE
    index_tree(paths.root, paths.src, embedder)
    assert "MT-4471" in await service.recall_for("alice", "MT-4471")
    assert await service.recall_for("alice", "zebra crossing in the rain") == NOTHING


async def test_a_codename_comes_back_alone_but_a_question_naming_a_time_gets_that_times_conversations(tmp_path,
                                                                                                       embedder):
    """Only passages that hold a word of the question (or are as close as the floor's bar) are
    shown; a question naming a time wants that time's passages for their date, so they still
    fill its places."""
    from datetime import datetime, timedelta, timezone

    from services.recall.embedded_backend import EmbeddedBackend
    from services.recall.server import RecallService
    from services.recall.settings import RecallSettings
    from shared.engine.index_run import index_tree
    from shared.tenant_paths import TenantPaths
    from tests.conftest import JWT_SECRET

    recent_day = datetime.now(timezone.utc) - timedelta(days=2)
    recent = recent_day.strftime("%Y-%m-%d")
    paths = TenantPaths.for_user(tmp_path, "alice")
    write_conversation(paths.src, "vault", ["The vault migration got the codename tarnowick, budget 48k."], day=recent)
    write_conversation(paths.src, "pump", ["The pump seal on line two was replaced after the pressure test."], day=recent)
    write_conversation(paths.src, "trip", ["We booked the train to Vienna for the conference."], day="2025-05-02")
    index_tree(paths.root, paths.src, embedder)
    settings = RecallSettings(data_dir=tmp_path, jwt_secret=JWT_SECRET)
    service = RecallService(settings, EmbeddedBackend(reader_cache=4, timeout_s=settings.timeout_s))
    alone = await service.recall_for("alice", "tarnowick")
    assert "codename tarnowick" in alone and "pump seal" not in alone and "Vienna" not in alone
    dated = await service.recall_for("alice", "tarnowick in the last 7 days")
    assert "codename tarnowick" in dated and "pump seal" in dated, dated
    # A passage let in for its date is not shown when it is from another time (a newcomer's
    # "billing-stg-02 yesterday" got the staging turns and an unrelated one).
    other_day = await service.recall_for("alice", "tarnowick yesterday")
    assert other_day.startswith("(None of these passages is from ") and "codename tarnowick" in other_day, other_day
    assert "pump seal" not in other_day and "Vienna" not in other_day, other_day
    # The match is from another time: it is shown, said to be, and the time's passages that hold
    # no word of the question are not (a newcomer's "sourdough last week" got only those).
    elsewhere = await service.recall_for("alice", "Vienna train in the last 7 days")
    assert elsewhere.startswith("(None of these passages is from ") and "Vienna" in elsewhere, elsewhere
    assert "pump seal" not in elsewhere and "tarnowick" not in elsewhere, elsewhere
    # A question naming only a time shares no word with the memory: the floor refused it, and
    # what it asks for is the conversations of that time.
    for question, then, not_then in [("what did we discuss in the last 7 days", "pump seal", "Vienna"),
                                     ("last 7 days", "codename tarnowick", "Vienna"),
                                     ("what happened in May 2025", "Vienna", "pump seal"),
                                     ("о чём мы говорили за последние 7 дней", "pump seal", "Vienna"),
                                     (f"what did we discuss on {recent_day:%B} {recent_day.day}", "pump seal", "Vienna"),
                                     ("что обсуждали 2 мая 2025 года", "Vienna", "pump seal"),
                                     # everyday wording a newcomer's trial found refused
                                     ("remind me what we talked about recently", "pump seal", "Vienna"),
                                     ("напомни, что мы обсуждали на днях", "pump seal", "Vienna"),
                                     (f"what did we discuss on {recent_day:%A}", "pump seal", "Vienna"),
                                     ("what did we discuss two days ago", "pump seal", "Vienna")]:
        answer = await service.recall_for("alice", question)
        assert then in answer and not_then not in answer, (question, answer)
    assert await service.recall_for("alice", "banana bread in the last 7 days") == NOTHING
    # No conversation is from the time named: other times' passages are not what it asks.
    then = datetime.now(timezone.utc) - timedelta(days=40)
    empty = await service.recall_for("alice", f"what did we discuss in {then:%B %Y}")
    assert empty.startswith("No earlier conversation is from ") and looks_like_recall_answer(empty), empty
    long_ago = datetime.now(timezone.utc) - timedelta(days=100)
    empty = await service.recall_for("alice", f"what did we discuss on {long_ago:%B} {long_ago.day}")
    assert empty == f"No earlier conversation is from {long_ago:%Y-%m-%d}, the time the query names.", empty


def _autumn_service(tmp_path, embedder):
    """A recall service over alice's five conversations of October and November 2025."""
    from services.recall.embedded_backend import EmbeddedBackend
    from services.recall.server import RecallService
    from services.recall.settings import RecallSettings
    from shared.engine.index_run import index_tree
    from shared.tenant_paths import TenantPaths
    from tests.conftest import JWT_SECRET

    paths = TenantPaths.for_user(tmp_path, "alice")
    for day, text in [("2025-10-03", "Night shift handover for the K-2 machine."), ("2025-10-08", "N-11 upgrade decision."),
                      ("2025-10-12", "Base case forecast for the budget."), ("2025-10-20", "Lunch order for the offsite."),
                      ("2025-11-02", "November planning.")]:
        write_conversation(paths.src, f"c{day}", [text, "noted"], day=day)
    index_tree(paths.root, paths.src, embedder)
    settings = RecallSettings(data_dir=tmp_path, jwt_secret=JWT_SECRET)
    return RecallService(settings, EmbeddedBackend(reader_cache=4, timeout_s=settings.timeout_s))


async def test_a_time_with_more_conversations_than_places_says_how_many_the_answer_leaves_out(tmp_path, embedder):
    """A newcomer asked what was discussed in October: four conversations, three places, and
    nothing said that a fourth exists."""

    service = _autumn_service(tmp_path, embedder)
    october = await service.recall_for("alice", "what did we discuss in October 2025")
    assert october.splitlines()[0] == ("(These are 3 of the 4 conversations from 2025-10-01 to 2025-10-31, the most recent "
                                       "first; a question with a topic searches them all, and a shorter time (a week, a "
                                       "day) shows others.)"), october
    # An echo of the round-31 wording is still taken for a recall answer (ingest drops echoes).
    earlier = october.replace(", and a shorter time (a week, a day) shows others", "")
    assert looks_like_recall_answer(earlier), earlier
    assert "Lunch order" in october and "Night shift" not in october and looks_like_recall_answer(october)
    november = await service.recall_for("alice", "what did we discuss in November 2025")
    assert november.startswith("[2025-11-02 10:00 UTC] user\n") and "These are" not in november, november


async def test_last_time_or_no_time_without_a_topic_gets_the_latest_conversations(tmp_path, embedder):
    """"last time" is how the tool's own description says users refer to earlier work, and
    "what did we discuss last time" got "Nothing relevant found": no word of it is in a turn."""
    service = _autumn_service(tmp_path, embedder)
    for question in ("what did we discuss last time", "last time", "remind me what we talked about",
                     "о чём мы говорили в прошлый раз"):
        answer = await service.recall_for("alice", question)
        assert answer.startswith("(These are the 3 most recent of the 5 conversations; a question with a topic searches "
                                 "them all.)\n[2025-11-02 10:00 UTC] user\n"), (question, answer)
        assert "November planning" in answer and "Lunch order" in answer and "Night shift" not in answer, answer
        assert looks_like_recall_answer(answer)
    # With a topic, "last time" names no time: the topic is searched.
    topic = await service.recall_for("alice", "the K-2 machine handover last time")
    assert topic.startswith("[2025-10-03 10:00 UTC] user\n") and "Night shift handover" in topic.split("---")[0], topic


async def test_a_code_the_memory_never_held_is_named_above_the_passages_found_by_the_rest(tmp_path, embedder):

    service = _autumn_service(tmp_path, embedder)
    other = await service.recall_for("alice", "MX-4410 upgrade decision")
    assert other.splitlines()[0] == ("(None of these passages mentions MX-4410, which the query names; they are the "
                                     "closest matches to the rest of it.)") and "N-11 upgrade decision." in other, other
    assert looks_like_recall_answer(other)
    # Codes the ranking does not take for identifiers (one digit, lower case) are named too: a
    # newcomer's "K-3 machine" got the K-2 machine's turns with nothing saying they are K-2's.
    for query, code, found in [("K-3 machine handover", "K-3", "K-2 machine"), ("night-shift-04 handover", "night-shift-04", "K-2")]:
        answer = await service.recall_for("alice", query)
        assert answer.startswith(f"(None of these passages mentions {code}, which") and found in answer, answer
    assert (await service.recall_for("alice", "K-2 machine handover")).startswith("[2025-10-03 10:00 UTC] user\n")
    assert (await service.recall_for("alice", "N-11 upgrade decision")).startswith("[2025-10-08 10:00 UTC] user\n")


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
async def test_awkward_queries(stack):
    env, _, _ = stack
    token = mint("alice")
    assert "MT-4471" in await call_recall(env, token, "-k 100 MT-4471")  # searched as text, never a flag
    assert "MT-4471" in await call_recall(env, token, "--candidates 9999 MT-4471")
    long = await call_recall(env, token, "N-11 " + "x" * 10_000)
    assert long != UNAVAILABLE and len(long) <= 4000
    assert await call_recall(env, token, "") == EMPTY_QUERY
    assert await call_recall(env, token, "   \n\t ") == EMPTY_QUERY
    assert await call_recall(env, token, "\x00\x01\x1b \u200b\u2060") == EMPTY_QUERY  # control and format characters alone
    for q in ("MT-4471?", "(N-11)", "'K-2'", '"MT-4471"', "MT-4471:", "N-11,MT-4471"):
        assert "MT-4471" in await call_recall(env, token, q), q
    for q in ("MT-4471 what happened on 9999-12-31", "MT-4471 meeting in March 0000"):  # no MCP error
        assert "MT-4471" in await call_recall(env, token, q), q


async def test_no_memory_and_nothing_relevant(stack):
    env, server, engine = stack
    assert await call_recall(env, mint("carol"), "anything at all") == NO_MEMORY
    # A memory that exists but holds nothing (its only conversation was removed).
    from shared.engine.embedder import shared_embedder
    from shared.engine.index_run import index_tree
    from shared.tenant_paths import TenantPaths

    paths = TenantPaths.for_user(Path(env["RECALL_DATA_DIR"]), "dora")
    paths.src.mkdir(parents=True)
    if engine == "stand-in-funes":
        subprocess.run([env["RECALL_FUNES_BIN"], "index", "--yes", str(paths.src)], check=True,
                       env={**os.environ, "FUNES_HOME": str(paths.root)})
    else:
        index_tree(paths.root, paths.src, shared_embedder())
    # The embedded engine knows the memory holds no row, and nothing is stored: no memory. funes
    # says nothing of its row count on the read path, so its empty top k is "nothing relevant".
    assert await call_recall(env, mint("dora"), "N-11") == (NO_MEMORY if engine == "embedded" else NOTHING)



@pytest.mark.parametrize("stack", ["embedded", "funes"], indirect=True)  # funes itself has no floor: it answers passages
async def test_an_answer_of_nothing_says_so_while_the_users_index_run_is_due(stack, r):
    """A 25 KB paste took 35 s to index, and meanwhile its questions got a confident "Nothing
    relevant found": the conversations not yet searched are named in a note."""
    env, _, engine = stack
    token = mint("alice")
    assert await call_recall(env, token, "tulip bulbs for the balcony") == NOTHING
    r.zadd(DUE, {user_hash("alice"): time.time() + 3600})  # as the indexer marks a user whose snapshot it wrote
    answer = await call_recall(env, token, "tulip bulbs for the balcony")
    assert answer == f"{NOTHING}\n{STILL_INDEXING}" and looks_like_recall_answer(answer), answer
    then = await call_recall(env, token, "what did we discuss on 2026-01-05")
    nothing_then = "No earlier conversation is from 2026-01-05, the time the query names."  # funes lists no time's turns
    assert then == f"{nothing_then if engine == 'embedded' else NOTHING}\n{STILL_INDEXING}", then
    assert "still being indexed" not in await call_recall(env, token, "N-11 upgrade"), "an answer with passages has no note"
    r.zrem(DUE, user_hash("alice"))
    assert await call_recall(env, token, "tulip bulbs for the balcony") == NOTHING


async def test_conversations_without_a_word_to_index_are_nothing_relevant_not_unavailable_for_good(stack):
    """A new user whose only conversation holds blank turns (or only recall echoes) was told
    "unavailable" on every call: the memory had indexed it and held no row, which read as a
    first index run still under way."""
    env, _, _ = stack
    post_conversation(env, "hank", "h1", ["   ", "\n"])
    token, deadline = mint("hank"), time.monotonic() + 60
    while (answer := await call_recall(env, token, "kafka consumer lag")) in (UNAVAILABLE, INDEXING) and \
            time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    assert answer == NOTHING


@pytest.mark.parametrize("stack", ["funes"], indirect=True)
async def test_engine_child_killed_mid_call_then_recovers(stack):
    env, server, _ = stack
    token = mint("alice")
    assert "MT-4471" in await call_recall(env, token, "MT-4471")
    [child] = engine_children(server)
    child.send_signal(signal.SIGSTOP)  # freeze it so the next call is surely in flight
    call = asyncio.create_task(call_recall(env, token, "MT-4471"))
    await asyncio.sleep(0.5)
    child.send_signal(signal.SIGKILL)
    assert await call == UNAVAILABLE
    assert "MT-4471" in await call_recall(env, token, "MT-4471"), "the next call spawns a fresh child"
    metrics = httpx.get(f"{recall_url(env)}/metrics").text
    assert 'recall_pool_crash_restarts_total{reason="crash"} 1.0' in metrics


async def test_timeout_degrades_softly_then_recovers(services, service_env):
    services("ingest")
    services("indexer")
    server = services("serve", RECALL_ENGINE="funes", RECALL_FUNES_BIN=engine_cli(), RECALL_TIMEOUT_S="1")
    post_conversation(service_env, "alice", "a1", ALICE)
    assert wait_until(lambda: indexed_chunks(service_env, "alice") == 3, 30)
    token = mint("alice")
    assert "MT-4471" in await call_recall(service_env, token, "MT-4471")
    [child] = engine_children(server)
    child.send_signal(signal.SIGSTOP)  # a hung engine
    assert await call_recall(service_env, token, "MT-4471") == UNAVAILABLE
    assert wait_until(lambda: not child.is_running() or child.status() == psutil.STATUS_ZOMBIE, 5), "the hung child is killed"
    assert "MT-4471" in await call_recall(service_env, token, "MT-4471")
    assert 'recall_pool_crash_restarts_total{reason="timeout"} 1.0' in httpx.get(f"{recall_url(service_env)}/metrics").text


async def test_a_saturated_replica_answers_busy_softly_and_counts_it(services, service_env):
    services("ingest")
    services("indexer")
    server = services("serve", RECALL_ENGINE="funes", RECALL_FUNES_BIN=engine_cli(), RECALL_TIMEOUT_S="7",
                      RECALL_MAX_CONCURRENCY="1", RECALL_QUEUE_MAX="1", RECALL_QUEUE_WAIT_S="3")
    post_conversation(service_env, "alice", "a1", ALICE)
    assert wait_until(lambda: indexed_chunks(service_env, "alice") == 3, 30)
    token = mint("alice")
    assert "MT-4471" in await call_recall(service_env, token, "MT-4471")
    [child] = engine_children(server)
    child.send_signal(signal.SIGSTOP)  # a hung engine holds the only slot
    def gauge(name: str) -> float:
        return metric_value(httpx.get(f"{recall_url(service_env)}/metrics").text, name)

    hung = asyncio.create_task(call_recall(service_env, token, "MT-4471"))
    assert await asyncio.to_thread(wait_until, lambda: gauge("recall_in_flight") == 1, 10)
    queued = asyncio.create_task(call_recall(service_env, token, "K-2"))  # waits its 3 s for the slot
    assert await asyncio.to_thread(wait_until, lambda: gauge("recall_queued") == 1, 3)
    started = asyncio.get_running_loop().time()
    assert await call_recall(service_env, token, "N-11") == BUSY, "the queue is full: busy at once"
    # Less than a queue wait of its own; with a 1 s wait, a busy machine's call took that long without one.
    assert asyncio.get_running_loop().time() - started < 3.0
    assert await queued == BUSY, "no slot within RECALL_QUEUE_WAIT_S: busy, not an MCP error"
    assert await hung == UNAVAILABLE
    assert "MT-4471" in await call_recall(service_env, token, "MT-4471"), "the freed slot serves the next call"
    metrics = httpx.get(f"{recall_url(service_env)}/metrics").text
    assert metric_value(metrics, 'recall_busy_total{reason="queue_full"}') == 1
    assert metric_value(metrics, 'recall_busy_total{reason="queue_timeout"}') == 1
    assert metric_value(metrics, 'recall_tool_latency_seconds_count{outcome="busy"}') == 2
    assert metric_value(metrics, "recall_in_flight") == 0


async def test_a_timed_out_embedded_search_stops_instead_of_running_on(tmp_path, embedder):
    from services.recall.backend import BackendOverloaded
    from services.recall.embedded_backend import EmbeddedBackend
    from shared.engine.index_run import index_tree
    from shared.tenant_paths import TenantPaths

    paths = TenantPaths.for_user(tmp_path, "alice")
    write_conversation(paths.src, "a1", ALICE)
    index_tree(paths.root, paths.src, embedder)
    backend = EmbeddedBackend(reader_cache=4, timeout_s=0.3)

    async def found() -> bool:
        return any("MT-4471" in hit.text for hit in await backend.recall(paths, "MT-4471", 3, 8))

    assert await found()
    reader = backend.engine.reader(paths.memory)
    searched: list[float] = []
    filter_mask = reader.filter_mask
    reader.filter_mask = lambda *a: (searched.append(time.monotonic()), filter_mask(*a))[1]  # counts searches that ran
    reader._refresh_lock.acquire()  # a long catch-up of the same memory holds the next search back
    try:
        call = asyncio.create_task(backend.recall(paths, "MT-4471", 3, 8))
        await asyncio.sleep(0.8)  # the queued search's deadline passes meanwhile
    finally:
        reader._refresh_lock.release()
    with pytest.raises(BackendOverloaded, match="timed out"):
        await call
    await asyncio.sleep(0.5)  # time for a search that ignored its deadline to run on
    assert searched == [], "the timed-out search gave its worker back instead of searching"
    assert await found()
    assert len(searched) == 1


async def test_an_embedded_search_past_its_deadline_answers_busy_not_unavailable(tmp_path, embedder):
    """A loaded replica that runs out of time has a healthy memory: 'unavailable' would be false."""
    from prometheus_client import REGISTRY

    from services.recall.embedded_backend import EmbeddedBackend
    from services.recall.server import RecallService
    from services.recall.settings import RecallSettings
    from shared.engine.index_run import index_tree
    from shared.tenant_paths import TenantPaths
    from tests.conftest import JWT_SECRET

    paths = TenantPaths.for_user(tmp_path, "alice")
    write_conversation(paths.src, "a1", ALICE)
    index_tree(paths.root, paths.src, embedder)
    settings = RecallSettings(data_dir=tmp_path, jwt_secret=JWT_SECRET, timeout_s=0.3)
    service = RecallService(settings, EmbeddedBackend(reader_cache=4, timeout_s=settings.timeout_s))
    assert "MT-4471" in await service.recall_for("alice", "MT-4471")
    counted = lambda: REGISTRY.get_sample_value("recall_busy_total", {"reason": "search_deadline"})  # noqa: E731
    before = counted()
    reader = service.backend.engine.reader(paths.memory)
    reader._refresh_lock.acquire()  # a long catch-up of the same memory holds the search past its deadline
    try:
        call = asyncio.create_task(service.recall_for("alice", "MT-4471"))
        await asyncio.sleep(0.8)
    finally:
        reader._refresh_lock.release()
    assert await call == BUSY
    assert counted() == before + 1
    assert "MT-4471" in await service.recall_for("alice", "MT-4471")


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
async def test_corrupt_memory_is_unavailable_not_an_error(stack):
    env, _, _ = stack
    db = __import__("pathlib").Path(env["RECALL_DATA_DIR"]) / user_hash("bob") / "memory" / "chunks.sqlite3"
    for suffix in ("-wal", "-shm"):
        if os.path.exists(f"{db}{suffix}"):
            os.unlink(f"{db}{suffix}")
    db.write_bytes(b"this is not a database" * 100)
    assert await call_recall(env, mint("bob"), "P-7") == UNAVAILABLE


async def test_an_embedded_replica_closes_memories_idle_past_the_pool_limit_and_reopens_them(services, service_env):
    services("ingest")
    services("indexer")
    services("serve", RECALL_ENGINE="embedded", RECALL_POOL_IDLE_S="1")
    post_conversation(service_env, "alice", "a1", ALICE)
    assert wait_until(lambda: indexed_chunks(service_env, "alice") == 3, 30)
    assert "MT-4471" in await call_recall(service_env, mint("alice"), "N-11 upgrade")

    def metrics() -> str:
        return httpx.get(f"{recall_url(service_env)}/metrics").text

    assert wait_until(lambda: metric_value(metrics(), 'recall_pool_evictions_total{reason="idle"}') >= 1, 15)
    assert metric_value(metrics(), "recall_pool_processes") == 0
    assert "MT-4471" in await call_recall(service_env, mint("alice"), "N-11 upgrade"), "reopened on the next call"


async def test_pool_cap_lru_eviction_and_crash_restart(services, service_env):
    services("ingest")
    services("indexer")
    server = services("serve", RECALL_ENGINE="funes", RECALL_FUNES_BIN=engine_cli(), RECALL_POOL_MAX_PROCESSES="2")
    users = ["u1", "u2", "u3"]
    for u in users:
        post_conversation(service_env, u, "c", [f"{u} owns ticket MT-{100 + users.index(u)}."])
    assert wait_until(lambda: all(indexed_chunks(service_env, u) == 1 for u in users), 30)
    for u in users:
        assert f"{u} owns" in await call_recall(service_env, mint(u), "ticket owner")
        assert len(engine_children(server)) <= 2
    metrics = httpx.get(f"{recall_url(service_env)}/metrics").text
    assert 'recall_pool_evictions_total{reason="lru"} 1.0' in metrics and "recall_pool_processes 2.0" in metrics
    # u1 was least recently used: it was evicted; u2 and u3 still have their children.
    survivors = {p.pid: p for p in engine_children(server)}
    assert len(survivors) == 2
    for p in survivors.values():
        p.kill()
    assert wait_until(lambda: not engine_children(server), 5), "both children are gone"
    crashes_before = metric_value(httpx.get(f"{recall_url(service_env)}/metrics").text,
                                  'recall_pool_crash_restarts_total{reason="crash"}')
    assert "u3 owns" in await call_recall(service_env, mint("u3"), "ticket owner"), "a crashed child is replaced"
    metrics = httpx.get(f"{recall_url(service_env)}/metrics").text
    assert metric_value(metrics, 'recall_pool_crash_restarts_total{reason="crash"}') == crashes_before + 1
    assert metric_value(metrics, "recall_pool_spawns_total") == 4, "u1, u2, u3, then u3's replacement"
    assert len(engine_children(server)) == 1


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
async def test_a_tokens_zoneinfo_decides_whose_day_a_date_names_and_how_dates_are_shown(stack):
    """alice's turns are at 10:00 UTC on 8 October: midnight of the 9th at UTC+14."""
    env, _, _ = stack
    utc = await call_recall(env, mint("alice"), "what did we discuss on 2026-10-08")
    assert "[2026-10-08 10:00 UTC] user\n" in utc, utc
    kiritimati = mint("alice", zoneinfo="Pacific/Kiritimati")
    assert await call_recall(env, kiritimati, "what did we discuss on 2026-10-08") == \
        "No earlier conversation is from 2026-10-08, the time the query names."
    local = await call_recall(env, kiritimati, "what did we discuss on 2026-10-09")
    assert "[2026-10-09 00:00 UTC+14:00] user\n" in local and looks_like_recall_answer(local), local
    # A zone no IANA name names is not the user's fault: their day is the default's.
    assert await call_recall(env, mint("alice", zoneinfo="../../etc/passwd"), "what did we discuss on 2026-10-08") == utc


async def test_a_new_conversation_is_found_on_the_next_call_after_indexing(stack):
    env, _, _ = stack
    token = mint("alice")
    assert "Z-991" not in without_notes(await call_recall(env, token, "Z-991 valve"))
    post_conversation(env, "alice", "a2", ["The Z-991 valve was replaced on Friday.", "noted"], day="2026-10-20")
    assert wait_until(lambda: chunks_of(env, "alice") == 5, 30)
    assert "The Z-991 valve was replaced on Friday." in await call_recall(env, token, "Z-991 valve")


def _initialize(env, headers: dict) -> httpx.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    return httpx.post(f"{recall_url(env)}/mcp", json=body,
                      headers={"Accept": "application/json, text/event-stream", **headers}, timeout=10)


def test_missing_forged_expired_and_wrong_audience_tokens_get_401_and_the_logs_name_no_user(services, service_env):
    # fastmcp's own logging on, as in production (the tests' environment turns it off): it logs a
    # refused token's subject, in plain text on stderr.
    proc = services("serve", RECALL_JWT_AUDIENCE="recall-mcp", RECALL_JWT_ISSUER="recall-dev", FASTMCP_LOG_ENABLED="true")
    good = mint("alice@example.com", aud="recall-mcp")
    assert _initialize(service_env, {"Authorization": f"Bearer {good}"}).status_code == 200
    for bad in (None, "Bearer", "Bearer not-a-jwt", f"Bearer {mint('alice@example.com', secret='x' * 40, aud='recall-mcp')}",
                f"Bearer {mint('alice@example.com', ttl=-120, aud='recall-mcp')}",
                f"Bearer {mint('alice@example.com', aud='someone-else')}",
                f"Bearer {mint('alice@example.com', aud='recall-mcp', iss='evil')}"):
        headers = {"Authorization": bad} if bad else {}
        refused = _initialize(service_env, headers)
        assert refused.status_code == 401, bad
        if bad and bad != "Bearer":  # a token that fails verification: what is wrong and what to do
            assert refused.json()["error"] == "invalid_token" and "recall token" in refused.json()["error_description"]
            assert "re-register" not in refused.text and "recall token" in refused.headers["www-authenticate"]
    lines = [line for line in proc.output().splitlines() if line.strip()]
    assert "alice@example.com" not in proc.output()
    events = [json.loads(line) for line in lines]  # every line is one JSON object
    refused = [e["event"] for e in events if e["event"].startswith("Bearer token rejected")]
    assert len(refused) == 2 and all(user_hash("alice@example.com") in e for e in refused), refused
    # Counted and logged for the operator (a replica with another secret refused every call
    # with nothing in its logs or metrics): one token.rejected line per reason and 10 s.
    metrics = httpx.get(f"{recall_url(service_env)}/metrics").text
    invalid = metric_value(metrics, 'recall_tokens_rejected_total{reason="invalid"}')
    assert invalid >= 5 and invalid + metric_value(metrics, 'recall_tokens_rejected_total{reason="missing"}') == 7, metrics
    logged = [e for e in events if e["event"] == "token.rejected"]
    assert sorted(e["reason"] for e in logged) == ["invalid", "missing"] and logged[0]["requests"] == 1, logged


def test_two_authorization_headers_are_refused_not_read_first_wins(services, service_env):
    """The verifier read the first of two: a proxy appending its own header decided who called."""
    services("serve")
    good = mint("alice@example.com")
    for pair in ([good, "not-a-jwt"], ["not-a-jwt", good], [good, good]):
        refused = httpx.post(f"{recall_url(service_env)}/mcp", timeout=10,
                             headers=[("Accept", "application/json, text/event-stream"),
                                      *(("Authorization", f"Bearer {t}") for t in pair)],
                             json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert refused.status_code == 400 and refused.json()["error"] == "invalid_request", refused.text


def _signed(claims: dict) -> str:
    """An HS256 token signed by hand: JSON as Python writes it (Infinity, NaN, lone surrogates
    escaped as \\ud800), which a JWT library refuses to produce."""
    import base64
    import hashlib
    import hmac

    from tests.conftest import JWT_SECRET

    part = lambda obj: base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()  # noqa: E731
    signing_input = f"{part({'alg': 'HS256', 'typ': 'JWT'})}.{part({k: v for k, v in claims.items() if v is not None})}"
    signature = hmac.new(JWT_SECRET.encode(), signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


def test_tokens_without_exp_beyond_the_lifetime_cap_or_without_a_user_get_401(services, service_env):
    services("serve", RECALL_MAX_TOKEN_LIFETIME_S="3600")
    now = int(time.time())
    base = {"sub": "alice", "iat": now, "exp": now + 600, "iss": "recall-dev"}
    assert _initialize(service_env, {"Authorization": f"Bearer {_signed(base)}"}).status_code == 200
    for name, claims in {"no exp": {**base, "exp": None}, "exp not a number": {**base, "exp": "never"},
                         "exp past the cap": {**base, "exp": now + 2 * 3600, "iat": None},
                         "exp - iat past the cap": {**base, "iat": now - 3600, "exp": now + 600},
                         "no sub": {**base, "sub": None}, "empty sub": {**base, "sub": ""},
                         "blank sub": {**base, "sub": "   "}, "sub not a string": {**base, "sub": 42},
                         # Not text: the error handler itself failed hashing a lone surrogate (a 500).
                         "sub a lone surrogate": {**base, "sub": "\ud800"}, "sub with a NUL": {**base, "sub": "al\x00ice"},
                         # JSON as Python reads it allows Infinity and NaN: an infinite exp was a 500
                         # (fastmcp's int(exp)), an infinite or NaN iat passed the lifetime check.
                         "exp infinite": {**base, "exp": float("inf")}, "iat infinite": {**base, "iat": float("inf")},
                         "iat not a number": {**base, "iat": float("nan")},
                         # An integer too large for a float (math.isfinite raised OverflowError: a 500).
                         "iat of 400 digits": {**base, "iat": -10**400},
                         # Issued 50 minutes from now (a newcomer's trial found it accepted).
                         "iat in the future": {**base, "iat": now + 3000, "exp": now + 3300}}.items():
        headers = {"Authorization": f"Bearer {_signed(claims)}"}
        assert _initialize(service_env, headers).status_code == 401, name


async def test_a_real_mcp_client_with_a_token_naming_no_user_is_refused_with_401(services, service_env):
    import httpx2
    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth
    from fastmcp.client.transports import StreamableHttpTransport

    services("serve")
    now = int(time.time())
    statuses: list[int] = []

    async def record(response) -> None:
        statuses.append(response.status_code)

    def recording_client(**kwargs):
        kwargs.setdefault("timeout", httpx2.Timeout(30.0, read=60.0))
        return httpx2.AsyncClient(event_hooks={"response": [record]}, **kwargs)

    sub_less = _signed({"iat": now, "exp": now + 600, "iss": "recall-dev"})
    transport = StreamableHttpTransport(f"{recall_url(service_env)}/mcp", auth=BearerAuth(sub_less),
                                        httpx_client_factory=recording_client)
    with pytest.raises(Exception):
        async with Client(transport) as client:
            await client.call_tool("recall_my_conversations", {"query": "N-11"})
    assert statuses and set(statuses) == {401}, statuses
    assert await call_recall(service_env, mint("carol"), "N-11") == NO_MEMORY


async def test_probes_and_latency_metrics_by_outcome(stack):
    env, _, _ = stack
    await call_recall(env, mint("alice"), "N-11")
    await call_recall(env, mint("nobody"), "N-11")
    assert httpx.get(f"{recall_url(env)}/readyz").status_code == 200
    metrics = httpx.get(f"{recall_url(env)}/metrics").text
    assert 'recall_tool_latency_seconds_count{outcome="hit"} 1.0' in metrics
    assert 'recall_tool_latency_seconds_count{outcome="no_memory"} 1.0' in metrics
    assert f"recall_concurrency_limit {float(usable_cores())}" in metrics  # by default, the cores it may use


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
async def test_time_words_prefer_passages_from_that_window(stack):
    from datetime import datetime, timedelta, timezone

    env, _, _ = stack
    now = datetime.now(timezone.utc)
    last_week = now - timedelta(days=now.weekday() + 4)  # Thursday of the previous calendar week
    long_ago = now - timedelta(days=75)
    post_conversation(env, "alice", "plan-old", ["N-11 upgrade plan: budget 40k, start in spring."], day=long_ago.strftime("%Y-%m-%d"))
    post_conversation(env, "alice", "plan-new", ["N-11 upgrade plan revised: budget 55k, start in January."],
                      day=last_week.strftime("%Y-%m-%d"))
    assert wait_until(lambda: indexed_chunks(env, "alice") == 5, 30)
    token = mint("alice")
    recent = await call_recall(env, token, "N-11 upgrade plan budget last week")
    assert "55k" in recent.split("---")[0], recent
    month = long_ago.strftime("%B %Y")
    older = await call_recall(env, token, f"N-11 upgrade plan budget {month}")
    assert "40k" in older.split("---")[0], f"{month}: {older}"
    # A day still to come names no window: its words are searched, and the answer says none can be from it.
    coming = (now + timedelta(days=10)).strftime("%Y-%m-%d")
    planned = await call_recall(env, token, f"N-11 upgrade plan budget for {coming}")
    assert planned.startswith(f"(The time the query names, {coming}, has not come yet;") and "N-11" in planned, planned


@pytest.mark.parametrize("stack", ["embedded"], indirect=True)
async def test_recall_token_cli_mints_a_token_the_service_accepts(stack):
    import subprocess

    from tests.conftest import BIN

    env, _, _ = stack
    minted = subprocess.run([str(BIN / "recall"), "token", "--user", "alice"], env=env, capture_output=True, text=True, timeout=60)
    assert minted.returncode == 0, minted.stderr
    assert "MT-4471" in await call_recall(env, minted.stdout.strip(), "MT-4471")


async def test_both_backends_give_the_agent_identical_answers_but_for_who_said_each_passage(services, service_env):
    """Byte for byte, once the role the embedded engine puts after each passage's date is taken
    out: funes' recall output does not say who said a hit."""
    from shared.child_process import free_port

    awkward = ["Plan for N-12:\r\nstep one, order parts.\nstep two --- install.",
               "Line one of the reply\nline two\n---\nline four: MT-7781 stays open.", "ok\nthanks"]
    services("ingest")
    services("indexer")
    services("serve", RECALL_ENGINE="embedded")
    funes_env = {**service_env, "RECALL_RECALL_PORT": str(free_port())}
    services("serve", RECALL_ENGINE="funes", RECALL_FUNES_BIN=engine_cli(), RECALL_RECALL_PORT=funes_env["RECALL_RECALL_PORT"])
    post_conversation(service_env, "carol", "c1", awkward)
    post_conversation(service_env, "carol", "c2", BOB)
    assert wait_until(lambda: indexed_chunks(service_env, "carol") == 6, 30)
    token = mint("carol")
    for query in ("N-12 plan", "MT-7781", "step two install", "P-7 bearing noise", "zebra crossing"):
        embedded = await call_recall(service_env, token, query)
        dated = re.findall(r"^\[[^\]\n]+ UTC\](.*)$", embedded, re.M)
        assert all(said in (" user", " assistant") for said in dated), embedded
        assert re.sub(r"^(\[[^\]\n]+ UTC\]) (user|assistant)$", r"\1", embedded, flags=re.M) == \
            await call_recall(funes_env, token, query), query
    assert "line two\n---\nline four" in await call_recall(service_env, token, "MT-7781")
    metrics = httpx.get(f"{recall_url(service_env)}/metrics", timeout=10).text
    threads = re.search(r"^process_threads (\d+)", metrics, re.M)
    fds = re.search(r"^process_open_fds (\d+)", metrics, re.M)
    assert threads and int(threads[1]) > 1 and fds and int(fds[1]) > 3, "threads and fds are exported"


def cpu_seconds(proc: psutil.Process) -> dict[int, float]:
    """CPU time of a process and of each of its live children (a funes pool's engine children), by pid."""
    out = {}
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            continue  # exited while we looked
    return out


@pytest.mark.parametrize("engine", ["embedded", "funes"])
async def test_an_idle_recall_service_spends_no_cpu_even_with_a_query_thread_team(services, service_env, engine):
    """Between real calls the service and its engine children sleep: no BLAS, OpenMP or
    onnxruntime pool spins and no housekeeping loop (pool sweeper, forget listener, Redis
    reconnects) polls, even with two threads per query and OpenMP told to spin, as an
    operator's environment might say. (tests/test_embedder.py shows a spinning pool beside it.)"""
    spin = {"RECALL_ENGINE": engine, "RECALL_FUNES_BIN": engine_cli(), "RECALL_EMBED_THREADS": "2",
            "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "infinite"}
    services("indexer")
    services("ingest")
    server = services("serve", **spin)
    post_conversation(service_env, "alice", "a1", ALICE)
    assert wait_until(lambda: indexed_chunks(service_env, "alice") == 3, 30)
    proc = psutil.Process(server.proc.pid)
    idle = []
    for query in ("N-11 upgrade", "what did we decide about the K-2 machine", "xyzzy plugh"):
        await call_recall(service_env, mint("alice"), query)
        # Measured right after each call: a spinning pool burns CPU in the gaps between calls
        # before it gives up and sleeps (onnxruntime's and OpenBLAS's do, for a while). The
        # median of three windows, so one stray tick of housekeeping cannot fail the test.
        before = cpu_seconds(proc)
        time.sleep(1.0)
        after = cpu_seconds(proc)
        idle.append(sum(after[pid] - before[pid] for pid in before.keys() & after.keys()))
    assert sorted(idle)[1] < 0.02, f"{idle} s of CPU in the idle second after each call ({engine}): a thread pool spins"


async def test_a_replica_told_to_stop_answers_every_call_it_had_admitted(services, service_env):
    """One search at a time, twelve calls in flight, SIGTERM: each SSE stream was ended at once
    ("peer closed connection without sending complete message body"), as on every rolling update."""
    services("ingest"), services("indexer")
    post_conversation(service_env, "una", "c1", ["The pump P-101 seal was replaced by Priya on Tuesday.", "noted"])
    assert wait_until(lambda: indexed_chunks(service_env, "una") == 2, 30)
    serve = services("serve", RECALL_MAX_CONCURRENCY="1", RECALL_QUEUE_WAIT_S="20")
    headers = {"accept": "application/json, text/event-stream", "authorization": f"Bearer {mint('una')}"}
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "recall_my_conversations", "arguments": {"query": "who replaced the pump P-101 seal"}}}
    async with httpx.AsyncClient(base_url=recall_url(service_env), headers=headers, timeout=60) as client:
        calls = [asyncio.create_task(client.post("/mcp", json=call)) for _ in range(12)]
        # SIGTERM once all twelve reached the replica (on a loaded machine some took over 0.15 s to connect).
        for _ in range(500):
            if _admitted((await client.get("/metrics")).text) >= 12:
                break
            await asyncio.sleep(0.01)
        serve.proc.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*calls, return_exceptions=True)
    assert all(isinstance(a, httpx.Response) and a.status_code == 200 for a in answers), answers
    assert all("Priya" in a.json()["result"]["content"][0]["text"] for a in answers)
    assert serve.proc.wait(30) == 0, "a stop as asked exits 0 (uvicorn re-raised the signal: -15)"
    data = Path(service_env["RECALL_DATA_DIR"])
    assert (data / "artifacts.sqlite3").exists() and not (data / "artifacts.sqlite3-wal").exists(), \
        "the artifact database's connections are closed at the stop, so SQLite folds its WAL back in"


def _admitted(metrics: str) -> float:
    """Recalls this replica has taken in: waiting for a slot, searching, or answered."""
    total = 0.0
    for line in metrics.splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in ("recall_queued", "recall_in_flight", "recall_tool_latency_seconds_count"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_an_unknown_path_or_method_is_a_json_error_naming_where_things_are(services, service_env):
    services("serve")
    missing = httpx.get(f"{recall_url(service_env)}/nonexistent", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found" and "/mcp" in missing.json()["detail"]
    wrong = httpx.post(f"{recall_url(service_env)}/healthz", timeout=10)
    assert wrong.status_code == 405 and wrong.json()["error"] == "method_not_allowed" and "GET" in wrong.headers["allow"]
    assert httpx.get(f"{recall_url(service_env)}/healthz", timeout=10).json() == {"status": "ok"}


def test_the_shared_data_dir_is_named_again_after_redis_lost_it_and_a_replica_on_another_turns_unready(
        services, service_env, r):
    """An SRE's re-check: after a FLUSHALL no indexer named the deployment's directory again, so
    one on a mistyped path started, named its own, and locked the right ones out at their
    restart; a replica started before any indexer had nothing to compare with and stayed ready
    on the wrong directory."""
    from shared.data_dir_identity import KEY, local_id

    import secrets

    from shared import user_hash_scheme

    key = secrets.token_urlsafe(32)
    indexer = services("indexer", RECALL_USER_HASH_KEY=key)
    shared = local_id(Path(service_env["RECALL_DATA_DIR"]))
    assert r.get(KEY) == shared and r.get(user_hash_scheme.KEY) == user_hash_scheme.scheme(key)
    r.flushall()
    assert wait_until(lambda: r.get(KEY) == shared, 30), "a running indexer names its directory again"
    assert r.get(user_hash_scheme.KEY) == user_hash_scheme.scheme(key), "and its user hash scheme, before an ingest " \
        "with another key records its own"

    indexer.terminate(timeout=30)
    elsewhere = Path(service_env["RECALL_DATA_DIR"]).parent / "elsewhere"
    elsewhere.mkdir()
    r.delete(KEY, user_hash_scheme.KEY)  # a fresh deployment: the replica starts before any indexer
    services("serve", RECALL_DATA_DIR=str(elsewhere))
    assert httpx.get(f"{recall_url(service_env)}/readyz").status_code == 200
    r.set(KEY, shared)  # the first indexer, on the shared volume
    ready = lambda: httpx.get(f"{recall_url(service_env)}/readyz")  # noqa: E731
    assert wait_until(lambda: ready().status_code == 503, 30)
    assert ready().json()["status"].startswith(f"RECALL_DATA_DIR={elsewhere} is not the data directory"), ready().text


async def test_a_new_users_calls_before_the_first_index_run_say_it_is_indexing_not_unavailable(services, service_env, r):
    """An integrator's new user heard "unavailable right now; continue without it" for the
    seconds before the first index run ended, which tells an agent to give up on its memory, and
    the soft-failure alert counted them (an SRE's trial)."""
    from shared.tenant_paths import TenantPaths

    services("serve")
    # Stored as the indexer stores a snapshot, before its index run (no indexer runs here).
    write_conversation(TenantPaths.for_user(Path(service_env["RECALL_DATA_DIR"]), "nina").src, "n1",
                       ["The K-9 pump needs a new seal.", "Ordered."])
    r.delete(DUE)
    token = mint("nina")
    assert await call_recall(service_env, token, "K-9 pump") == UNAVAILABLE, "no indexer has it due: memory is missing"
    r.zadd(DUE, {user_hash("nina"): time.time() + 3600})  # as the indexer marks a user whose snapshot it wrote
    answer = await call_recall(service_env, token, "K-9 pump")
    assert answer == INDEXING and looks_like_recall_answer(answer), answer
    metrics = httpx.get(f"{recall_url(service_env)}/metrics").text
    assert metric_value(metrics, 'recall_tool_latency_seconds_count{outcome="indexing"}') == 1
    assert metric_value(metrics, 'recall_tool_latency_seconds_count{outcome="unavailable"}') == 1


async def test_mcp_clients_are_told_recalls_own_name_and_version(services, service_env):
    """serverInfo named fastmcp's version (4.2.3), which clients show and log as the server's."""
    from importlib.metadata import version

    from fastmcp import Client
    from fastmcp.client.auth import BearerAuth

    services("serve")
    async with Client(f"{recall_url(service_env)}/mcp", auth=BearerAuth(mint("alice"))) as client:
        info = client.server_info  # from initialize or server/discover, whichever the client negotiated
    assert (info.name, info.version) == ("recall", version("recall"))
    assert info.version != version("fastmcp")
