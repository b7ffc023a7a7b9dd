"""funes mode relies only on the funes contract (the child's `status` tool, the CLI's outputs and
exit codes), never on the embedded engine's files: checked against a stand-in funes
(tests/data/fake_funes.py) that keeps real funes' layout (`memory/chunks.lance/`) and outputs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from services.indexer.forget_rows import FunesRows
from services.indexer.index_job import FunesIndexJob
from services.recall.process_pool import ProcessPool
from services.recall.server import RecallService
from services.recall.settings import RecallSettings
from shared.recall_answer_format import NO_MEMORY, NOTHING, UNAVAILABLE
from shared.tenant_paths import TenantPaths
from tests.conftest import (INGEST_KEY, JWT_SECRET, call_recall, funes_status_chunks, ingest_url, mint, post_conversation,
                            wait_until, write_conversation)

ALICE = ["What did we decide on the N-11 upgrade?", "Proceed once ticket MT-4471 for the K-2 machine is closed.", "ok"]
PLAN = ["Vault migration Q-731: codename BLUEHERON.", "Budget 48k.", "ok", "Start in May."]
ENGINE_FILES = ("chunks.sqlite3", "fts")  # the embedded engine's layout inside memory/


def run(binary: str, home: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, env={"FUNES_HOME": str(home)})


def index(binary: str, paths: TenantPaths) -> None:
    done = run(binary, paths.root, "index", "--yes", str(paths.src))
    assert done.returncode == 0, done.stderr


@pytest.fixture
def tenant(tmp_path, fake_funes) -> TenantPaths:
    paths = TenantPaths.for_user(tmp_path / "data", "alice")
    write_conversation(paths.src, "a1", ALICE)
    write_conversation(paths.src, "plan", PLAN)
    index(fake_funes, paths)
    return paths


# ---- the stand-in keeps funes' layout and outputs -----------------------------------------------
def test_the_stand_in_keeps_funes_layout_and_no_engine_file(tenant):
    table = tenant.memory / "chunks.lance"
    assert all((table / d).is_dir() for d in ("data", "_versions", "_indices", "_transactions"))
    assert (tenant.root / "state.json").is_file() and (tenant.root / "store.lock").exists()
    assert not any(p.name in ENGINE_FILES for p in tenant.root.rglob("*"))


def test_the_stand_in_answers_as_the_contract_documents(tenant, fake_funes, tmp_path):
    status = run(fake_funes, tenant.root, "status", str(tenant.memory))
    assert status.returncode == 0 and status.stdout.splitlines()[:3] == [
        f"memory: {tenant.memory}", "chunks: 7", "sessions: 2"]
    empty = tmp_path / "empty"
    absent = run(fake_funes, empty, "status")
    assert absent.returncode == 0 and absent.stdout.splitlines()[1].startswith("no index yet — run `funes add <agent>`")
    no_index = run(fake_funes, empty, "recall", "--memory", str(empty / "memory"), "N-11")
    assert no_index.returncode == 1 and no_index.stderr == f"Error: no index found at {empty / 'memory'}\n"
    hits = run(fake_funes, tenant.root, "recall", "-k", "2", "N-11 upgrade")
    assert hits.stdout.count("\n---\n") == 2 and hits.stdout.startswith("[2026-10-08T10:00:00Z] copilot a1 text  score=")
    assert f"  → get a1 a1-0 --memory {tenant.memory}\n" in hits.stdout
    assert run(fake_funes, tenant.root, "nonsense").returncode == 2
    forgot = run(fake_funes, tenant.root, "forget", "plan", "--memory", str(tenant.memory))
    assert forgot.stdout == "forgot session plan: 4 chunks removed\n"
    assert funes_status_chunks(fake_funes, tenant.memory) == 3
    assert not any(b"BLUEHERON" in p.read_bytes() for p in tenant.root.rglob("*.jsonl") if "memory" in p.parts)


def test_a_funes_child_gets_an_absolute_home_the_shared_model_cache_and_none_of_our_secrets(tmp_path, monkeypatch):
    from shared.funes_env import funes_environment

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "service-home"))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("FUNES_TRUFFLEHOG", "/opt/trufflehog")
    monkeypatch.setenv("RECALL_JWT_SECRET", JWT_SECRET)
    env = funes_environment(Path("data") / "0123abcd")  # RECALL_DATA_DIR as given: relative by default
    assert env["FUNES_HOME"] == env["HOME"] == str(tmp_path / "data" / "0123abcd"), "the contract: an absolute FUNES_HOME"
    assert env["HF_HOME"] == str(tmp_path / "service-home" / ".cache" / "huggingface"), \
        "funes reads no HF_HUB_OFFLINE: with HOME the tenant's it would fetch the models once per tenant"
    assert env["FUNES_TRUFFLEHOG"] == "/opt/trufflehog", "redaction stays on"
    assert env["TMPDIR"] == str(tmp_path / "data" / "0123abcd" / "tmp"), "a unit's copy for TruffleHog stays the tenant's"
    assert JWT_SECRET not in env.values()
    monkeypatch.setenv("HF_HOME", "/opt/hf")
    assert funes_environment(tmp_path)["HF_HOME"] == "/opt/hf"


def test_a_second_index_run_fails_with_funes_contention_message(tenant, fake_funes):
    import fcntl

    with open(tenant.root / "store.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = run(fake_funes, tenant.root, "index", "--yes", str(tenant.src))
    assert busy.returncode == 1
    assert busy.stderr == "Error: another funes memory operation is in progress; retry in a moment\n"


# ---- funes mode in process: every file it opens is watched ---------------------------------------
class EngineFileWatch:
    """Records every access by this process to an embedded-engine file: opens, directory listings
    and sqlite3 connections through an audit hook (it cannot be removed, so it records only while
    armed), and existence checks through os.stat, which raises no audit event."""

    armed = False
    touched: list[str] = []
    _installed = False

    @classmethod
    def arm(cls) -> None:
        if not cls._installed:
            sys.addaudithook(cls._hook)
            cls._installed = True
        cls.touched.clear()
        cls.armed = True

    @classmethod
    def _hook(cls, event: str, args: tuple) -> None:
        if cls.armed and event in ("open", "sqlite3.connect", "os.listdir", "os.scandir") and args:
            cls.record(event, args[0])

    @classmethod
    def record(cls, event: str, path) -> None:
        name = str(path)
        if any(Path(name).name == part or f"/{part}/" in name for part in ENGINE_FILES):
            cls.touched.append(f"{event} {name}")


@pytest.fixture
def watch(monkeypatch):
    real_stat = os.stat

    def watched_stat(path, *args, **kwargs):
        EngineFileWatch.record("stat", path)
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", watched_stat)
    EngineFileWatch.arm()
    yield EngineFileWatch
    EngineFileWatch.armed = False


async def test_funes_mode_recall_decides_memory_state_from_the_contract_alone(tenant, fake_funes, watch):
    s = RecallSettings(data_dir=tenant.root.parent, engine="funes", funes_bin=fake_funes, jwt_secret=JWT_SECRET)
    pool = ProcessPool(fake_funes, 4, 60, 10, 30)
    service = RecallService(s, pool)
    try:
        assert "Proceed once ticket MT-4471" in await service.recall_for("alice", "MT-4471 K-2")
        assert await service.recall_for("nobody", "MT-4471") == NO_MEMORY  # no src/: no child at all
        assert pool.ready() and len(pool._slots) == 1
        # Stored conversations but no index yet (the child's status says so): unavailable, not "none stored".
        bob = TenantPaths.for_user(tenant.root.parent, "bob")
        write_conversation(bob.src, "b1", ["The P-7 motor has bearing noise."])
        assert await service.recall_for("bob", "P-7") == UNAVAILABLE
        # An index that holds nothing: "no results".
        index(fake_funes, bob)
        run(fake_funes, bob.root, "forget", "b1", "--memory", str(bob.memory))
        await pool.forget_tenant(bob)
        assert await service.recall_for("bob", "P-7") == NOTHING
    finally:
        await pool.close()
    assert watch.touched == [], watch.touched


async def test_funes_mode_ignores_an_engine_file_that_funes_did_not_write(tenant, fake_funes):
    """A decoy chunks.sqlite3 beside no funes index: the answer follows funes' status, not the file."""
    carol = TenantPaths.for_user(tenant.root.parent, "carol")
    write_conversation(carol.src, "c1", ["Carol's K-9 note."])
    carol.memory.mkdir(parents=True)
    (carol.memory / "chunks.sqlite3").write_bytes(b"SQLite format 3\x00" + bytes(4096))
    s = RecallSettings(data_dir=tenant.root.parent, engine="funes", funes_bin=fake_funes, jwt_secret=JWT_SECRET)
    pool = ProcessPool(fake_funes, 4, 60, 10, 30)
    try:
        assert await RecallService(s, pool).recall_for("carol", "K-9") == UNAVAILABLE  # stored, not indexed by funes
    finally:
        await pool.close()


async def test_funes_mode_forget_counts_what_funes_reports(tenant, fake_funes, watch):
    rows = FunesRows(fake_funes, FunesIndexJob(fake_funes, 60), 60)
    assert await rows.count(tenant) == 7
    (tenant.src / "plan.funes.jsonl").unlink()
    assert await rows.remove_conversation(tenant, "plan") == 4
    assert await rows.count(tenant) == 3
    assert watch.touched == [], watch.touched


async def test_funes_without_a_forget_command_is_rebuilt_and_the_difference_counted(tenant, tmp_path, fake_funes):
    """funes <= 1.2 is append-only (no `forget`, clap exits 2): rebuild from the remaining files."""
    old_funes = tmp_path / "funes-1.2"
    old_funes.write_text(f'#!/bin/sh\n[ "$1" = forget ] && {{ echo "error: unrecognized subcommand" >&2; exit 2; }}\n'
                         f'exec "{fake_funes}" "$@"\n')
    old_funes.chmod(0o755)
    rows = FunesRows(str(old_funes), FunesIndexJob(str(old_funes), 60), 60)
    (tenant.src / "plan.funes.jsonl").unlink()
    assert await rows.remove_conversation(tenant, "plan") == 4
    assert await rows.count(tenant) == 3



def _slow_funes(tmp_path: Path, fake_funes: str, sleep_s: float, after: bool = False) -> str:
    """The stand-in, with `index` taking `sleep_s` longer: before its work, or after it (committed, then hung)."""
    slow = tmp_path / "slow-funes"
    run = f'"{fake_funes}" "$@"'
    body = f'sleep {sleep_s}; exec {run}' if not after else f'{run}; s=$?; sleep {sleep_s}; exit $s'
    slow.write_text(f'#!/bin/sh\nif [ "$1" = index ]; then {body}; fi\nexec {run}\n')
    slow.chmod(0o755)
    return str(slow)


async def test_a_rebuild_gets_time_for_what_the_tenant_stored_not_the_index_timeout(tenant, tmp_path, fake_funes):
    from services.indexer.index_job import REBUILD_S_PER_MIB, IndexJobFailed

    # ~12 KiB of transcripts: 7 s at REBUILD_S_PER_MIB, so a rebuild outlasts the 1 s index timeout.
    write_conversation(tenant.src, "long", [f"Turn {i}: the pump log says the seal held at {i} bar." * 4 for i in range(60)])
    slow = _slow_funes(tmp_path, fake_funes, 2)
    job = FunesIndexJob(slow, timeout_s=1)
    assert job.rebuild_timeout(tenant) > 2 and job.rebuild_timeout(tenant) == pytest.approx(
        sum(f.stat().st_size for f in tenant.src.glob("*.funes.jsonl")) / 2**20 * REBUILD_S_PER_MIB)
    with pytest.raises(IndexJobFailed, match="timed out after 1s"):
        await job.run(tenant)  # an ordinary run keeps the index timeout
    (tenant.src / "plan.funes.jsonl").unlink()
    await job.remove_deleted(tenant)  # a rebuild: the whole memory again
    assert funes_status_chunks(fake_funes, tenant.memory) == 3 + 60


async def test_a_rebuild_cut_short_goes_on_from_what_it_committed(tenant, tmp_path, fake_funes):
    from services.indexer.index_job import IndexJobFailed

    hung = FunesIndexJob(_slow_funes(tmp_path, fake_funes, 30, after=True), timeout_s=1)
    tenant.funes_rebuild.touch()
    with pytest.raises(IndexJobFailed):
        await hung.run(tenant)  # emptied the memory, indexed it again, then hung and was killed
    assert not tenant.funes_rebuild.exists(), "the rebuild is under way: the next run must not empty the memory again"
    kept = tenant.memory / "kept-by-the-next-run"
    kept.touch()
    await FunesIndexJob(fake_funes, 60).run(tenant)
    assert kept.exists() and funes_status_chunks(fake_funes, tenant.memory) == 7



async def test_a_forgets_rebuild_cut_short_completes_the_forget_and_leaves_the_rest_to_the_next_runs(tenant, tmp_path, fake_funes):
    """A forget whose rebuild outran its timeout failed, was redelivered, and each delivery emptied
    the memory again: a tenant too large for one run never finished. Now the forget is done (the
    memory was emptied first, so the conversation is gone) and the next index runs go on."""
    from services.indexer.forget_rows import RebuildContinues

    no_forget = tmp_path / "funes-1.2"  # no `forget`: the rebuild path; and `index` commits, then hangs
    no_forget.write_text(f'#!/bin/sh\n[ "$1" = forget ] && exit 2\nexec "{_slow_funes(tmp_path, fake_funes, 30, after=True)}" "$@"\n')
    no_forget.chmod(0o755)
    rows = FunesRows(str(no_forget), FunesIndexJob(str(no_forget), 1), 60)
    (tenant.src / "plan.funes.jsonl").unlink()
    with pytest.raises(RebuildContinues) as unfinished:
        await rows.remove_conversation(tenant, "plan")
    assert unfinished.value.chunks == 4 and not tenant.funes_rebuild.exists()
    kept = tenant.memory / "kept-by-the-next-run"
    kept.touch()
    await FunesIndexJob(fake_funes, 60).run(tenant)  # the next run goes on; it does not empty the memory
    assert kept.exists() and funes_status_chunks(fake_funes, tenant.memory) == 3


# ---- the whole stack in funes mode with the stand-in -------------------------------------------
@pytest.fixture
def funes_stack(services, service_env, fake_funes):
    engine = {"RECALL_ENGINE": "funes", "RECALL_FUNES_BIN": fake_funes}
    service_env.update(engine)
    services("ingest")
    services("indexer", **engine)
    services("serve", **engine)
    return service_env


def _memory(env, user: str) -> Path:
    return TenantPaths.for_user(Path(env["RECALL_DATA_DIR"]), user).memory


async def test_funes_stack_recalls_and_forgets_through_the_contract(funes_stack, fake_funes):
    env = funes_stack
    post_conversation(env, "alice", "a1", ALICE)
    post_conversation(env, "alice", "plan", PLAN)
    assert wait_until(lambda: funes_status_chunks(fake_funes, _memory(env, "alice")) == 7, 30)
    token = mint("alice")
    assert "Proceed once ticket MT-4471" in await call_recall(env, token, "MT-4471 K-2")
    assert "BLUEHERON" in await call_recall(env, token, "Q-731 codename")
    resp = httpx.delete(f"{ingest_url(env)}/conversations/plan", params={"user": "alice"},
                        headers={"x-ingest-key": INGEST_KEY}, timeout=10)
    assert resp.status_code == 202
    receipt = resp.json()["receipt"]

    def done() -> dict | None:
        body = httpx.get(f"{ingest_url(env)}/deletions/{receipt}", headers={"x-ingest-key": INGEST_KEY}, timeout=10).json()
        return body if body["status"] == "done" else None

    assert wait_until(lambda: done() is not None, 30)
    removed = done()["removed"]
    assert (removed["files"], removed["chunks"]) == (1, 4), removed
    assert "BLUEHERON" not in await call_recall(env, token, "Q-731 codename")
    assert "MT-4471" in await call_recall(env, token, "MT-4471")
    data = Path(env["RECALL_DATA_DIR"])
    assert not [p for p in data.rglob("*") if p.name in ENGINE_FILES], "no embedded-engine file in funes mode"


async def test_funes_stack_answers_from_an_edited_turn_not_the_line_funes_stored_first(funes_stack, fake_funes):
    """funes is append-only: a changed line keeps its first text, so a snapshot that rewrites
    stored lines (an edited turn) rebuilds the tenant's memory instead of being skipped."""
    env = funes_stack
    post_conversation(env, "alice", "budget", ["What is the KESTREL Q3 budget?", "The KESTREL budget is 48k."])
    assert wait_until(lambda: funes_status_chunks(fake_funes, _memory(env, "alice")) == 2, 30)
    token = mint("alice")
    assert "48k" in await call_recall(env, token, "KESTREL budget")
    post_conversation(env, "alice", "budget", ["What is the KESTREL Q3 budget?", "Correction: the KESTREL budget is 52k."])
    deadline = time.monotonic() + 30
    while "52k" not in (answer := await call_recall(env, token, "KESTREL budget")):
        assert time.monotonic() < deadline, answer
        await asyncio.sleep(0.3)
    assert "48k" not in answer and funes_status_chunks(fake_funes, _memory(env, "alice")) == 2
    assert not TenantPaths.for_user(Path(env["RECALL_DATA_DIR"]), "alice").funes_rebuild.exists()


async def test_an_index_run_told_in_progress_above_a_caused_by_chain_is_busy_not_failed(tenant, tmp_path):
    from services.indexer.index_job import FunesIndexJob
    from shared.engine.memory_lock import MemoryBusy

    busy = tmp_path / "funes"
    busy.write_text("#!/bin/sh\necho 'Error: another funes memory operation is in progress; retry in a moment' >&2\n"
                    "echo 'Caused by:' >&2\necho '    0: Resource temporarily unavailable (os error 11)' >&2\nexit 1\n")
    busy.chmod(0o755)
    with pytest.raises(MemoryBusy):
        await FunesIndexJob(str(busy), 30).run(tenant)


async def test_an_index_run_first_clears_what_a_killed_run_left_in_the_tenants_temp_dir(tenant, fake_funes):
    from services.indexer.index_job import FunesIndexJob
    from shared.funes_env import funes_tmp

    leftover = funes_tmp(tenant.root.resolve()) / "tmp-unit" / "copy.jsonl"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("a unit's text, copied for TruffleHog by a run that was killed")
    await FunesIndexJob(fake_funes, 60).run(tenant)
    assert not leftover.exists() and funes_tmp(tenant.root.resolve()).is_dir()
