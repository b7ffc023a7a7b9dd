"""Model graphs built locally from files the packages ship, cached on disk.

A build runs once per cache directory and input: the file name carries a hash of the input
file and of the recipe (whatever else the output depends on), and the result is written under
a temporary name and renamed, so concurrent processes may race and the loser's rename is
harmless. Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path


@cache
def _file_digest(path: Path, size: int, mtime_ns: int, inode: int, cache_dir: Path) -> bytes:
    """Hashed once per file version: several models are built from one source, and every process
    that loads e5 would otherwise hash its 72 MB file again (~0.1 s of each CLI run). The digest
    is remembered in `cache_dir` under the file's identity (path, size, mtime, inode), which a
    reinstalled package changes; a cache directory that cannot be written is only not used."""
    identity = hashlib.sha256(f"{path}|{size}|{mtime_ns}|{inode}".encode()).hexdigest()[:32]
    memo = cache_dir / ".digests" / identity
    with contextlib.suppress(OSError):
        remembered = memo.read_bytes()
        if len(remembered) == hashlib.sha256().digest_size:
            return remembered
    digest = hashlib.sha256(path.read_bytes()).digest()
    with contextlib.suppress(OSError):
        memo.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=memo.parent, prefix=".digest-", delete=False) as tmp:
            tmp.write(digest)
        os.replace(tmp.name, memo)
    return digest


def cached_model(source: Path, cache_dir: Path, label: str, recipe: str, build: Callable[[Path, Path], None],
                 suffix: str = ".onnx") -> Path:
    """The cached output of `build(source, target)`, built now if it is not there yet."""
    resolved = source.resolve()
    stat = resolved.stat()
    digest = hashlib.sha256(_file_digest(resolved, stat.st_size, stat.st_mtime_ns, stat.st_ino, cache_dir))
    digest.update(recipe.encode())
    target = cache_dir / f"{source.stem}-{label}-{digest.hexdigest()[:16]}{suffix}"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{label}-") as tmp:
            built = Path(tmp) / f"model{suffix}"
            build(source, built)
            os.replace(built, target)
    return target
