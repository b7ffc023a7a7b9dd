"""Process gauges beside prometheus_client's default ones (which already export
`process_open_fds` and `process_resident_memory_bytes`): the OS thread count, which native
libraries (onnxruntime, tantivy, BLAS) grow without Python seeing it."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import Gauge


def _os_threads() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return float(line.split()[1])
    return float("nan")


PROCESS_THREADS = Gauge("process_threads", "OS threads of this process (Python and native).")
PROCESS_THREADS.set_function(_os_threads)
