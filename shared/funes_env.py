"""The environment a funes(-compatible) child runs with: its tenant's FUNES_HOME, offline
model loading, and nothing else of ours (no keys or secrets of the parent process)."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
from collections.abc import Sequence
from pathlib import Path

from shared.child_process import die_with_parent
from shared.engine.embedder import EmbedderSettings

# Model, secret-scanner and locale settings a funes child may legitimately need from the parent
# (funes reads FUNES_TRUFFLEHOG to find TruffleHog: without it redaction is silently off).
PASSTHROUGH = ("HF_HOME", "FUNES_TRUFFLEHOG", "RECALL_EMBED_MODEL_DIR", "RECALL_EMBED_MODEL_ID", "RECALL_EMBED_POOLING",
               "RECALL_RERANK_MODEL_DIR", "RECALL_SQLITE_JOURNAL_MODE", "LANG", "GLIBC_TUNABLES")


def funes_environment(funes_home: Path) -> dict[str, str]:
    """The environment of a funes child for one tenant (its TMPDIR made here, so it exists)."""
    # The contract's checklist: an absolute FUNES_HOME (`recall serve` or `recall indexer` started
    # by hand get RECALL_DATA_DIR as given, `data` by default).
    home = funes_home.resolve()
    # funes finds its models in $HF_HOME/hub, else ~/.cache/huggingface, and downloads what is
    # missing there (it reads no HF_HUB_OFFLINE). HOME is the tenant's below, so without this
    # every tenant would get, or download, its own copy of the models.
    models = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    # TMPDIR the tenant's: funes copies each unit into a temp dir for TruffleHog, and a killed
    # run's copy of the user's text must go with the tenant when it is forgotten (and is cleared
    # before each index run: services/indexer/index_job.py).
    funes_tmp(home).mkdir(parents=True, exist_ok=True)
    env = {"FUNES_HOME": str(home), "HF_HUB_OFFLINE": "1", "HOME": str(home), "HF_HOME": models,
           "TMPDIR": str(funes_tmp(home)), "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "NO_COLOR": "1"}
    env.update({name: os.environ[name] for name in PASSTHROUGH if name in os.environ})
    # HOME is the tenant's here: an engine of ours standing in for funes would otherwise build
    # its model graphs once per tenant home instead of reading the parent's cache.
    env["RECALL_EMBED_CACHE_DIR"] = str(EmbedderSettings().embed_cache_dir)
    return env


def funes_tmp(funes_home: Path) -> Path:
    return funes_home / "tmp"


async def start_funes(binary: str, args: Sequence[str], funes_home: Path) -> asyncio.subprocess.Process:
    """One funes command for one tenant, its output piped. It runs in a session of its own (a
    timeout kills its whole group) and is killed with this process: an indexer killed with -9
    must not leave an index run behind that holds the tenant's memory from the next one."""
    return await asyncio.create_subprocess_exec(
        binary, *args, env=funes_environment(funes_home), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        preexec_fn=functools.partial(die_with_parent, signal.SIGKILL))
