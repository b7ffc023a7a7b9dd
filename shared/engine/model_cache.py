"""Model graphs built locally from files the packages ship, cached on disk.

A build runs once per cache directory and input: the file name carries a hash of the input
file and of the recipe (whatever else the output depends on), and the result is written under
a temporary name and renamed, so concurrent processes may race and the loser's rename is
harmless. Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def cached_model(source: Path, cache_dir: Path, label: str, recipe: str, build: Callable[[Path, Path], None]) -> Path:
    """The cached output of `build(source, target)`, built now if it is not there yet."""
    digest = hashlib.sha256()
    digest.update(source.read_bytes())
    digest.update(recipe.encode())
    target = cache_dir / f"{source.stem}-{label}-{digest.hexdigest()[:16]}.onnx"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{label}-") as tmp:
            built = Path(tmp) / "model.onnx"
            build(source, built)
            os.replace(built, target)
    return target
