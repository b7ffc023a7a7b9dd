"""One writer at a time, readers never blocked, and a kill -9 never loses the committed state."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import subprocess
import threading
import time

from shared.engine.api import Engine
from shared.engine.fault_injection import FAULT_ENV, KILLED_EXIT_CODE
from shared.engine.hybrid_search import RecallParams
from shared.engine.index_run import index_tree, memory_dir
from shared.engine.memory_lock import CONTENTION_MESSAGE
from tests.conftest import engine_cli, wait_until, write_conversation


def _bulk(src, n: int, prefix: str) -> None:
    for i in range(n):
        write_conversation(src, f"{prefix}{i}", [
            f"Shift note {i}: line {prefix.upper()}-{i} ran at {50 + i % 40} percent of capacity today.",
            f"Follow-up {i}: ticket MT-{9000 + i} covers the conveyor belt slip on line {prefix.upper()}-{i}.",
            f"Owner for item {i} is operator number {i % 12}; due by Friday.",
        ])


def _lock_held(home) -> bool:
    fd = os.open(home / "store.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _spawn_index(home, src, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([engine_cli(), "index", "--yes", *extra, str(src)],
                            env={**os.environ, "FUNES_HOME": str(home), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_concurrent_index_runs_are_serialised_while_recalls_answer(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "seed", ["The N-11 upgrade is approved."])
    home = tmp_path / "home"
    index_tree(home, src, embedder)
    _bulk(src, 60, "b")  # about the CPU 400 took with MiniLM: e5 costs ~7x per chunk

    first = _spawn_index(home, src)
    assert wait_until(lambda: _lock_held(home), timeout=30), "the first run takes the lock"
    engine = Engine(embedder=embedder)
    latencies: list[float] = []
    deadline = time.monotonic() + 60
    saw_busy = False
    while first.poll() is None and time.monotonic() < deadline:
        t0 = time.monotonic()
        out = engine.recall(memory_dir(home), "N-11 upgrade", RecallParams(k=1))
        latencies.append(time.monotonic() - t0)
        assert "N-11" in out, "the committed state stays searchable during a run"
        if not saw_busy:
            second = subprocess.run([engine_cli(), "index", "--yes", str(src)], env={**os.environ, "FUNES_HOME": str(home)},
                                    capture_output=True, text=True, timeout=600)
            if second.returncode == 1:
                assert CONTENTION_MESSAGE in second.stderr
                saw_busy = True
    first.wait(60)
    assert first.returncode == 0, first.stderr.read()
    assert saw_busy, "a second index run while one holds the lock fails with funes' message"
    assert latencies and max(latencies) < 2.0, f"a recall waited on the writer: {max(latencies):.2f}s"
    waiting = _spawn_index(home, src, "--wait", "30")
    assert waiting.wait(60) == 0 and "skipped=61" in waiting.stdout.read()


def test_two_waiting_index_runs_both_finish_one_after_the_other(tmp_path):
    src = tmp_path / "src"
    _bulk(src, 40, "w")
    home = tmp_path / "home"
    runs = [_spawn_index(home, src, "--wait", "60") for _ in range(2)]
    outs = [(p.wait(120), p.stdout.read()) for p in runs]
    assert all(code == 0 for code, _ in outs)
    lines = sorted(out.strip() for _, out in outs)
    assert lines == ["indexed sessions=0 skipped=40 chunks=0", "indexed sessions=40 skipped=0 chunks=120"]


def _committed_rows(home) -> int:
    conn = sqlite3.connect(memory_dir(home) / "chunks.sqlite3")
    try:
        return conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
    finally:
        conn.close()


KILL_POINTS = ["after_listing", "mid_embedding", "before_commit", "after_tantivy_commit", "after_sqlite_commit"]


def test_kill_9_at_every_phase_of_an_index_run_leaves_a_searchable_memory(tmp_path, embedder):
    """Each kill lands exactly at its point (RECALL_FAULT_INJECT makes the run os._exit there),
    including between the tantivy commit and the SQLite commit."""
    src = tmp_path / "src"
    write_conversation(src, "seed", ["The N-11 upgrade is approved."])
    home = tmp_path / "home"
    index_tree(home, src, embedder)
    _bulk(src, 60, "k")  # sized for e5 (~7x MiniLM per chunk): every kill point embeds them all
    engine = Engine(embedder=embedder)
    for point in KILL_POINTS:
        proc = _spawn_index(home, src, env={FAULT_ENV: point})
        assert proc.wait(600) == KILLED_EXIT_CODE, f"the run reached {point}: {proc.stderr.read()[-500:]}"
        assert "N-11" in engine.recall(memory_dir(home), "N-11 upgrade", RecallParams(k=1)), point
        committed = 181 if point == "after_sqlite_commit" else 1
        assert _committed_rows(home) == committed, f"nothing half-committed when killed at {point}"
    assert _spawn_index(tmp_path / "scratch", src).wait(600) == 0
    index_tree(home, src, embedder)
    scratch = engine.reader(memory_dir(tmp_path / "scratch")).store
    assert engine.reader(memory_dir(home)).store.counts() == (181, 61)
    assert scratch.counts() == (181, 61)
    out = engine.recall(memory_dir(home), "MT-9047 conveyor", RecallParams(k=1, neighbors=0))
    assert "MT-9047" in out
    bm25_only = engine.recall(memory_dir(home), "MT-9047", RecallParams(k=3, neighbors=0))
    assert bm25_only.count("MT-9047 covers") == 1, "no row is duplicated by the interrupted runs"


def test_readers_in_threads_see_a_new_conversation_after_commit(tmp_path, embedder):
    src = tmp_path / "src"
    write_conversation(src, "a", ["alpha topic"])
    home = tmp_path / "home"
    index_tree(home, src, embedder)
    engine = Engine(embedder=embedder)
    assert "Z-991" not in engine.recall(memory_dir(home), "Z-991", RecallParams())
    write_conversation(src, "b", ["The Z-991 valve was replaced."])
    index_tree(home, src, embedder)
    results = []
    threads = [threading.Thread(target=lambda: results.append(engine.recall(memory_dir(home), "Z-991", RecallParams(k=1))))
               for _ in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert all("Z-991 valve" in r for r in results)
