"""glibc's allocator on transparent huge pages, in every service process.

A recall call streams the query model's weights (~22 MB of int8 matrices, packed by
onnxruntime into memory it allocates) and a scan over the memory's vectors. On 4 KiB pages each
run misses the TLB on most of those pages, and more so after the search between two runs has
used it for other data. glibc (2.35 and later) backs its large allocations with 2 MiB pages
when the process starts with the tunable below (`madvise`; read once at start, so it is set in
the environment services start with: `recall up`'s children, the container image, funes
children). Measured (docs/benchmarks.md, round 17, alternating): the model's CPU per query
inside calls -5 %, calls/s +3 % at 8 clients, RSS unchanged; indexing -7 % CPU, +2 % RSS. The
kernel's THP mode must be `madvise` or `always` (most distributions' default); with `never`, or
another C library, it changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

TUNABLE = "glibc.malloc.hugetlb=1"


def with_huge_pages(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with the tunable added to GLIBC_TUNABLES, unless that already decides hugetlb."""
    tunables = env.get("GLIBC_TUNABLES", "")
    if "glibc.malloc.hugetlb=" in tunables:
        return dict(env)
    return {**env, "GLIBC_TUNABLES": f"{tunables}:{TUNABLE}" if tunables else TUNABLE}
