"""What one artifact body costs by its size, around the stored-text limit (RECALL_REALM_MAX_TEXT_BYTES)
and the search index's cap (the first 20,000 characters of a body are indexed).

    .venv/bin/python -m bench.artifact_text_bench

Per body, median of 3 runs, each in a fresh realm on one warm model: how long `accept` takes to
answer (wall time); process CPU (all threads) from
creating the draft until a search finds the artifact — the realm's index refresh embeds what
search reads, whether on the accepting request or after it; bytes stored; bytes of
`get_memory_artifact`'s answer (JSON, as an agent receives it); how much of the body search reads.
The 1 KiB body is the baseline of the same run. `--no-doc` prints without writing the docs (a
before/after run of another checkout).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.report import table, write_section
from services.recall.artifacts.artifact_search import INDEXED_CHARS, ArtifactSearch
from services.recall.artifacts.artifact_store import ArtifactStore
from services.recall.artifacts.models import DraftInput, Role, Target
from services.recall.artifacts.service import ArtifactService, Caller
from services.recall.artifacts.text_limits import DEFAULT_MAX_TEXT_BYTES
from shared.engine.api import Engine

RUNS = 3


def text(alphabet: str, size_bytes: int) -> str:
    """Numbered words of `alphabet`, exactly `size_bytes` of UTF-8 or a character less."""
    words, out, total, n = alphabet.split(), [], 0, 0
    while total < size_bytes:
        word = f"{words[n % len(words)]}{n} "
        out.append(word)
        total += len(word.encode())
        n += 1
    body = "".join(out)
    while len(body.encode()) > size_bytes:
        body = body[:-1]
    return body


CASES = [
    ("baseline: 1 KiB, English", text("retry field contract vendor semantics", 1024)),
    ("20,000 characters, English (all indexed)", text("retry field contract vendor semantics", 20_000)[:INDEXED_CHARS]),
    ("64 KiB, English (the limit)", text("retry field contract vendor semantics", DEFAULT_MAX_TEXT_BYTES)),
    ("64 KiB, Russian (the limit)", text("поле повтора контракт поставщик семантика", DEFAULT_MAX_TEXT_BYTES)),
    ("60,000 bytes, Chinese (20,000 characters)", ("合同重试字段语义供应商" * 2000)[:INDEXED_CHARS]),
    ("256 KiB, English (refused now; limit raised to measure)", text("retry field contract vendor semantics", 256 * 1024)),
]


def accept_cost(embedder, body: str) -> tuple[float, float, int]:
    """One artifact with this body in a fresh realm: accept's wall seconds, process
    CPU seconds from its draft until search finds it, and the bytes of reading it back as an agent does."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        service = ArtifactService(ArtifactStore(f"sqlite:///{root / 'a.sqlite3'}"), ArtifactSearch(root, Engine(embedder=embedder)),
                                  root, max_text_bytes=512 * 1024)
        realm = "bench"
        member, owner = Caller("m", {realm: Role.MEMBER}), Caller("o", {realm: Role.OWNER})
        service.register_entity(member, realm, "contract-7", "Contract 7", "contract")
        started = time.process_time()
        made = service.create_draft(member, realm, DraftInput(
            artifact_path="dossiers/contract-7", artifact_kind="dossier", write_mode="replace", body=body, summary="Contract 7",
            source_ref="bench", source_context={}, targets=[Target(target_kind="entity", target_id="contract-7")]))
        service.submit(member, realm, made.artifact_id)
        wall = time.perf_counter()
        service.accept(owner, realm, made.artifact_id)
        wall = time.perf_counter() - wall
        found = service.search(member, realm, None, None, None, "contract 7", 1)
        cpu = time.process_time() - started
        assert [a["artifact_id"] for a in found] == [made.artifact_id]
        answer = service.get(member, realm, made.artifact_id).model_dump_json()
        return wall, cpu, len(answer.encode())


def main() -> None:
    from shared.engine.embedder import shared_embedder

    embedder = shared_embedder()
    accept_cost(embedder, CASES[0][1])  # warm: the model's sessions, SQLite, tantivy
    rows = []
    for label, body in CASES:
        runs = [accept_cost(embedder, body) for _ in range(RUNS)]
        wall, cpu = (statistics.median(r[i] for r in runs) for i in range(2))
        size = len(body.encode())
        indexed = min(len(body), INDEXED_CHARS)
        rows.append([label, f"{len(body):,}", f"{size:,}", f"{len(body[:INDEXED_CHARS].encode()):,}",
                     f"{100 * indexed / len(body):.0f} %", f"{wall * 1000:.0f}", f"{cpu:.2f}", f"{runs[0][2]:,}"])
        print(rows[-1], flush=True)
    body = (table(["body", "characters", "bytes stored", "bytes search reads", "share searchable",
                   "accept answers in (wall ms)", "CPU s until searchable", "bytes of get_memory_artifact"],
                  rows) + f"\n\nMedians of {RUNS} runs; load average {os.getloadavg()[0]:.1f} at the end (a shared machine)."
            + f"\n\nDefault limit {DEFAULT_MAX_TEXT_BYTES:,} bytes. Search reads the first {INDEXED_CHARS:,} characters: "
              "at most 60,000 bytes in any script of the Basic Multilingual Plane, so the limit never cuts what search "
              "reads; the CPU until searchable stops growing at the index cap, while what a body costs every reader (the "
              "answer's bytes) keeps growing with it.")
    print(body)
    if "--no-doc" not in sys.argv:
        write_section("artifact-text-bench", "python -m bench.artifact_text_bench", body)


if __name__ == "__main__":
    main()
