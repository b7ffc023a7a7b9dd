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
from functools import cache
from pathlib import Path


@cache
def _file_digest(path: Path, size: int, mtime_ns: int) -> bytes:
    """Hashed once per process and file version: several models are built from one source."""
    return hashlib.sha256(path.read_bytes()).digest()


def cached_model(source: Path, cache_dir: Path, label: str, recipe: str, build: Callable[[Path, Path], None],
                 suffix: str = ".onnx") -> Path:
    """The cached output of `build(source, target)`, built now if it is not there yet."""
    stat = source.stat()
    digest = hashlib.sha256(_file_digest(source.resolve(), stat.st_size, stat.st_mtime_ns))
    digest.update(recipe.encode())
    target = cache_dir / f"{source.stem}-{label}-{digest.hexdigest()[:16]}{suffix}"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{label}-") as tmp:
            built = Path(tmp) / f"model{suffix}"
            build(source, built)
            os.replace(built, target)
    return target
