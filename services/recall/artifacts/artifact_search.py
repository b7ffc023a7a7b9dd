"""Accepted artifacts, searchable with the project's engine: one memory per realm.

Each accepted artifact is one transcript `<artifact_id>.funes.jsonl` (summary, body, appended
entries as turns; its kind as the harness facet) under `DATA_DIR/.artifacts/<sha256(realm)[:24]>/`.
It is rewritten when an artifact is accepted, appended to, superseded or revoked, and the
realm's memory is re-indexed at once, so search sees exactly the accepted set. These memories
live apart from every user's conversation memory: neither search can return the other's data.
"""

from __future__ import annotations

import hashlib
import threading
from datetime import datetime, timezone
from pathlib import Path

from services.recall.artifacts.models import Artifact, Status
from shared.engine.api import Engine, NoIndex
from shared.engine.hybrid_search import RecallParams
from shared.engine.index_run import index_tree
from shared.engine.reembed import needs_reembed, reembed_memory
from shared.engine.transcript import Block, TranscriptTurn, dump_transcript


def _ts(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ArtifactSearch:
    def __init__(self, data_dir: Path, engine: Engine) -> None:
        self.root = data_dir / ".artifacts"
        self.engine = engine
        # One refresh at a time per process: an index run must not list a file another refresh removes.
        self._refreshing = threading.Lock()

    def home(self, realm_id: str) -> Path:
        return self.root / hashlib.sha256(realm_id.encode()).hexdigest()[:24]

    def refresh(self, artifacts: list[Artifact]) -> None:
        """Write (accepted) or remove (anything else) each artifact's transcript, then index."""
        with self._refreshing:
            self._refresh(artifacts)

    def _refresh(self, artifacts: list[Artifact]) -> None:
        for realm_id in {a.realm_id for a in artifacts}:
            src = self.home(realm_id) / "src"
            src.mkdir(parents=True, exist_ok=True)
            for a in (a for a in artifacts if a.realm_id == realm_id):
                path = src / f"{a.artifact_id}.funes.jsonl"
                if a.status is Status.ACCEPTED:
                    tmp = path.with_suffix(".tmp")
                    tmp.write_text(self._transcript(a))
                    tmp.replace(path)
                else:
                    path.unlink(missing_ok=True)
            if needs_reembed(self.home(realm_id), self.engine.embedder):  # after a model change
                reembed_memory(self.home(realm_id), src, self.engine.embedder, lock_wait_s=60)
            index_tree(self.home(realm_id), src, self.engine.embedder, lock_wait_s=60)

    def search(self, realm_id: str, query: str, pool: int, kind: str | None = None) -> tuple[list[str], bool]:
        """Artifact ids (of `kind` only, when given), best first, from the realm's best `pool`
        passages; and whether those were all the passages there are (a larger pool finds no more)."""
        try:
            hits = self.engine.search(self.home(realm_id) / "memory", query,
                                      RecallParams(k=pool, candidates=pool, neighbors=0, harness=kind))
        except NoIndex:
            return [], True
        ordered: dict[str, None] = {}
        for hit in hits:
            ordered.setdefault(hit.row.session_id, None)
        return list(ordered), len(hits) < pool

    @staticmethod
    def _transcript(a: Artifact) -> str:
        parts = [("summary", a.summary, a.updated_at), ("body", f"{a.artifact_path}\n{a.body}", a.created_at)]
        parts += [(f"entry-{e.seq}", e.body, e.created_at) for e in a.entries]
        return dump_transcript([
            TranscriptTurn(session_id=a.artifact_id, turn_uuid=uuid, seq=i, ts=_ts(at), role="artifact",
                           harness=a.artifact_kind, blocks=[Block(text=text)])
            for i, (uuid, text, at) in enumerate(parts)
        ])
