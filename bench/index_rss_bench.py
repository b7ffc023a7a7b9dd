"""Resident memory of one indexer process across many huge pastes: `--pastes` turns of `--chars`
characters (colour codes, CJK text and English prose in turn, each a new user), indexed one
after another in one process, printing the RSS and the run's CPU after each. A fresh process per paste
(`bench.index_memory_bench`) shows a run's peak; this shows what the process keeps between
runs, which is what crept to ~1 GB over a day of pastes.

    python -m bench.index_rss_bench [--pastes 6] [--chars 150000] [--tree DIR] [--env NAME=VALUE ...] [--trim]

`--tree` runs another checkout's code (a `git archive` of the commit before a change) with this
probe; `--env` sets the child's environment (MALLOC_ARENA_MAX=2, RECALL_EMBED_CPU_ARENA=false).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from shared.huge_pages import with_huge_pages

PROBE = r"""
import ctypes, json, sys, time
from pathlib import Path
from bench.locomo_bench import write_transcript
from shared.engine.embedder import shared_embedder
from shared.engine.index_run import index_tree
from shared.engine.transcript import Block, TranscriptTurn

UNITS = ["\x1b[31m", "漢字の文章", "the pump on line four overheats again after the seal was replaced "]
work, pastes, chars, trim = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "trim"
return_free_memory = None
if trim:  # the step the scheduler takes after a heavy run
    from services.indexer.memory_return import return_free_memory


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


embedder = shared_embedder()
embedder.embed(["warm up"])
print(json.dumps({"paste": 0, "kind": "loaded", "rss_mib": round(rss_mib()), "cpu_s": 0.0}), flush=True)
for i in range(pastes):
    unit = UNITS[i % len(UNITS)]
    text = (f"paste {i} " + unit * (chars // len(unit) + 1))[:chars]
    user = work / f"user{i}"
    (user / "src").mkdir(parents=True)
    turn = TranscriptTurn(session_id="paste", turn_uuid=f"paste-{i}", seq=0, ts="2026-11-20T10:00:00Z", role="tool",
                          harness="chat", blocks=[Block(block_type="text", text=text)])
    write_transcript(user / "src", "paste", [turn])
    cpu = time.process_time()
    index_tree(user / "home", user / "src", embedder)
    if return_free_memory is not None:
        return_free_memory()
    print(json.dumps({"paste": i + 1, "kind": ["colour codes", "CJK", "English"][i % 3], "rss_mib": round(rss_mib()),
                      "cpu_s": round(time.process_time() - cpu, 1)}), flush=True)
# Diagnosis: what of the last RSS glibc held free (malloc_trim hands it back).
ctypes.CDLL(None).malloc_trim(0)
print(json.dumps({"paste": -1, "kind": "then malloc_trim(0)", "rss_mib": round(rss_mib()), "cpu_s": 0.0}), flush=True)
"""


def run(tree: Path, pastes: int, chars: int, env: dict[str, str], trim: bool) -> list[dict]:
    child_env = with_huge_pages({**os.environ, "PYTHONPATH": str(tree), **env})  # as the services start
    rows = []
    with tempfile.TemporaryDirectory() as work:
        proc = subprocess.Popen([sys.executable, "-c", PROBE, work, str(pastes), str(chars), "trim" if trim else "no"], cwd=tree, env=child_env,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            rows.append(json.loads(line))
            print(line.strip(), flush=True)
        if proc.wait() != 0:
            raise SystemExit(f"probe exited {proc.returncode}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pastes", type=int, default=6)
    ap.add_argument("--chars", type=int, default=150_000)
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the probe process (repeatable)")
    ap.add_argument("--trim", action="store_true", help="return free memory after each run, as the scheduler does after a heavy one")
    args = ap.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    rows = run(args.tree.resolve(), args.pastes, args.chars, env, args.trim)
    pasted = [row for row in rows if row["paste"] > 0]
    print(json.dumps({"tree": str(args.tree), "env": env, "trim": args.trim, "rss_loaded_mib": rows[0]["rss_mib"],
                      "rss_last_mib": pasted[-1]["rss_mib"], "rss_max_mib": max(row["rss_mib"] for row in pasted),
                      "rss_last_trimmed_mib": rows[-1]["rss_mib"],
                      "cpu_s_total": round(sum(row["cpu_s"] for row in pasted), 1)}))


if __name__ == "__main__":
    main()
