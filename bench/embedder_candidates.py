"""Candidate graphs (bench only). e5 graphs, each a change to `shared/engine/e5_graph.py`'s output
that `bench.embedder_profile` measures against the shipped graph: CPU per call and cosine to the
shipped vectors; and a MiniLM whose vectors do not depend on their batch (`minilm_int8_blocks`),
measured by `bench.index_profile`. None is shipped; docs/benchmarks.md ("Where an embedding's CPU
goes", "Round 10") says why.
"""

from __future__ import annotations

import numpy as np

from shared.engine.e5_graph import GraphParts, INT8_ACTIVATIONS, pack_nibbles
from shared.engine.e5_packed import BLOCK, PackedE5


def bias_inside_matmul(model):
    """Each `MatMulNBits → Add(bias)` becomes one MatMulNBits with its optional bias input:
    72 nodes fewer, the same float addition (vectors bit-identical)."""
    graph = model.graph
    producers = {n.output[0]: n for n in graph.node if n.op_type == "MatMulNBits"}
    constants = {t.name for t in graph.initializer}
    kept = []
    for n in graph.node:
        mm = producers.get(n.input[0]) if n.op_type == "Add" else None
        if mm is not None and n.input[1] in constants:
            mm.input.extend(["", "", n.input[1]])
            mm.output[0] = n.output[0]
            continue
        kept.append(n)
    del graph.node[:]
    graph.node.extend(kept)
    return model


def accuracy_level(model, level: int):
    """MatMulNBits computing at another accuracy level (0/1: fp32 activations, no int8 blocks)."""
    for n in model.graph.node:
        for a in n.attribute:
            if n.op_type == "MatMulNBits" and a.name == "accuracy_level":
                a.i = level
    return model


def fused_attention_graph(packed: PackedE5):
    """e5 with onnxruntime's contrib fusions written in: MultiHeadAttention (the padding mask as
    `key_padding_mask`, no Reshape/Transpose around it), SkipLayerNormalization for each residual
    with the projection's bias, BiasGelu, biases inside MatMulNBits. The same arithmetic in
    another order (cosine ≥ 0.9999 to the shipped vectors, not bit-identical)."""
    from onnx import TensorProto, helper

    hidden, heads, eps = packed.hidden, packed.heads, float(packed.layer_norm_eps)
    parts = GraphParts()
    nodes, const, node = parts.nodes, parts.const, parts.node

    def vec(name: str) -> np.ndarray:
        return packed.vector(name).copy()

    def nbits(x: str, weight: str, columns: int, out: str, bias: bool = False) -> str:
        blocks = packed.blocks(weight + ".w", columns)
        inputs = [x, const(out + ".w4", pack_nibbles(blocks)), const(out + ".scale", blocks["scale"].astype(np.float32).reshape(-1))]
        if bias:
            inputs += ["", "", const(out + ".b", vec(weight + ".b"))]
        return node("MatMulNBits", inputs, out, domain="com.microsoft", K=columns, N=len(blocks), bits=4,
                    block_size=BLOCK, accuracy_level=INT8_ACTIVATIONS)

    def skip_ln(x: str, skip: str, bias: np.ndarray, weights: str, out: str) -> str:
        return node("SkipLayerNormalization", [x, skip, const(out + ".g", vec(weights + ".w")), const(out + ".beta", vec(weights + ".b")),
                                               const(out + ".bias", bias)], out, domain="com.microsoft", epsilon=eps)

    words = packed.blocks("emb.word", hidden)
    word = node("GatherBlockQuantized", [const("word.q4", pack_nibbles(words).reshape(len(words), -1)), "input_ids",
                                         const("word.scale", words["scale"].astype(np.float32))],
                "word", domain="com.microsoft", bits=4, block_size=BLOCK, gather_axis=0, quantize_axis=1)
    seq_len = node("Shape", ["input_ids"], "seq_len", start=1, end=2)
    zero = const("zero", np.array([0], np.int64))
    pos = node("Slice", [const("pos.table", packed.vector("emb.pos").reshape(-1, hidden).copy()), zero, seq_len, zero], "pos")
    x = skip_ln(word, pos, packed.vector("emb.type")[:hidden].copy(), "emb.ln", "emb.out")
    mask = node("Cast", ["attention_mask"], "mask.i32", to=TensorProto.INT32)
    for i in range(packed.layers):
        p = f"l{i}"
        q, k, v = (nbits(x, f"{p}.{n}", hidden, f"{p}.{n}", bias=True) for n in "qkv")
        ctx = node("MultiHeadAttention", [q, k, v, "", mask], p + ".ctx", domain="com.microsoft", num_heads=heads)
        x = skip_ln(nbits(ctx, f"{p}.ao", hidden, p + ".ao"), x, vec(f"{p}.ao.b"), f"{p}.aln", p + ".x1")
        ffn = node("BiasGelu", [nbits(x, f"{p}.fi", hidden, p + ".fi"), const(p + ".fi.b", vec(f"{p}.fi.b"))], p + ".gelu",
                   domain="com.microsoft")
        x = skip_ln(nbits(ffn, f"{p}.fo", packed.ffn, p + ".fo"), x, vec(f"{p}.fo.b"), f"{p}.oln", p + ".x2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))
    return parts.model("multilingual-e5-small",
                       [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "tokens"]) for n in ("input_ids", "attention_mask")],
                       [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", hidden])])


def minilm_int8_blocks(folded, bits: int = 8, block: int = 32):
    """MiniLM with every weight matrix as `MatMulNBits` (symmetric `bits`-bit blocks of `block`
    along K, onnxruntime's default zero point) at `accuracy_level` 4, as e5 computes: activations
    quantised per row and block of 32 instead of `quantize_dynamic`'s one scale per padded batch,
    so a text's vector no longer depends on what it is batched with. `folded`: the exported model
    after constant folding (an onnx ModelProto), as `shared/engine/int8_model.py` folds it."""
    from onnx import helper, numpy_helper

    graph = folded.graph
    weights = {t.name: t for t in graph.initializer}
    nodes, replaced = [], set()
    for n in graph.node:
        if n.op_type != "MatMul" or n.input[1] not in weights or len(weights[n.input[1]].dims) != 2:
            nodes.append(n)
            continue
        w = numpy_helper.to_array(weights[n.input[1]]).astype(np.float32)  # (K, N)
        k, cols = w.shape
        rows = w.T.reshape(cols, k // block, block)
        top = 2 ** (bits - 1) - 1
        scale = np.abs(rows).max(axis=2, keepdims=True) / top
        scale[scale == 0] = 1.0
        q = (np.clip(np.rint(rows / scale), -top - 1, top) + 2 ** (bits - 1)).astype(np.uint8)
        if bits == 4:
            q = q[..., 0::2] | (q[..., 1::2] << 4)
        name = n.input[1]
        graph.initializer.extend([numpy_helper.from_array(np.ascontiguousarray(q), name + ".q"),
                                  numpy_helper.from_array(scale.reshape(-1).astype(np.float32), name + ".scale")])
        nodes.append(helper.make_node("MatMulNBits", [n.input[0], name + ".q", name + ".scale"], list(n.output), name=name + ".mm",
                                      domain="com.microsoft", K=k, N=cols, bits=bits, block_size=block,
                                      accuracy_level=INT8_ACTIVATIONS))
        replaced.add(name)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(o.domain == "com.microsoft" for o in folded.opset_import):
        folded.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return folded
