"""Refuse secrets that anybody could know or guess, before a service starts.

A deployment that keeps an example value runs with a publicly known key (an HS256 key lets
anyone mint tokens for any user). So a secret is refused when it is one of the values this
repository ever shipped as an example, carries a placeholder word, is shorter than its
minimum, or has too little entropy. Entropy is estimated from the characters themselves
(length × Shannon entropy of their frequencies): a fresh `secrets.token_urlsafe(32)` scores
~190 bits, `token_hex(16)` ~110; "aaaa…" scores 0 and "abab…" one bit per character.

Services call `check_secret` from their settings validation; `python -m shared.secret_policy
NAME…` checks environment variables for components that are not ours (Grafana, PostgreSQL,
Redis passwords) and exits 1 with one line per refused variable.
"""

from __future__ import annotations

import math
import os
import sys
from collections import Counter

# Every example value this repository has shipped (deploy/.env.example, compose defaults, the
# example overlay), and the defaults of components we configure.
SHIPPED_EXAMPLES = frozenset({
    "change-me-local-ingest-key",
    "change-me-local-jwt-secret-0123456789abcdef",
    "replace-me-with-a-long-random-key",
    "replace-me-with-at-least-32-random-characters",
    "admin",
})
PLACEHOLDER_WORDS = ("change-me", "changeme", "change_me", "replace-me", "replaceme", "replace_me", "example",
                     "placeholder", "your-secret", "password", "xxxxxxxx")
MIN_BITS = 96.0
MIN_LENGTH = 16


class WeakSecret(ValueError):
    """A secret that must not be used; the message names the variable and why, never the value."""


def estimated_bits(value: str) -> float:
    counts = Counter(value)
    n = len(value)
    return n * sum(c / n * math.log2(n / c) for c in counts.values()) if n else 0.0


def check_secret(name: str, value: str, min_length: int = MIN_LENGTH) -> None:
    """Raise WeakSecret unless `value` is fit to be the secret `name`."""
    lowered = value.lower()
    if value in SHIPPED_EXAMPLES:
        raise WeakSecret(f"{name} is an example value shipped with recall: generate a fresh one "
                         "(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')")
    if any(word in lowered for word in PLACEHOLDER_WORDS):
        raise WeakSecret(f"{name} looks like a placeholder: generate a fresh random value")
    if len(value) < min_length:
        raise WeakSecret(f"{name} must be at least {min_length} characters of random data")
    if estimated_bits(value) < MIN_BITS:
        raise WeakSecret(f"{name} has too little entropy (~{estimated_bits(value):.0f} bits, at least {MIN_BITS:.0f} "
                         "needed): generate it with python3 -c 'import secrets; print(secrets.token_urlsafe(32))'")


def main(names: list[str]) -> int:
    refused = 0
    for name in names:
        try:
            check_secret(name, os.environ.get(name, ""))
        except WeakSecret as exc:
            print(f"refused: {exc}", file=sys.stderr)
            refused += 1
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
