"""Optional cross-encoder rerank. None ships (no PyPI package carries one, see the feasibility
report); `RECALL_RERANK_MODEL_DIR` may point at a local ONNX cross-encoder (model.onnx +
tokenizer.json whose output is one relevance logit per pair)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Protocol

import numpy as np

from shared.engine.embedder import EmbedderSettings
from shared.engine.native_threads import ort_session_options

NOT_INSTALLED = "no cross-encoder installed (set RECALL_RERANK_MODEL_DIR to a local ONNX reranker)"


class Reranker(Protocol):
    name: str

    def scores(self, query: str, texts: list[str]) -> np.ndarray:
        """Relevance in [0, 1] for each text."""
        ...


class OnnxCrossEncoder:
    def __init__(self, model_dir: Path) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.name = model_dir.resolve().name
        # It scores one query's candidates per call: query-time threads, never spinning.
        opts = ort_session_options(EmbedderSettings().embed_threads)
        self._session = ort.InferenceSession(str(model_dir / "model.onnx"), opts, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        self._tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self._tok.enable_truncation(512)
        self._tok.enable_padding()
        self._lock = threading.Lock()

    def scores(self, query: str, texts: list[str]) -> np.ndarray:
        with self._lock:
            enc = self._tok.encode_batch([(query, t) for t in texts])
        feeds = {"input_ids": np.array([e.ids for e in enc], dtype=np.int64),
                 "attention_mask": np.array([e.attention_mask for e in enc], dtype=np.int64)}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.array([e.type_ids for e in enc], dtype=np.int64)
        logits = np.asarray(self._session.run(None, feeds)[0], dtype=np.float32).reshape(len(texts), -1)[:, 0]
        return 1.0 / (1.0 + np.exp(-logits))


_loaded: dict[str, Reranker] = {}
_lock = threading.Lock()


def configured_reranker() -> Reranker | None:
    model_dir = os.environ.get("RECALL_RERANK_MODEL_DIR")
    if not model_dir:
        return None
    with _lock:
        if model_dir not in _loaded:
            _loaded[model_dir] = OnnxCrossEncoder(Path(model_dir))
        return _loaded[model_dir]


def reranker_status() -> str:
    model_dir = os.environ.get("RECALL_RERANK_MODEL_DIR")
    return f"reranker: {Path(model_dir).name} (used when the pool is at least 4x k)" if model_dir else f"reranker: {NOT_INSTALLED}"
