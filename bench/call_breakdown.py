"""Where a warm recall's CPU and wall time go, alone and with calls side by side (issue 15's
calls/s target: a replica's throughput is 2 cores over what a call costs while another runs).

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python -m bench.call_breakdown [--conversations 10000] [--calls 400]
        [--clients 8] [--slots 2] [--no-doc]

(The tunable: as the services start, shared/huge_pages.py.)

One tenant of `--conversations` conversations (bench/corpus.py; vectors reused as in
bench/recall_cpu_bench.py, queries always embedded by the real default model), one process:

- the query model alone, back to back, and the matrix products inside it alone: onnxruntime's
  u8s8 GEMM at the e5 layer shapes and the questions' mean token count (on a CPU with AMX they
  run far above AVX-512's rate, so the rest of the graph's nodes decide the model's cost);
- the search alone: `Engine.search` with the query vectors computed beforehand;
- whole calls from one client, and the model's CPU inside them (the search between two model
  runs evicts the model's weights from the caches, so it costs more there than back to back);
- `--clients` clients passing `--slots` at a time, as a recall replica admits them: calls/s, CPU
  per call, cores kept busy (process CPU over wall time), and per call its wall time against
  the CPU its thread spent, for the whole call and for its query embedding (the difference is
  waiting: for the model's lane, query_batching.py, or for the interpreter).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from bench.recall_cpu_bench import ReusingEmbedder, write_src
from bench.report import table, write_section
from shared.engine.api import Engine
from shared.engine.embedder import EmbedderSettings, shared_embedder
from shared.engine.hybrid_search import RecallParams
from shared.engine.index_run import index_tree, memory_dir
from shared.engine.native_threads import usable_cores

PARAMS = RecallParams(k=3, candidates=8)  # the service's defaults
WARM_CALLS = 30


class TimedEmbedder:
    """The real embedder, its query embeddings timed per call (wall, and the calling thread's CPU)."""

    def __init__(self, real) -> None:
        self.real, self.spec, self.dim = real, real.spec, real.dim
        self.query_batcher = real.query_batcher  # so that a search sees the model busy (embedder.query_model_busy)
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self._lock = threading.Lock()

    def embed_query(self, text: str) -> np.ndarray:
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self.real.embed_query(text)
        finally:
            w, c = time.perf_counter() - w0, time.thread_time() - c0
            with self._lock:
                self.wall.append(w)
                self.cpu.append(c)

    def text_log_prob(self, text: str) -> float | None:
        return self.real.text_log_prob(text)


class PrecomputedEmbedder:
    """Query vectors computed beforehand, so that only the search is timed."""

    def __init__(self, real, vectors: dict[str, np.ndarray]) -> None:
        self.real, self.spec, self.dim, self.vectors = real, real.spec, real.dim, vectors

    def embed_query(self, text: str) -> np.ndarray:
        return self.vectors[text]

    def text_log_prob(self, text: str) -> float | None:
        return self.real.text_log_prob(text)


def e5_gemms_ms(tokens: int, reps: int = 200) -> float:
    """CPU ms of one query's matrix products: every layer's four u8s8 products at `tokens` rows."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from shared.engine.e5_packed import packed_model_file, read_packed

    packed = read_packed(packed_model_file())
    h, f = packed.hidden, packed.ffn
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    rng = np.random.default_rng(0)
    total = 0.0
    for k, n in [(h, 3 * h), (h, h), (h, f), (f, h)]:  # q, k and v together; attention out; feed-forward in and out
        weights = helper.make_tensor("B", TensorProto.INT8, [k, n], rng.integers(-63, 64, (k, n), dtype=np.int8).tobytes(), raw=True)
        graph = helper.make_graph([helper.make_node("MatMulInteger", ["A", "B"], ["Y"])], "gemm",
                                  [helper.make_tensor_value_info("A", TensorProto.UINT8, ["M", k])],
                                  [helper.make_tensor_value_info("Y", TensorProto.INT32, ["M", n])], [weights])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        a = rng.integers(0, 256, (tokens, k), dtype=np.uint8)
        session.run(None, {"A": a})
        c0 = time.process_time()
        for _ in range(reps):
            session.run(None, {"A": a})
        total += (time.process_time() - c0) / reps
    return 1000 * total * packed.layers


def mean_query_tokens(queries: list[str]) -> float:
    from shared.engine.e5_packed import packed_model_file, read_packed
    from shared.engine.e5_tokens import E5TokenIds, e5_tokenizer_path

    packed_file = packed_model_file()
    tokens = E5TokenIds(read_packed(packed_file), e5_tokenizer_path(packed_file, EmbedderSettings().embed_cache_dir))
    return statistics.mean(len(ids) for ids in tokens.ids(queries, query=True))


def cpu_ms_per_call(run, items: list) -> float:
    c0 = time.process_time()
    for item in items:
        run(item)
    return 1000 * (time.process_time() - c0) / len(items)


def side_by_side(engine: Engine, memory: Path, timed: TimedEmbedder, queries: list[str], clients: int, slots: int) -> dict:
    admit = threading.BoundedSemaphore(slots)
    per = len(queries) // clients
    call_wall: list[float] = []
    call_cpu: list[float] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for q in queries[i * per:(i + 1) * per]:
            with admit:
                w0, c0 = time.perf_counter(), time.thread_time()
                engine.recall(memory, q, PARAMS)
                w, c = time.perf_counter() - w0, time.thread_time() - c0
            with lock:
                call_wall.append(w)
                call_cpu.append(c)

    timed.wall.clear()
    timed.cpu.clear()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    w0, c0 = time.perf_counter(), time.process_time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    calls = per * clients
    return {"calls_s": calls / wall, "cpu_ms": 1000 * cpu / calls, "busy": cpu / wall,
            "call_wall": 1000 * statistics.mean(call_wall), "call_cpu": 1000 * statistics.mean(call_cpu),
            "model_wall": 1000 * statistics.mean(timed.wall), "model_cpu": 1000 * statistics.mean(timed.cpu)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=10000)
    ap.add_argument("--calls", type=int, default=400, help="distinct questions per measurement")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--slots", type=int, default=usable_cores(), help="searches at once (RECALL_MAX_CONCURRENCY's default)")
    ap.add_argument("--no-doc", action="store_true")
    args = ap.parse_args()

    real = shared_embedder()
    with tempfile.TemporaryDirectory(prefix="call-breakdown-") as work:
        queries = write_src(Path(work) / "src", args.conversations)
        index_tree(Path(work) / "home", Path(work) / "src", ReusingEmbedder(real))
        memory = memory_dir(Path(work) / "home")
        need = WARM_CALLS + 4 * args.calls
        assert len(queries) >= need, f"{len(queries)} distinct questions, {need} needed: fewer --calls"
        warm, sets = queries[:WARM_CALLS], [queries[WARM_CALLS + i * args.calls:WARM_CALLS + (i + 1) * args.calls] for i in range(4)]

        timed = TimedEmbedder(real)
        engine = Engine(embedder=timed)
        for q in warm:
            engine.recall(memory, q, PARAMS)
        model_alone = cpu_ms_per_call(real.embed_query, sets[0])
        tokens = mean_query_tokens(sets[0])
        gemms = e5_gemms_ms(round(tokens))
        vectors = {q: real.embed_query(q) for q in sets[1]}
        searching = Engine(embedder=PrecomputedEmbedder(real, vectors))
        search_alone = cpu_ms_per_call(lambda q: searching.search(memory, q, PARAMS), sets[1])
        timed.cpu.clear()
        one_client = cpu_ms_per_call(lambda q: engine.recall(memory, q, PARAMS), sets[2])
        model_in_calls = 1000 * statistics.mean(timed.cpu)
        many = side_by_side(engine, memory, timed, sets[3], args.clients, args.slots)

    body = "\n\n".join([
        table(["one client, back to back", "CPU ms per call"], [
            [f"query model alone ({tokens:.1f} tokens on average)", f"{model_alone:.2f}"],
            [f"its matrix products alone (u8s8 GEMM at e5's shapes, {round(tokens)} rows)", f"{gemms:.2f}"],
            ["search alone (query vectors computed beforehand)", f"{search_alone:.2f}"],
            ["whole calls", f"{one_client:.2f}"],
            ["the query model inside whole calls", f"{model_in_calls:.2f}"],
        ]),
        table([f"{args.clients} clients, {args.slots} at once", "value"], [
            ["calls/s", f"{many['calls_s']:.0f}"],
            ["CPU ms per call (process)", f"{many['cpu_ms']:.2f}"],
            ["cores busy (process CPU / wall)", f"{many['busy']:.2f} of {usable_cores()}"],
            ["a call: wall ms / its thread's CPU ms", f"{many['call_wall']:.2f} / {many['call_cpu']:.2f}"],
            ["its query embedding: wall ms / its thread's CPU ms", f"{many['model_wall']:.2f} / {many['model_cpu']:.2f}"],
        ]),
    ])
    print(body)
    if not args.no_doc:
        # Run as the services start (shared/huge_pages.py) to measure what they do; the command says how it ran.
        tunables = os.environ.get("GLIBC_TUNABLES")
        env = f"GLIBC_TUNABLES={tunables} " if tunables else ""
        write_section("call-breakdown", env + "python -m bench.call_breakdown " + " ".join(sys.argv[1:]), body)


if __name__ == "__main__":
    main()
