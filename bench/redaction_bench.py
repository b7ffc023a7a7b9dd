"""Redactor precision and recall on the test corpus (issue 6).

    .venv/bin/python -m bench.redaction_bench

A secret counts as caught when its value is gone from the output; a look-alike counts as a
false positive when anything in it is replaced. Same corpus as tests/test_forgetting.py.
"""

from __future__ import annotations

import sys
from collections import Counter

from bench.report import table, write_section
from services.ingest.redaction import Redactor
from tests.data.secret_corpus import LOOK_ALIKES, PII, PII_LOOK_ALIKES, SECRETS


def main() -> None:
    rows = []
    for label, redactor, positives, negatives in (
        ("secrets (default)", Redactor(pii=False), SECRETS, LOOK_ALIKES),
        ("secrets + PII (RECALL_REDACT_PII=true)", Redactor(pii=True), SECRETS + PII, LOOK_ALIKES + PII_LOOK_ALIKES),
    ):
        caught = sum(value not in redactor.redact(text).text for _, text, value in positives)
        false_pos = sum(bool(redactor.redact(text).kinds) for text in negatives)
        precision = caught / max(caught + false_pos, 1)
        rows.append([label, len(positives), len(negatives), caught, false_pos, f"{precision:.3f}", f"{caught / len(positives):.3f}"])
    kinds = Counter(kind for kind, _, _ in SECRETS + PII)
    body = (table(["rules", "secrets/PII in corpus", "look-alikes", "caught", "false positives", "precision", "recall"], rows)
            + "\n\nKinds in the corpus: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
            + ". The corpus is small and written by us: it proves the formats we claim, not unseen formats.")
    print(body)
    if "--no-doc" not in sys.argv:
        write_section("redaction-bench", "python -m bench.redaction_bench", body)


if __name__ == "__main__":
    main()
