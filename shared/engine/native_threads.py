"""Thread pools of the native libraries the engine loads, set explicitly and never spinning.

Two libraries bring their own worker threads, and each busy-waits between calls by default,
which on a small shared machine steals the core the next stage (or the next request) needs:
- OpenBLAS (numpy's matmul in the dense scan): one thread; the scan is memory-bound and a
  second thread spinning between calls cost 3x the CPU per recall (issue 15's profile).
- onnxruntime: explicit intra/inter-op counts and `session.intra_op.allow_spinning=0`, set on
  each session (see `ort_session_options`).
"""

from __future__ import annotations

import threading

_blas_pinned = threading.Event()


def pin_blas_threads() -> None:
    """OpenBLAS (or any BLAS numpy loaded) runs in the calling thread only."""
    if _blas_pinned.is_set():
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=1, user_api="blas")
    _blas_pinned.set()


def ort_session_options(threads: int):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return opts
