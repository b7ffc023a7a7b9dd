"""How many searches a recall replica runs at once, and how the engine sizes its model threads,
by default: the cores the process may use (`native_threads.usable_cores`), from its CPU affinity
and a cgroup CPU quota."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest

from services.recall.settings import RecallSettings
from shared.engine.embedder import EmbedderSettings
from shared.engine.native_threads import usable_cores

AFFINITY = len(os.sched_getaffinity(0))


def cgroup(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("files, expected", [
    ({"cpu.max": "50000 100000\n"}, 1),  # half a core: still one search
    ({"cpu.max": "100000 100000\n"}, 1),
    ({"cpu.max": "max 100000\n"}, AFFINITY),  # no limit: the affinity decides
    ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # cgroup v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, AFFINITY),
    ({"cpu.max": "garbage\n"}, AFFINITY),
    ({"cpu.max": "100000 0\n"}, AFFINITY),
    ({}, AFFINITY),
])
def test_a_cgroup_quota_caps_the_cores_the_affinity_allows(tmp_path, files, expected):
    assert usable_cores(cgroup(tmp_path, files)) == expected


def test_a_quota_above_the_affinity_does_not_add_cores(tmp_path):
    assert usable_cores(cgroup(tmp_path, {"cpu.max": f"{100000 * (AFFINITY + 3)} 100000\n"})) == AFFINITY


@contextmanager
def pinned_to_one_core():
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def test_a_replica_pinned_to_one_core_runs_one_search_at_once_by_default():
    with pinned_to_one_core():
        assert RecallSettings().max_concurrency == 1
        assert RecallSettings(max_concurrency=6).max_concurrency == 6


@pytest.mark.skipif(AFFINITY < 2, reason="needs a machine with two cores to tell affinity from the machine's count")
def test_the_engine_sizes_its_model_threads_by_the_usable_cores_not_the_machines():
    with pinned_to_one_core():
        settings = EmbedderSettings()
    assert (settings.embed_batch_threads, settings.embed_query_lanes) == (1, 1)
