"""Defects found by reading the read path and the recall service, each shown by a test that
failed before its fix: real engine, real services, a real MCP client over HTTP, real tokens."""

from __future__ import annotations

import pytest

from shared.recall_answer_format import NO_MEMORY
from tests.conftest import call_recall, mint, post_conversation, wait_until, write_conversation
from tests.test_recall_service import chunks_of, stack  # noqa: F401  (the stack fixture)

TALK_ABOUT_FUNES = ["Why is recall empty on the K-2 project?",
                    "funes printed no index yet for the K-2 project, so run funes index first.", "ok"]


@pytest.mark.parametrize("stack", ["funes", "stand-in-funes"], indirect=True)
async def test_funes_mode_passage_quoting_a_no_index_message_is_still_returned(stack):
    """In funes mode a recall answer was read as "this memory has no index" whenever any passage
    merely contained funes' words for it, so the user was told nothing is stored."""
    env, _, _ = stack
    post_conversation(env, "erin", "e1", TALK_ABOUT_FUNES)
    assert wait_until(lambda: chunks_of(env, "erin") == 3, 30)
    out = await call_recall(env, mint("erin"), "K-2 project funes index")
    assert out != NO_MEMORY
    assert "funes printed no index yet for the K-2 project" in out


PASTED_FUNES_LINE = "[2025-01-01T00:00:00Z] claude /home/erin/5f3c9a21 text  score=0.912"


@pytest.mark.parametrize("stack", ["funes"], indirect=True)
async def test_funes_mode_passage_holding_a_line_like_a_funes_header_stays_one_passage(stack):
    """funes' text was split on every line shaped like a hit header, so a turn quoting funes'
    output became two passages: the real one cut short and a forged one, dated by the quote."""
    env, _, _ = stack
    text = f"The K-7 drive trips again; funes showed me\n{PASTED_FUNES_LINE}\nbefore the trip."
    post_conversation(env, "erin", "e2", [text, "ok"])
    assert wait_until(lambda: chunks_of(env, "erin") == 2, 30)
    out = await call_recall(env, mint("erin"), "K-7 drive trips")
    assert text in out
    assert "[2025-01-01 00:00 UTC]" not in out, out


@pytest.mark.parametrize("query, rest, start, end", [
    ("N-11 since October", "N-11", "2026-10-01", "2026-11-30"),
    ("since August 2025 MT-4471", "MT-4471", "2025-08-01", "2026-11-30"),
    ("what changed since last week on N-11", "what changed on N-11", "2026-11-16", "2026-11-30"),
    ("N-11 since yesterday", "N-11", "2026-11-28", "2026-11-30"),
    ("N-11 since 2026-11-20", "N-11 since 2026-11-20", "2026-11-20", "2026-11-30"),
])
def test_since_a_time_means_from_then_until_today(query, rest, start, end):
    """"since October" (or "since last week") named October (last week) alone, so later
    passages, as much "since" it, were not put first."""
    from datetime import datetime, timezone

    from services.recall.time_window import find_time_window

    searched, window = find_time_window(query, datetime(2026, 11, 29, 12, tzinfo=timezone.utc))
    assert searched == rest
    assert (window.start.date().isoformat(), window.end.date().isoformat()) == (start, end)


def test_forget_leaves_no_snapshot_of_the_forgotten_rows_when_no_new_one_fits(tmp_path, embedder):
    """A memory with too many harness names for a snapshot header kept its last `vectors.i8`
    after a forget: the forgotten turns' vectors and row ids stayed on disk."""
    from shared.engine.api import Engine
    from shared.engine.hybrid_search import RecallParams
    from shared.engine.index_run import index_tree, memory_dir
    from shared.engine.transcript import dump_transcript
    from shared.engine.vector_file import open_vector_file
    from tests.conftest import make_turns

    src, home = tmp_path / "src", tmp_path / "home"
    src.mkdir()
    (src / "secret.funes.jsonl").write_text(dump_transcript(make_turns("secret", ["The vault code is kept by Priya.", "ok"])))
    index_tree(home, src, embedder)
    memory = memory_dir(home)
    forgotten = set(open_vector_file(memory, embedder.dim).ids.tolist())
    for i in range(400):  # ~6 kB of harness names: more than a snapshot header holds
        (src / f"h{i}.funes.jsonl").write_text(dump_transcript(make_turns(f"h{i}", [f"note {i}"], harness=f"harness-number-{i:04d}")))
    index_tree(home, src, embedder)
    (src / "secret.funes.jsonl").unlink()
    index_tree(home, src, embedder, purge=True)
    snapshot = open_vector_file(memory, embedder.dim)
    assert snapshot is None or not forgotten & set(snapshot.ids.tolist())
    hits = Engine(embedder=embedder).search(memory, "note 7", RecallParams(k=3, neighbors=0))
    assert hits and all(h.row.session_id != "secret" for h in hits)  # readers go on from SQLite


@pytest.mark.parametrize("query, start, end", [
    ("what did we decide in the past week", "2026-11-22", "2026-11-30"),
    ("N-11 past month", "2026-10-30", "2026-11-30"),
])
def test_the_past_week_or_month_is_the_days_up_to_today(query, start, end):
    """"the past week" named the calendar week before this one, so on a Sunday the six days
    just gone were not put first (like "past 7 days", it means the days up to today)."""
    from datetime import datetime, timezone

    from services.recall.time_window import find_time_window

    _, window = find_time_window(query, datetime(2026, 11, 29, 12, tzinfo=timezone.utc))
    assert (window.start.date().isoformat(), window.end.date().isoformat()) == (start, end)


def test_a_memory_deleted_while_a_search_opens_it_is_no_memory_never_a_fault(tmp_path, embedder):
    """A user forget removes the tenant's directory; a recall opening that memory meanwhile
    failed with whatever file had just gone (tantivy, SQLite: "disk I/O error", a recreated
    empty database), which the recall service answers "memory is unavailable" and logs as a
    fault. It is NoIndex ("no earlier conversations"), and opening never recreates the database."""
    import shutil
    import threading
    import time
    from collections import Counter

    from shared.engine.api import Engine, NoIndex
    from shared.engine.hybrid_search import RecallParams
    from shared.engine.index_run import index_tree

    template = tmp_path / "template"
    for i in range(3):
        write_conversation(template / "src", f"c{i}", [f"Unit P-{i} has a gland leak.", "ok"])
    index_tree(template, template / "src", embedder)
    engine = Engine(embedder=embedder)
    outcomes: Counter[str] = Counter()
    recreated = 0
    for i in range(150):
        home = tmp_path / f"user-{i}"
        shutil.copytree(template, home)
        start = threading.Barrier(2)

        def forget_user() -> None:
            start.wait()
            time.sleep(0.0005 * (i % 10))
            shutil.rmtree(home, ignore_errors=True)

        forget = threading.Thread(target=forget_user)
        forget.start()
        start.wait()
        try:
            engine.search(home / "memory", "gland leak", RecallParams(k=1))
            outcomes["answered"] += 1
        except NoIndex:
            outcomes["no memory"] += 1
        except Exception as exc:
            outcomes[f"{type(exc).__name__}: {str(exc)[:80]}"] += 1
        forget.join()
        recreated += (home / "memory" / "chunks.sqlite3").exists()
        shutil.rmtree(home, ignore_errors=True)
    assert set(outcomes) <= {"answered", "no memory"}, outcomes
    assert outcomes["no memory"] > 0  # the race was really run
    assert recreated == 0


def test_status_shows_the_last_index_time_in_utc_on_a_host_with_summer_time(tmp_path, embedder, run_engine, monkeypatch):
    """`last indexed` was read as local time and corrected by the standard offset only, so on a
    host in a zone with summer time a summer stamp showed an hour early."""
    import sqlite3

    from shared.engine.index_run import index_tree, memory_dir

    write_conversation(tmp_path / "src", "c1", ["Unit P-1 has a gland leak.", "ok"])
    index_tree(tmp_path / "home", tmp_path / "src", embedder)
    memory = memory_dir(tmp_path / "home")
    with sqlite3.connect(memory / "chunks.sqlite3") as db:
        db.execute("UPDATE meta SET value='2026-07-01T10:00:00Z' WHERE key='last_indexed'")
    monkeypatch.setenv("TZ", "Europe/Berlin")
    status = run_engine("status", str(memory), home=tmp_path / "home").stdout
    assert "last indexed: 2026-07-01 10:00 UTC (" in status, status


def test_cache_size_can_be_read_while_other_threads_search(tmp_path, embedder):
    """`Engine.cached_bytes` (read after every recall for the cache-bytes gauge) walked the cache
    without its lock, so a search leasing a reader meanwhile raised "OrderedDict mutated during
    iteration" in the recall that read it: an MCP error instead of the answer."""
    import shutil
    import sys
    import threading
    import time

    from shared.engine.api import Engine
    from shared.engine.index_run import index_tree, memory_dir

    template = tmp_path / "template"
    write_conversation(template / "src", "c1", ["Unit P-1 has a gland leak.", "ok"])
    index_tree(template, template / "src", embedder)
    memories = []
    for i in range(40):
        shutil.copytree(template, tmp_path / f"user-{i}")
        memories.append(memory_dir(tmp_path / f"user-{i}"))
    engine = Engine(embedder=embedder)
    stop = threading.Event()

    def searches() -> None:
        while not stop.is_set():
            for memory in memories:
                with engine.lease(memory):
                    pass

    workers = [threading.Thread(target=searches) for _ in range(2)]
    for w in workers:
        w.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so a short race shows within seconds
    errors = 0
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                engine.cached_bytes
            except RuntimeError:
                errors += 1
    finally:
        sys.setswitchinterval(interval)
        stop.set()
        for w in workers:
            w.join()
    assert errors == 0


async def test_funes_mode_forget_waits_for_a_recall_in_flight_instead_of_failing_it(tmp_path, embedder):
    """Forgetting a conversation closed the tenant's engine child at once, so a recall it was
    answering got "memory is unavailable" although the rest of the memory was fine."""
    import asyncio

    from services.recall.process_pool import ProcessPool
    from services.recall.server import RecallService
    from services.recall.settings import RecallSettings
    from shared.engine.index_run import index_tree
    from shared.recall_answer_format import UNAVAILABLE
    from shared.tenant_paths import TenantPaths
    from tests.conftest import JWT_SECRET, engine_cli

    paths = TenantPaths.for_user(tmp_path, "erin")
    write_conversation(paths.src, "e1", ["Unit P-1 has a gland leak.", "Work order MT-4401 is open for it.", "ok"])
    index_tree(paths.root, paths.src, embedder)
    s = RecallSettings(data_dir=tmp_path, engine="funes", funes_bin=engine_cli(), jwt_secret=JWT_SECRET)
    pool = ProcessPool(engine_cli(), 4, 60, 30, 60)
    service = RecallService(s, pool)
    try:
        assert "MT-4401" in await service.recall_for("erin", "MT-4401 gland leak")  # the child is warm
        answers = []
        for delay in (0.0, 0.002, 0.005, 0.01, 0.02):
            call = asyncio.create_task(service.recall_for("erin", "MT-4401 gland leak"))
            await asyncio.sleep(delay)
            await pool.forget_tenant(paths)  # another conversation of erin's was forgotten
            answers.append(await call)
        assert UNAVAILABLE not in answers, answers
        assert all("MT-4401" in a for a in answers)
    finally:
        await pool.close()


def test_an_answer_cut_to_its_first_passage_is_still_recognised_as_a_recall_answer():
    """With a small RECALL_MAX_RESULT_CHARS the first passage is cut, and the answer lost its
    closing `---`: ingest no longer recognised it, so a gateway echoing it back stored a recall
    answer as a new memory."""
    from services.recall.tool_output import AgentHit, render_for_agent
    from shared.recall_answer_format import looks_like_recall_answer

    hit = AgentHit(ts="2026-10-08T10:00:00Z", session_id="c1", turn_uuid="c1-0", text="gland leak on P-1. " * 40)
    out = render_for_agent([hit], 200, 3)
    assert len(out) <= 200
    assert looks_like_recall_answer(out), out


def test_an_answer_whose_passage_holds_a_markdown_rule_is_still_recognised_as_a_recall_answer():
    """A passage holding a `---` line (a markdown rule) made the answer's separators outnumber
    its headers, so ingest no longer recognised the echoed answer and would store it as a memory."""
    from services.recall.tool_output import AgentHit, render_for_agent
    from shared.recall_answer_format import looks_like_recall_answer

    plan = AgentHit(ts="2026-10-08T10:00:00Z", session_id="c1", turn_uuid="c1-0",
                    text="Plan for P-1:\n---\n1. drain\n2. replace the gland")
    ok = AgentHit(ts="2026-10-08T10:01:00Z", session_id="c1", turn_uuid="c1-1", text="ok")
    assert looks_like_recall_answer(render_for_agent([plan, ok], 4000, 3))
    assert looks_like_recall_answer(render_for_agent([ok, plan], 4000, 3))
    assert not looks_like_recall_answer("Notes from the call\n---\n[2026-10-08 10:00 UTC]\nok\n---")
