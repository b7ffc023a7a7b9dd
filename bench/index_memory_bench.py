"""Peak memory and CPU of indexing one pasted turn: terminal output full of colour codes, CJK
text (a token per character: every chunk at e5's 512 tokens) and English prose, each indexed
alone in a fresh process, with the shipped attention budget (`embedder.ATTENTION_BUDGET`) and
with none, as runs were cut before (32 rows whatever their width).

    python -m bench.index_memory_bench [--chars 150000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.report import table, write_section

PASTES = {
    "colour codes (ANSI)": "\x1b[31m",
    "CJK text": "漢字の文章",
    "English prose": "the pump on line four overheats again after the seal was replaced ",
}

PROBE = """
import json, resource, sys, time
from pathlib import Path
import shared.engine.embedder as embedder_module
from bench.locomo_bench import write_transcript
from shared.engine.embedder import shared_embedder
from shared.engine.index_run import index_tree
from shared.engine.transcript import Block, TranscriptTurn

work, unit, chars, bounded = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4] == "bounded"
text = (unit * (chars // len(unit) + 1))[:chars]
if not bounded:
    embedder_module.ATTENTION_BUDGET = 10 ** 12
(work / "src").mkdir(parents=True)
turn = TranscriptTurn(session_id="paste", turn_uuid="paste-0", seq=0, ts="2026-11-20T10:00:00Z", role="tool",
                      harness="chat", blocks=[Block(block_type="text", text=text)])
write_transcript(work / "src", "paste", [turn])
embedder = shared_embedder()
embedder.embed(["warm up"])
before = resource.getrusage(resource.RUSAGE_SELF)
cpu = time.process_time()
index_tree(work / "home", work / "src", embedder)
print(json.dumps({"cpu_s": time.process_time() - cpu, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                  "start_mib": before.ru_maxrss // 1024}))
"""


def measure(unit: str, chars: int, bounded: bool) -> dict:
    """The pasted text is built in the probe: one argument holds at most 128 KiB."""
    with tempfile.TemporaryDirectory() as work:
        out = subprocess.run([sys.executable, "-c", PROBE, work, unit, str(chars), "bounded" if bounded else "unbounded"],
                             capture_output=True, text=True, check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chars", type=int, default=150_000)
    ap.add_argument("--no-doc", action="store_true", help="print the table, do not write docs/benchmarks.md")
    args = ap.parse_args()
    rows = []
    for name, unit in PASTES.items():
        for bounded in (False, True):
            m = measure(unit, args.chars, bounded)
            rows.append([name, "shipped budget" if bounded else "none (before)", m["start_mib"], m["peak_mib"],
                         f"{m['cpu_s']:.1f}"])
            print(rows[-1], flush=True)
    body = (f"One turn of {args.chars:,} characters indexed alone in a fresh process (e5 loaded and warm first: "
            "`RSS before`); peak RSS is the process's maximum.\n\n"
            + table(["pasted turn", "attention budget", "RSS before (MiB)", "peak RSS (MiB)", "index CPU (s)"], rows))
    print(body)
    if not args.no_doc:
        write_section("index-memory", f"python -m bench.index_memory_bench --chars {args.chars}", body)


if __name__ == "__main__":
    main()
