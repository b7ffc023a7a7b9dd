"""Provenance from the author's own conversations, shown only to a reader entitled to them.

A record may cite passages of its author's conversations (the `cite:` line of a
`recall_my_conversations` passage). On write, each cited turn must exist in the author's own
recorded conversations. On read, the passage's date and verbatim text come back only when the
reader is entitled to that user's memory — the user themself (the token's subject), as for
`recall_my_conversations` — and otherwise the citation is shown as withheld, without ids. A
passage forgotten since (the conversation was deleted) is shown as forgotten.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.recall.agent_memory.models import Citation
from services.recall.artifacts.models import rfc3339
from services.recall.artifacts.rules import RuleBroken
from shared.engine.transcript import TranscriptTurn, parse_ts, read_transcript
from shared.tenant_paths import TenantPaths


class TurnFinder:
    """The cited turns of one user's conversations, each conversation read once however many
    citations name it (20 citations of one long conversation read it 20 times)."""

    def __init__(self, data_dir: Path, user: str) -> None:
        self.paths = TenantPaths.for_user(data_dir, user)
        self.read: dict[str, dict[str, TranscriptTurn]] = {}

    def __call__(self, citation: Citation) -> TranscriptTurn | None:
        if citation.session_id not in self.read:
            path = self.paths.transcript(citation.session_id)
            turns = read_transcript(path).turns if path.is_file() else []
            self.read[citation.session_id] = {t.turn_uuid: t for t in reversed(turns)}  # the first of a repeated id
        return self.read[citation.session_id].get(citation.turn_uuid)


def check_citations(data_dir: Path, author: str, citations: list[Citation]) -> None:
    find_turn = TurnFinder(data_dir, author)
    for i, c in enumerate(citations):
        if find_turn(c) is None:
            raise RuleBroken("citations", f"citations.{i}: turn {c.turn_uuid!r} of session {c.session_id!r} is not in "
                             "your own recorded conversations (cite what recall_my_conversations showed you)")


def show_citations(data_dir: Path, author: str, reader: str, citations: list[Citation]) -> list[dict[str, Any]]:
    if reader != author:
        return [{"status": "withheld", "reason": "the cited passages belong to the author's own conversation memory"}
                for _ in citations]
    shown = []
    find_turn = TurnFinder(data_dir, author)
    for c in citations:
        turn = find_turn(c)
        if turn is None:
            shown.append({"status": "forgotten", "session_id": c.session_id, "turn_uuid": c.turn_uuid})
            continue
        epoch = parse_ts(turn.ts)
        shown.append({"status": "shown", "session_id": c.session_id, "turn_uuid": c.turn_uuid,
                      "date": rfc3339(epoch) if epoch is not None else None, "role": turn.role,
                      "text": "\n\n".join(b.text for b in turn.blocks if b.text)})
    return shown
