"""Services start with glibc's large allocations on huge pages (shared/huge_pages.py), keeping
whatever tunables the operator set; the stack test checks the pages themselves."""

from __future__ import annotations

from shared.huge_pages import with_huge_pages


def test_the_tunable_is_added_beside_the_operators_own_and_never_overrides_their_choice():
    assert with_huge_pages({"PATH": "/bin"}) == {"PATH": "/bin", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.check=0"})["GLIBC_TUNABLES"] == \
        "glibc.malloc.check=0:glibc.malloc.hugetlb=1"
    assert with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"


def test_the_image_and_funes_children_carry_the_same_tunable():
    from pathlib import Path

    from shared.funes_env import PASSTHROUGH

    dockerfile = (Path(__file__).resolve().parents[1] / "deploy" / "Dockerfile").read_text()
    assert "    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 \\\n" in dockerfile
    assert "GLIBC_TUNABLES" in PASSTHROUGH
