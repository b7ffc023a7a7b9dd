"""A stand-in for the real funes binary, for funes-mode tests: same command line, same outputs,
same `$FUNES_HOME` layout (../shared/reference/funes-contract.md; `forget` from the 1.8.0
command line in docs/contracts.md), and nothing of the embedded engine's (no chunks.sqlite3).

Stdlib only, so it starts in milliseconds. Ranking is word overlap, then recency; every chunk is
a candidate, so like funes' dense leg it returns k hits whenever the memory holds k chunks.

Layout written by `index`:
    $FUNES_HOME/memory/chunks.lance/{data/<n>.jsonl, _versions/<n>.manifest, _indices/, _transactions/}
    $FUNES_HOME/state.json, index-coverage.json, store.lock
Run through a wrapper (`#!/bin/sh exec <python> fake_funes.py "$@"`) that the tests write.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import sys
import time
from pathlib import Path

VERSION = "1.8.0"
NO_INDEX = ("no index yet — run `funes add <agent>` to build one (or `funes index`), "
            "then recall your own history")
CONTENTION = "another funes memory operation is in progress; retry in a moment"
WORD = re.compile(r"[\w-]+", re.UNICODE)


class Failure(Exception):
    pass


def funes_home() -> Path:
    return Path(os.environ.get("FUNES_HOME") or Path.home() / ".funes")


# ---- the table: fragments of rows, one manifest per version ---------------------------------
def table(memory: Path) -> Path:
    return memory / "chunks.lance"


def current_manifest(memory: Path) -> dict | None:
    versions = sorted(table(memory).glob("_versions/*.manifest"), key=lambda p: int(p.stem))
    return json.loads(versions[-1].read_text()) if versions else None


def load_rows(memory: Path) -> list[dict]:
    manifest = current_manifest(memory)
    if manifest is None:
        return []
    rows = []
    for fragment in manifest["fragments"]:
        with open(table(memory) / "data" / fragment) as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    return rows


def commit(memory: Path, fragments: list[str]) -> None:
    t = table(memory)
    for sub in ("data", "_versions", "_indices", "_transactions"):
        (t / sub).mkdir(parents=True, exist_ok=True)
    manifest = current_manifest(memory)
    version = (manifest["version"] if manifest else 0) + 1
    tmp = t / "_versions" / f".{version}.tmp"
    tmp.write_text(json.dumps({"version": version, "fragments": fragments}))
    os.replace(tmp, t / "_versions" / f"{version}.manifest")  # the commit point
    (t / "_transactions" / f"{version}.txn").write_text("append\n")


def write_fragment(memory: Path, rows: list[dict]) -> str:
    (table(memory) / "data").mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns()}-{os.getpid()}.jsonl"
    with open(table(memory) / "data" / name, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return name


def resolve_memory(arg: str | None) -> tuple[Path, bool]:
    """The memory dir and whether it was named explicitly."""
    return (Path(arg), True) if arg and arg.strip() else (funes_home() / "memory", False)


def require_index(memory: Path, explicit: bool) -> list[dict]:
    if current_manifest(memory) is None:
        raise Failure(f"no index found at {memory}" if explicit else NO_INDEX)
    return load_rows(memory)


# ---- commands ---------------------------------------------------------------------------------
def cmd_index(src: Path) -> str:
    home = funes_home()
    home.mkdir(parents=True, exist_ok=True)
    lock = open(home / "store.lock", "a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise Failure(CONTENTION) from None
    memory = home / "memory"
    state_file = home / "state.json"
    manifest = current_manifest(memory)
    # A deleted memory/ is funes' rebuild path: every source is read again.
    state = json.loads(state_file.read_text()) if state_file.exists() and manifest else {"sources": {}}
    known = {r["id"] for r in load_rows(memory)}
    fragments = list(manifest["fragments"]) if manifest else []
    read = skipped = added = 0
    for path in sorted(src.rglob("*.funes.jsonl")):
        st = path.stat()
        sig = [st.st_size, st.st_mtime_ns]
        if state["sources"].get(str(path)) == sig:
            skipped += 1
            continue
        read += 1
        new = [r for r in parse_source(path) if r["id"] not in known]
        if new:  # funes is append-only: one fragment (one version) per unit
            fragments.append(write_fragment(memory, new))
            known.update(r["id"] for r in new)
            added += len(new)
        state["sources"][str(path)] = sig
    if added or manifest is None:
        commit(memory, fragments)
    state_file.write_text(json.dumps(state, indent=2))
    (home / "index-coverage.json").write_text(json.dumps({"pending": []}))
    return f"indexed sessions={read} skipped={skipped} chunks={added}\n"


def parse_source(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            turn = json.loads(line)
        except ValueError:
            continue
        for i, block in enumerate(turn.get("blocks") or []):
            text = block.get("text") or ""
            if text.strip():
                rows.append({"id": f"{turn['session_id']}:{turn['turn_uuid']}:{i}", "text": text,
                             "session_id": turn["session_id"], "workdir": turn.get("workdir") or "",
                             "turn_uuid": turn["turn_uuid"], "seq": int(turn.get("seq", 0)), "ts": turn.get("ts", ""),
                             "role": turn.get("role", ""), "block_type": block.get("block_type", "text"),
                             "harness": turn.get("harness", ""), "source_path": str(path)})
    return rows


def _epoch(ts: str) -> float:
    try:
        return time.mktime(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
    except ValueError:
        return time.time()


def cmd_recall(query: str, k: int, memory_arg: str | None) -> str:
    memory, explicit = resolve_memory(memory_arg)
    rows = require_index(memory, explicit)
    words = {w.casefold() for w in WORD.findall(query)}
    if not rows or not words:
        return "no results"
    now = time.time()

    def score(r: dict) -> float:
        overlap = len(words & {w.casefold() for w in WORD.findall(r["text"])}) / len(words)
        age_days = max(0.0, (now - _epoch(r["ts"])) / 86400)
        return (0.1 + overlap) * 0.5 ** (age_days / 30)

    ranked = sorted(rows, key=score, reverse=True)[:k]
    label = str(memory)
    out = []
    for r in ranked:
        where = f"{r['workdir']}/{r['session_id'][:8]}" if r["workdir"] else r["session_id"][:8]
        out.append(f"[{r['ts']}] {r['harness']} {where} {r['block_type']}  score={score(r):.3f}\n"
                   f"  → get {r['session_id']} {r['turn_uuid']} --memory {label}\n{r['text']}\n")
        for n in rows:
            if n["session_id"] == r["session_id"] and abs(n["seq"] - r["seq"]) <= 1 and n["turn_uuid"] != r["turn_uuid"]:
                out.append(f"  ~ [{n['role']} {n['block_type']} seq{n['seq']}] {n['text'][:160]}\n")
        out.append("---\n")
    return "".join(out)


def cmd_status(memory_arg: str | None) -> str:
    memory, _ = resolve_memory(memory_arg)
    if current_manifest(memory) is None:
        return f"memory: {memory}\n{NO_INDEX}.\n"
    rows = load_rows(memory)
    stamp = max(p.stat().st_mtime for p in table(memory).glob("_versions/*.manifest"))
    return (f"memory: {memory}\nchunks: {len(rows)}\nsessions: {len({r['session_id'] for r in rows})}\n"
            f"last indexed: {time.strftime('%Y-%m-%d %H:%M', time.gmtime(stamp))} UTC (just now)\n")


def cmd_forget(session_id: str, memory_arg: str | None) -> str:
    memory, explicit = resolve_memory(memory_arg)
    rows = require_index(memory, explicit)
    keep = [r for r in rows if r["session_id"] != session_id]
    fragment = write_fragment(memory, keep)
    commit(memory, [fragment])  # an Overwrite commit, as scrub does
    for old in (table(memory) / "data").glob("*.jsonl"):  # and old versions cleaned up at once
        if old.name != fragment:
            old.unlink()
    return f"forgot session {session_id}: {len(rows) - len(keep)} chunks removed\n"


# ---- stdio MCP --------------------------------------------------------------------------------
TOOLS = [
    {"name": "recall", "inputSchema": {"type": "object", "required": ["query"], "properties": {
        "query": {"type": "string"}, "k": {"type": "integer"}, "block_type": {"type": "string"},
        "harness": {"type": "string"}, "memory": {"type": "string"}}}},
    {"name": "status", "inputSchema": {"type": "object", "properties": {"memory": {"type": "string"}}}},
]


def serve_mcp(default_memory: str | None) -> None:
    for line in sys.stdin:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "id" not in msg:
            continue  # a notification
        method, params = msg.get("method"), msg.get("params") or {}
        if method == "initialize":
            result = {"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "funes", "version": VERSION}}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": call_tool(params.get("name"), params.get("arguments") or {},
                                                                     default_memory)}], "isError": False}
        else:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": f"unknown method {method}"}}
            print(json.dumps(reply), flush=True)
            continue
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)


def call_tool(name: str, args: dict, default_memory: str | None) -> str:
    memory = args.get("memory") if (args.get("memory") or "").strip() else default_memory
    try:
        if name == "recall":
            return cmd_recall(args["query"], int(args.get("k") or 8), memory)
        if name == "status":
            return cmd_status(memory)
        return f"{name} error: unknown tool"
    except Exception as exc:  # funes: tool errors are text, only the outermost message
        return f"{name} error: {exc}"


# ---- command line -----------------------------------------------------------------------------
def main(argv: list[str]) -> int:
    if argv[:1] == ["--version"]:
        print(f"funes {VERSION}")
        return 0
    command, rest = (argv[0], argv[1:]) if argv else ("", [])
    memory = None
    if "--memory" in rest:
        i = rest.index("--memory")
        memory, rest = rest[i + 1], rest[:i] + rest[i + 2:]
    k = 8
    if command == "recall" and rest[:1] in (["-k"], ["--k"]):
        k, rest = int(rest[1]), rest[2:]
    try:
        if command == "index":
            sys.stdout.write(cmd_index(Path([a for a in rest if a != "--yes"][0])))
        elif command == "recall" and rest:
            sys.stdout.write(cmd_recall(" ".join(rest), k, memory))
        elif command == "status":
            sys.stdout.write(cmd_status(rest[0] if rest else memory))
        elif command == "forget" and rest:
            sys.stdout.write(cmd_forget(rest[0], memory))
        elif command == "mcp":
            serve_mcp(rest[0] if rest else memory)
        else:
            print(f"error: unrecognized subcommand '{command}'", file=sys.stderr)
            return 2
    except Failure as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
