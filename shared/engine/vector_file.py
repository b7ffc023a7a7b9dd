"""The dense leg's compact copy of a memory's vectors: one contiguous, memory-mapped file.

`<memory>/vectors.i8` is a snapshot of every live row at one committed SQLite generation,
derived from `chunks.sqlite3` (which keeps the float32 vectors and stays the truth):

    "RECALLV1" | u32 header length | JSON header (generation, max_row_id, n, dim, facet names,
    section offsets) | row ids int64[n] (ascending) | scale float32[n] | bias int32[n] |
    block code int32[n] | harness code int32[n] | ts_epoch float64[n] | int8 matrix [dim, n] |
    conversation code int64[n] (`conversation_code` of the row's session id) | rows uint8 [n, dim] |
    stem start int64[n + 1] | stem ids int32[m] | vocabulary (the stems, UTF-8, one per line) |
    centre float32[dim] | nibbles uint8 [n, dim / 2] | nibble scale float32[n, dim / 128]

Row i's BM25 stems (text_analysis.turn_stems, as SQLite's `chunk_stems` holds them) are the
vocabulary's lines `stem_ids[stem_start[i]:stem_start[i + 1]]`, stamped with the analyzer that
made them: conversation evidence reads which query stems a turn holds here instead of stemming
its text on every recall.

A file written before the conversation codes, the row-major rows or the stems has no such
section (`VectorFile.conversation` or `stem_ids` is None; `rows` a copy) and stays readable: the
reader then reads the session ids from SQLite, copies the rows out of the matrix and stems the
turns' texts; the next index run rewrites it. Sections are found by name in the header, so a
release that does not know a section reads the file without it.

Each row is quantised to int8 with its own scale (max |x| / 127) and stored twice, as the two
scans read it (`Scanner`): row-major as uint8 (the value + 128), which one shared onnxruntime
`MatMulInteger` reads as it is mapped (zero point 128) on a snapshot's first calls; and
transposed as int8, which a snapshot searched often gets packed once into its own session's
kernel layout (a little faster per call, n x dim bytes of RAM). Both give the same integer
scores. The scores only choose candidates: the best of them are re-scored exactly from the
float32 vectors. (`bias` is kept for releases that scanned with a +64 query offset.)

A snapshot whose int8 rows outgrow a last-level cache (`PREFILTER_MIN_BYTES`) also holds them
in 4 bits: each row minus the snapshot's mean row (`centre`), in blocks of 128 with a scale each
(`nibbles`, `nibble_scale`; onnxruntime's `MatMulNBits` layout). Such a snapshot, once searched
often, is scanned in 4 bits first: its best `PREFILTER_ROWS` rows get their int8 scores from the
mapped rows, and the best of those go on to the exact re-score. Half the bytes per call; on 240k
real e5 rows every question's final 30 were the int8 scan's (docs/benchmarks.md, round 21).

A reader opens it with `mmap` (no per-row work, no private copy: the pages are the page
cache, shared by every process reading the memory) and catches up from SQLite for what came
after the snapshot's generation. The writer (index run, memory lock held) builds a new file
beside the old one, fsyncs it and renames it over `vectors.i8` only after the SQLite commit,
so a reader never sees a half-written file and a snapshot is never ahead of SQLite.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import sqlite3
import struct
import threading
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from shared.engine.native_threads import ort_session_options
from shared.engine.text_analysis import ANALYZER, fts_text, turn_stems

_log = logging.getLogger("recall.engine.vectors")

VECTOR_FILE = "vectors.i8"
MAGIC = b"RECALLV1"
_ALIGN = 64
_BATCH = 8192
# AVX2's u8 x s8 multiply-add saturates int16 pair sums: with a 7-bit query (-63..63) against
# rows of 1..255 every pair stays below 2 * 255 * 63 < 2^15, so the integer scores are exact.
QUERY_LEVELS = 63
QUERY_OFFSET = 64  # the packed scan's query as uint8 (1..127: u8 x s8 pairs below 2^15 again)
ROW_OFFSET = 128  # a row's int8 values stored as uint8 (u8 x s8 is the fast integer product)
# The 4-bit copy is written for snapshots whose int8 rows take at least this much: past a
# last-level cache (32 MiB on these hosts, 87k rows of 384) every scan streams them from RAM and
# evicts the query model's weights. Smaller ones stay on the int8 scan alone.
PREFILTER_MIN_BYTES = 32 << 20
NIBBLE_BLOCK = 128
# How many rows of the 4-bit scan get their int8 score: at least PREFILTER_ROWS, and 16 per row
# of the re-score pool. On 240k real e5 rows and 400 questions the worst 4-bit rank of a final
# top-30 row (a pool of 120) was 672 (round 21): 2048 keeps a 3x margin there, and their int8
# scores cost ~1 ms (against ~6 ms for the int8 scan of all 240k). A larger pool keeps the same
# ratio, so the 4-bit pass never picks the pool by itself.
PREFILTER_ROWS = 2048
PREFILTER_ROWS_PER_POOL_ROW = 16


@dataclass(frozen=True)
class VectorFile:
    """An open, read-only snapshot. Arrays are views on the mapping (never copied)."""

    path: Path
    inode: int
    memory_id: str  # the SQLite memory it was taken from (meta `memory_id`)
    generation: int
    max_row_id: int
    dim: int
    block_types: list[str]
    harnesses: list[str]
    ids: np.ndarray
    scale: np.ndarray
    block: np.ndarray
    harness: np.ndarray
    epoch: np.ndarray
    rows: np.ndarray  # uint8 [n, dim]: each int8 value + ROW_OFFSET
    matrix_t: np.ndarray  # int8 [dim, n]: the same values, transposed for the packed scan
    conversation: np.ndarray | None  # int64 [n]; None in a file written before it
    mapped_bytes: int
    _map: mmap.mmap
    owned_bytes: int = 0  # RAM of rows copied out of the matrix of a file written before they were
    stem_start: np.ndarray | None = None  # int64 [n + 1]; None in a file written before the stems
    stem_ids: np.ndarray | None = None  # int32 [m]
    vocabulary_bytes: np.ndarray | None = None  # uint8: the stems, one per line
    stems_analyzer: str = ""
    centre: np.ndarray | None = None  # float32 [dim]; None in a snapshot without the 4-bit copy
    nibbles: np.ndarray | None = None  # uint8 [n, dim / 2]
    nibble_scale: np.ndarray | None = None  # float32 [n, dim / NIBBLE_BLOCK]
    scanner: "Scanner" = field(default_factory=lambda: Scanner(), compare=False, repr=False)
    _vocabulary: list = field(default_factory=list, compare=False, repr=False)

    @property
    def n(self) -> int:
        return len(self.ids)

    @property
    def held_bytes(self) -> int:
        """What a reader of this snapshot keeps in memory: the mapped file but the parts it reads
        once (the int8 columns, or the 4-bit copy, to pack them; the rows are then read only
        where the 4-bit scan's best rows are), the copy of an older file's rows, and the packed scan."""
        four_bit = 0 if self.nibbles is None else self.nibbles.nbytes + self.nibble_scale.nbytes
        unused = (0 if self.owned_bytes else self.n * self.dim) + four_bit
        return self.mapped_bytes - unused + self.owned_bytes + self.scanner.packed_bytes

    @property
    def has_prefilter(self) -> bool:
        return self.nibbles is not None

    def vocabulary(self) -> dict[str, int]:
        """Stem -> id, read on first use (racing callers build the same dict)."""
        if not self._vocabulary:
            blob = self.vocabulary_bytes.tobytes().decode("utf-8", "surrogatepass") if self.vocabulary_bytes is not None else ""
            self._vocabulary[:] = [{stem: i for i, stem in enumerate(blob.split("\n")) if stem}]
        return self._vocabulary[0]

    def vocabulary_ram_bytes(self) -> int:
        """About what the vocabulary dict holds once read (a short str and an int per stem)."""
        return 0 if not self._vocabulary else 120 * len(self._vocabulary[0])


def conversation_code(session_id: str) -> int:
    """A conversation's number: the same in every process and file, never 0 (0 = unknown),
    positive in int64; 62 bits of BLAKE2b, so two conversations of one memory never share one
    in practice (a clash would only merge their conversation-level evidence)."""
    digest = hashlib.blake2b(session_id.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 62) - 1) | 1


def _sections(n: int, dim: int) -> list[tuple[str, str, tuple[int, ...]]]:
    return [("ids", "<i8", (n,)), ("scale", "<f4", (n,)), ("bias", "<i4", (n,)), ("block", "<i4", (n,)),
            ("harness", "<i4", (n,)), ("epoch", "<f8", (n,)), ("matrix_t", "i1", (dim, n)),
            ("conversation", "<i8", (n,)), ("rows", "u1", (n, dim))]


def _stem_sections(n: int, stems: dict) -> list[tuple[str, str, tuple[int, ...]]]:
    return [("stem_start", "<i8", (n + 1,)), ("stem_ids", "<i4", (int(stems["count"]),)),
            ("vocabulary_bytes", "u1", (int(stems["vocabulary_bytes"]),))]


def _nibble_sections(n: int, dim: int) -> list[tuple[str, str, tuple[int, ...]]]:
    return [("centre", "<f4", (dim,)), ("nibbles", "u1", (n, dim // 2)), ("nibble_scale", "<f4", (n, dim // NIBBLE_BLOCK))]


def wants_prefilter(n: int, dim: int) -> bool:
    return n * dim >= PREFILTER_MIN_BYTES and dim % NIBBLE_BLOCK == 0


def _layout(n: int, dim: int, header_room: int, sections=None) -> tuple[dict[str, int], int]:
    offsets, pos = {}, header_room
    for name, dtype, shape in sections or _sections(n, dim):
        pos = -(-pos // _ALIGN) * _ALIGN
        offsets[name] = pos
        pos += int(np.dtype(dtype).itemsize * int(np.prod(shape)))
    return offsets, pos


def open_vector_file(memory: Path, dim: int) -> VectorFile | None:
    """The current snapshot, or None when there is none (or it does not fit this memory)."""
    path = memory / VECTOR_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_size < 12:
            return None
        mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)
    if mapping[:8] != MAGIC:
        return None
    try:
        (hlen,) = struct.unpack("<I", mapping[8:12])
        header = json.loads(mapping[12 : 12 + hlen])
        n = int(header["n"])
        if int(header["dim"]) != dim:
            return None
        offsets = header["offsets"]
        stems = header.get("stems")
        sections = (_sections(n, dim) + (_stem_sections(n, stems) if stems else [])
                    + (_nibble_sections(n, dim) if "nibbles" in offsets else []))
        # numpy refuses a section that runs past the end: a truncated file is never read past it.
        arrays = {name: np.ndarray(shape, dtype=np.dtype(dtype), buffer=mapping, offset=offsets[name]) if name in offsets else None
                  for name, dtype, shape in sections}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:  # damaged: SQLite alone until an index run rewrites it
        _log.warning("vector snapshot %s unreadable (%s): searching SQLite alone", path, exc)
        return None
    arrays.pop("bias")  # for releases that scanned with a +64 query offset
    owned = 0
    if arrays["rows"] is None:  # written before the rows were: a copy until the next index run
        arrays["rows"] = rows_of(arrays["matrix_t"].T)
        owned = arrays["rows"].nbytes
    return VectorFile(path=path, inode=st.st_ino, memory_id=header.get("memory_id", ""), generation=int(header["generation"]),
                      max_row_id=int(header["max_row_id"]), dim=dim, block_types=header["block_types"],
                      harnesses=header["harnesses"], mapped_bytes=st.st_size, _map=mapping,
                      owned_bytes=owned, stems_analyzer=stems["analyzer"] if stems else "", **arrays)


def current_identity(memory: Path) -> tuple[int, int] | None:
    """(inode, size) of the current snapshot file, None when there is none. Index runs replace the
    file (a new inode), never change it: the same inode with another size was changed in place
    (a copy or restore over a live memory), and its mapping must not be read again — past a
    truncated end a read is SIGBUS, which kills the whole process."""
    try:
        st = os.stat(memory / VECTOR_FILE)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size


def quantise_rows(vecs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 rows and their scales (max |x| / 127 per row)."""
    scale = np.maximum(np.abs(vecs).max(axis=1), 1e-12).astype(np.float32) / 127.0
    q = np.rint(vecs / scale[:, None]).astype(np.int8)
    return q, scale


def rows_of(q: np.ndarray) -> np.ndarray:
    """int8 rows as the file stores them: uint8, value + ROW_OFFSET (flipping the sign bit), C order."""
    return np.ascontiguousarray(q).view(np.uint8) ^ np.uint8(ROW_OFFSET)


def write_vector_file(memory: Path, conn: sqlite3.Connection, dim: int) -> bool:
    """Snapshot the committed rows of `conn` into `vectors.i8` (memory lock held by the caller,
    who has made sure the `chunk_stems` table exists).

    Streams the rows in batches into a file beside the old one, fsyncs, then renames it into
    place: readers see the old snapshot or the new one, never a mix."""
    tmp = memory / f".{VECTOR_FILE}.writing"
    conn.execute("BEGIN")
    try:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        n = int(conn.execute("SELECT COUNT(*) FROM chunks").fetchone()[0])
        block_types: dict[str, int] = {}
        harnesses: dict[str, int] = {}
        header = {"generation": int(meta["generation"]), "max_row_id": int(meta["max_row_id"]), "n": n, "dim": dim,
                  "memory_id": meta.get("memory_id", "")}
        # Facet names are only known after the scan: leave room for them in a fixed-size header.
        room = 4096
        offsets, size = _layout(n, dim, room)
        with open(tmp, "wb") as f:
            f.truncate(size)
        out = np.memmap(tmp, dtype=np.uint8, mode="r+", shape=(size,))
        arrays = {name: np.ndarray(shape, dtype=np.dtype(dtype), buffer=out, offset=offsets[name])
                  for name, dtype, shape in _sections(n, dim)}
        # Each row's stems as written with it; a row written before `chunk_stems` existed is
        # stemmed here (and its stems stored below, once). Stems of another analyzer than this
        # code's are left out: readers would stem the texts anyway.
        analyzer = meta.get("fts_analyzer", "")
        with_stems = analyzer == ANALYZER
        cur = conn.execute("SELECT c.row_id, c.vector, c.block_type, c.harness, c.ts_epoch, c.session_id, s.stems,"
                           " CASE WHEN s.stems IS NULL THEN c.text END, c.ts"
                           " FROM chunks c LEFT JOIN chunk_stems s ON s.row_id = c.row_id ORDER BY c.row_id")
        vocabulary: dict[str, int] = {}
        prefilter = wants_prefilter(n, dim)
        row_sum = np.zeros(dim, np.float64)  # of the int8 rows as stored: the 4-bit copy's centre
        stem_ids = array("i")
        stem_start = array("q", [0])
        stemmed: list[tuple[int, str]] = []
        at = 0
        while rows := cur.fetchmany(_BATCH):
            sl = slice(at, at + len(rows))
            vecs = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), dim)
            q, scale = quantise_rows(vecs)
            if prefilter:
                row_sum += (q.astype(np.float32) * scale[:, None]).sum(axis=0)
            arrays["ids"][sl] = [r[0] for r in rows]
            arrays["scale"][sl] = scale
            arrays["block"][sl] = [block_types.setdefault(r[2], len(block_types)) for r in rows]
            arrays["harness"][sl] = [harnesses.setdefault(r[3], len(harnesses)) for r in rows]
            arrays["epoch"][sl] = [np.nan if r[4] is None else r[4] for r in rows]
            arrays["bias"][sl] = QUERY_OFFSET * q.sum(axis=1, dtype=np.int32)
            arrays["rows"][sl] = rows_of(q)
            arrays["matrix_t"][:, sl] = q.T
            arrays["conversation"][sl] = [conversation_code(r[5]) for r in rows]
            if with_stems:
                batch_stems = [r[6] for r in rows]
                for i, r in enumerate(rows):
                    if r[6] is None:
                        batch_stems[i] = turn_stems(fts_text(r[7], r[8]))
                        stemmed.append((r[0], batch_stems[i]))
                tokens = " ".join(batch_stems).split()
                for t in dict.fromkeys(tokens):
                    if t not in vocabulary:
                        vocabulary[t] = len(vocabulary)
                stem_ids.extend(map(vocabulary.__getitem__, tokens))
                ends = np.cumsum([stems.count(" ") + 1 if stems else 0 for stems in batch_stems]) + stem_start[-1]
                stem_start.extend(ends.tolist())
            at += len(rows)
    finally:
        conn.execute("COMMIT")
    end = size
    if with_stems:
        vocab_blob = "\n".join(vocabulary).encode("utf-8", "surrogatepass")
        stems_header = {"analyzer": analyzer, "count": len(stem_ids), "vocabulary_bytes": len(vocab_blob)}
        stem_offsets, end = _layout(n, dim, size, _stem_sections(n, stems_header))
        with open(tmp, "r+b") as f:
            f.truncate(end)
            for name, data in (("stem_start", stem_start), ("stem_ids", stem_ids), ("vocabulary_bytes", vocab_blob)):
                f.seek(stem_offsets[name])
                f.write(bytes(data) if isinstance(data, bytes) else data.tobytes())
        offsets = {**offsets, **stem_offsets}
        header["stems"] = stems_header
    if prefilter:
        nibble_offsets, end = _layout(n, dim, end, _nibble_sections(n, dim))
        centre = (row_sum / max(n, 1)).astype(np.float32)
        _write_nibbles(tmp, nibble_offsets, end, arrays["rows"], arrays["scale"], centre)
        offsets = {**offsets, **nibble_offsets}
    header.update(block_types=list(block_types), harnesses=list(harnesses), offsets=offsets)
    blob = json.dumps(header).encode()
    if 12 + len(blob) > room:  # thousands of distinct harness names: no snapshot, readers use SQLite
        del out, arrays
        tmp.unlink(missing_ok=True)
        # The last snapshot would only lag further, and after a forget it holds forgotten rows.
        (memory / VECTOR_FILE).unlink(missing_ok=True)
        return False
    out[:8] = np.frombuffer(MAGIC, np.uint8)
    out[8:12] = np.frombuffer(struct.pack("<I", len(blob)), np.uint8)
    out[12 : 12 + len(blob)] = np.frombuffer(blob, np.uint8)
    out.flush()
    del out, arrays
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, memory / VECTOR_FILE)
    dir_fd = os.open(memory, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    if stemmed:  # once: the next snapshot reads them
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany("INSERT OR IGNORE INTO chunk_stems (row_id, stems) VALUES (?, ?)", stemmed)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return True


def quantise_nibbles(rows: np.ndarray, scale: np.ndarray, centre: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stored int8 rows (uint8, `rows_of`) → their 4-bit copy: each row minus `centre` in blocks
    of NIBBLE_BLOCK, each block's values scaled to -8..7 by its largest |value| / 7 and stored + 8,
    two to a byte, the first in the low nibble (`MatMulNBits`' layout). Returns (nibbles uint8
    [n, dim / 2], scales float32 [n, dim / NIBBLE_BLOCK])."""
    x = (rows.astype(np.float32) - ROW_OFFSET) * scale[:, None] - centre
    blocks = x.reshape(len(x), -1, NIBBLE_BLOCK)
    scales = np.maximum(np.abs(blocks).max(axis=2), 1e-12) / 7.0
    values = (np.clip(np.rint(blocks / scales[..., None]), -8, 7) + 8).astype(np.uint8).reshape(len(x), -1)
    return values[:, 0::2] | (values[:, 1::2] << 4), scales.astype(np.float32)


def _write_nibbles(tmp: Path, offsets: dict[str, int], end: int, rows: np.ndarray, scale: np.ndarray,
                   centre: np.ndarray) -> None:
    """The 4-bit copy of the snapshot's rows, centred on their mean row `centre` (the part every
    row shares says nothing about which rows are nearest, and 4 bits go further on what is left)."""
    n, dim = rows.shape
    with open(tmp, "r+b") as f:
        f.truncate(end)
    out = np.memmap(tmp, dtype=np.uint8, mode="r+", shape=(end,))
    arrays = {name: np.ndarray(shape, dtype=np.dtype(dtype), buffer=out, offset=offsets[name])
              for name, dtype, shape in _nibble_sections(n, dim)}
    arrays["centre"][:] = centre
    for at in range(0, n, _BATCH):
        sl = slice(at, at + _BATCH)
        arrays["nibbles"][sl], arrays["nibble_scale"][sl] = quantise_nibbles(rows[sl], scale[sl], centre)
    out.flush()
    del out, arrays


# ---- scanning ------------------------------------------------------------------------------------
def _pb_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _pb_field(field: int, payload: bytes | int) -> bytes:
    if isinstance(payload, int):
        return _pb_varint(field << 3) + _pb_varint(payload)
    return _pb_varint(field << 3 | 2) + _pb_varint(len(payload)) + payload


def _pb_tensor(name: str, elem_type: int, dims: list[str]) -> bytes:
    shape = b"".join(_pb_field(1, _pb_field(2, d.encode()) if not d.isdigit() else _pb_field(1, int(d))) for d in dims)
    return _pb_field(1, name.encode()) + _pb_field(2, _pb_field(1, _pb_field(1, elem_type) + _pb_field(2, shape)))


def _pb_external(name: str, elem_type: int, dims: list[int], length: int) -> bytes:
    """A graph's initializer (field 5) whose bytes the session's caller supplies
    (`add_external_initializers`). TensorProto: dims, data_type, name, external_data,
    data_location EXTERNAL."""
    external = b"".join(_pb_field(13, _pb_field(1, k.encode()) + _pb_field(2, v.encode()))
                        for k, v in (("location", name), ("offset", "0"), ("length", str(length))))
    return _pb_field(5, b"".join(_pb_field(1, d) for d in dims) + _pb_field(2, elem_type) + _pb_field(8, name.encode())
                     + external + _pb_field(14, 1))


def _scan_model(packed: tuple[int, int] | None = None) -> bytes:
    """ONNX model of one `MatMulInteger` with A's zero point `A0`, encoded by hand (a dozen
    protobuf fields) so the engine needs no `onnx` package. Shared: `Y[n, 1] = (A uint8 [n, d] -
    A0) x B int8 [d, 1]`, the mapped rows times the query. With `packed` = (d, n): `Y[1, n] =
    (A uint8 [1, d] - A0) x B int8 [d, n]`, B an initializer whose bytes the caller supplies
    (external data, the mapped columns), which onnxruntime packs once."""
    node = b"".join(_pb_field(f, v.encode()) for f, v in ((1, "A"), (1, "B"), (1, "A0"), (2, "Y"), (3, "scan"),
                                                          (4, "MatMulInteger")))
    if packed is None:
        inputs, initializer, out = [_pb_tensor("A", 2, ["n", "d"]), _pb_tensor("B", 3, ["d", "1"])], b"", ["n", "1"]
    else:
        dim, n = packed
        initializer = _pb_external("B", 3, [dim, n], dim * n)
        inputs, out = [_pb_tensor("A", 2, ["1", "d"])], ["1", "n"]
    graph = (_pb_field(1, node) + _pb_field(2, b"int8_scan") + b"".join(_pb_field(11, t) for t in inputs)
             + _pb_field(11, _pb_tensor("A0", 2, [])) + initializer + _pb_field(12, _pb_tensor("Y", 6, out)))
    opset = _pb_field(1, b"") + _pb_field(2, 13)
    return _pb_field(1, 8) + _pb_field(8, opset) + _pb_field(7, graph)


def _scan_options():
    # The scan is memory-bound: a second thread halves wall time but adds CPU per call.
    return ort_session_options(1)


_session = None
_session_lock = threading.Lock()
_ROW_ZERO = np.array(ROW_OFFSET, np.uint8)
_QUERY_ZERO = np.array(QUERY_OFFSET, np.uint8)


def _scan_session():
    global _session
    with _session_lock:
        if _session is None:
            import onnxruntime as ort

            _session = ort.InferenceSession(_scan_model(), _scan_options(), providers=["CPUExecutionProvider"])
        return _session


# A snapshot scanned this many times gets its own session holding its columns as a constant,
# which onnxruntime packs once into its kernel's layout (10k conversations, 60k rows: 0.88 ms
# per scan alone against 1.04 for the mapped rows, and less cache lost to the model's runs:
# docs/benchmarks.md, round 15). Packing costs about 6 ms of CPU and n * dim bytes of RAM per
# 1,000 conversations, so only a memory searched repeatedly pays it; the mapped pages it no
# longer reads stay reclaimable page cache.
PACK_AFTER_SCANS = 16


class Scanner:
    """How one snapshot is scanned: its mapped rows by the shared session first; once hot, its
    own packed session: of the int8 columns, or of the 4-bit copy where the file holds one (then
    only the prefilter's best rows get int8 scores, the same values the full scan gives them)."""

    def __init__(self) -> None:
        self.scans = 0
        self.packed = None  # onnxruntime session with this snapshot's columns packed
        self.prefilter = None  # onnxruntime session with this snapshot's 4-bit copy packed
        self.packed_bytes = 0
        self.failed = False
        self._packing = threading.Lock()

    def integer_scores(self, vf: VectorFile, q: np.ndarray) -> np.ndarray:
        if self.packed is None and self.prefilter is None:
            self.scans += 1  # racy on purpose: an approximate count is enough
            if self.scans >= PACK_AFTER_SCANS and not self.failed:
                self._try_pack(vf)
        packed = self.packed
        if packed is not None:
            return packed.run(None, {"A": (q.T + QUERY_OFFSET).astype(np.uint8), "A0": _QUERY_ZERO})[0][0]
        return _scan_session().run(None, {"A": vf.rows, "B": q, "A0": _ROW_ZERO})[0][:, 0]

    def _try_pack(self, vf: VectorFile) -> None:
        if not self._packing.acquire(blocking=False):
            return  # one caller packs; the others keep scanning the shared way meanwhile
        try:
            if vf.has_prefilter and self.prefilter is None:
                self.prefilter = self._pack_prefilter(vf)
            elif not vf.has_prefilter and self.packed is None:
                self.packed = self._pack(vf)
        except Exception as exc:  # no RAM for the copy, say: the shared scan gives the same scores
            self.failed = True
            _log.warning("int8 scan not packed (%s): %s", type(exc).__name__, exc)
        finally:
            self._packing.release()

    def _pack(self, vf: VectorFile):
        import onnxruntime as ort

        opts = _scan_options()
        # Keeps a reference to the mapped columns: the session reads them while packing.
        opts.add_external_initializers(["B"], [ort.OrtValue.ortvalue_from_numpy(vf.matrix_t)])
        session = ort.InferenceSession(_scan_model((vf.dim, vf.n)), opts, providers=["CPUExecutionProvider"])
        self.packed_bytes = vf.dim * vf.n
        return session

    def _pack_prefilter(self, vf: VectorFile):
        import onnxruntime as ort

        opts = _scan_options()
        blocks = vf.nibbles.reshape(vf.n, vf.dim // NIBBLE_BLOCK, NIBBLE_BLOCK // 2)
        opts.add_external_initializers(["B", "S"], [ort.OrtValue.ortvalue_from_numpy(blocks),
                                                    ort.OrtValue.ortvalue_from_numpy(vf.nibble_scale.reshape(-1))])
        session = ort.InferenceSession(_prefilter_model(vf.dim, vf.n), opts, providers=["CPUExecutionProvider"])
        # onnxruntime keeps each block's scale and sum beside its packed nibbles: 240 bytes a row
        # of 384 (measured on 60k and 240k rows), not the 204 of the file's sections.
        self.packed_bytes = vf.nibbles.nbytes + 4 * vf.nibble_scale.nbytes
        return session


def _prefilter_model(dim: int, n: int) -> bytes:
    """`Y[1, n] = A float [1, dim] x the 4-bit rows`: one onnxruntime `MatMulNBits` (its
    activations quantised to int8: accuracy level 4), encoded by hand like `_scan_model` (importing
    `onnx` costs a second or two, inside the call that packs). The rows (B) and their block
    scales (S) are external initializers the caller supplies from the mapping; onnxruntime packs
    them once."""
    attributes = b"".join(_pb_field(5, _pb_field(1, k.encode()) + _pb_field(3, v) + _pb_field(20, 2))  # type INT
                          for k, v in (("K", dim), ("N", n), ("bits", 4), ("block_size", NIBBLE_BLOCK), ("accuracy_level", 4)))
    node = (b"".join(_pb_field(f, v.encode()) for f, v in ((1, "A"), (1, "B"), (1, "S"), (2, "Y"), (3, "prefilter"),
                                                           (4, "MatMulNBits"), (7, "com.microsoft"))) + attributes)
    blocks = dim // NIBBLE_BLOCK
    graph = (_pb_field(1, node) + _pb_field(2, b"prefilter") + _pb_field(11, _pb_tensor("A", 1, ["1", str(dim)]))
             + _pb_external("B", 2, [n, blocks, NIBBLE_BLOCK // 2], n * dim // 2)
             + _pb_external("S", 1, [n * blocks], 4 * n * blocks) + _pb_field(12, _pb_tensor("Y", 1, ["1", str(n)])))
    opsets = _pb_field(8, _pb_field(1, b"") + _pb_field(2, 13)) + _pb_field(8, _pb_field(1, b"com.microsoft") + _pb_field(2, 1))
    return _pb_field(1, 8) + opsets + _pb_field(7, graph)


def quantise_query(qvec: np.ndarray) -> np.ndarray:
    """The query as an int8 column of -63..63 (QUERY_LEVELS), scaled by its largest component."""
    scale = float(max(np.abs(qvec).max(), 1e-12)) / QUERY_LEVELS
    return np.rint(qvec / scale).astype(np.int8)[:, None]


def prefilter_depth(pool: int, allowed: int) -> int | None:
    """How many of the 4-bit scan's best rows get their int8 score for a re-score pool of `pool`
    rows; None where that would be a quarter of the `allowed` rows or more: the int8 scan of
    every row then costs about as much."""
    depth = max(PREFILTER_ROWS, PREFILTER_ROWS_PER_POOL_ROW * pool)
    return depth if 4 * depth < allowed else None


def prefilter_scores(vf: VectorFile, qvec: np.ndarray) -> np.ndarray | None:
    """Every snapshot row's 4-bit similarity estimate, float32 [n], for choosing which rows get
    their int8 score; None where the snapshot has no 4-bit copy or is not searched often enough
    yet to have it packed."""
    session = vf.scanner.prefilter
    if session is None:
        return None
    return session.run(None, {"A": np.asarray(qvec, np.float32)[None, :]})[0][0]


def approximate_scores_at(vf: VectorFile, qvec: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """`approximate_scores` of the rows at `positions` only, with the same values: the shared
    scan's kernel on just those rows (ascending positions read the mapping forward)."""
    integers = _scan_session().run(None, {"A": vf.rows[positions], "B": quantise_query(qvec), "A0": _ROW_ZERO})[0][:, 0]
    return np.multiply(integers, vf.scale[positions], dtype=np.float32)


def approximate_scores(vf: VectorFile, qvec: np.ndarray) -> np.ndarray:
    """Every snapshot row's cosine estimate times a positive constant (int8 scan), float32 [n]:
    for ranking only, so the query's own scale is left out."""
    if vf.n == 0:
        return np.zeros(0, np.float32)
    return np.multiply(vf.scanner.integer_scores(vf, quantise_query(qvec)), vf.scale, dtype=np.float32)
