"""Secrets (and optionally e-mail addresses and phone numbers) are replaced by
`[REDACTED:<kind>]` before anything is published, so the original never reaches Redis, disk or
logs. Patterns are anchored on each format's fixed shape (prefixes, lengths, structure) to keep
ticket numbers, hashes and prose that merely mentions a password untouched; the corpus test and
`bench/redaction_bench.py` measure both sides.

Every pattern runs in time linear in the text: a part that may start at many places of one run
of characters (a URL scheme, an e-mail's local part, a JWT header, the look-ahead of a password
value) is bounded, and a private key's body never spans another BEGIN line. Unbounded, a turn
of "a.a.a…" or "password:password:…" (200k characters are allowed) took a minute of the
ingest's event loop."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# (kind, pattern, group to replace: 0 = the whole match)
SECRET_RULES: list[tuple[str, re.Pattern[str], int]] = [
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:(?!-----BEGIN )[\s\S])*?"
                               r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"), 0),
    ("aws_access_key", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"), 0),
    ("aws_secret_key", re.compile(r"(?i)\baws_?secret_?(?:access_?)?key\b\s*[:=]\s*[\"']?([A-Za-z0-9/+=]{40})\b"), 1),
    ("github_token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{60,255})\b"), 0),
    ("gitlab_token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}\b"), 0),
    ("slack_token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"), 0),
    ("slack_webhook", re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]{20,}"), 0),
    ("stripe_key", re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b"), 0),
    ("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), 0),
    ("openai_key", re.compile(r"\bsk-(?:proj-|svcacct-|ant-(?:api\d\d-)?)?[A-Za-z0-9_-]{32,}\b"), 0),
    ("npm_token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"), 0),
    ("hf_token", re.compile(r"\bhf_[A-Za-z]{34}\b"), 0),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,2048}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), 0),
    ("bearer_token", re.compile(r"(?i)\bbearer\s+([A-Za-z0-9._~+/-]{20,}=*)"), 1),
    ("basic_auth", re.compile(r"(?i)\bauthorization:\s*basic\s+([A-Za-z0-9+/]{12,}=*)"), 1),
    ("url_password", re.compile(r"\b[a-z][a-z0-9+.-]{0,31}://[^\s:/@]+:([^\s@/]{3,})@"), 1),
    ("password", re.compile(
        r"(?i)\b(?:password|passwd|pwd|passphrase|secret|api[_-]?key|access[_-]?token|auth[_-]?token|client[_-]?secret)"
        r"\b[\"']?\s*(?:[:=]|\bis\b)\s*[\"']?((?=[^\s\"',;]{0,255}[0-9!@#$%^&*_+=-])[^\s\"',;]{8,})"), 1),
]
PII_RULES: list[tuple[str, re.Pattern[str], int]] = [
    ("email", re.compile(r"(?<![/:])\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"), 0),
    # International or grouped national numbers with at least 9 digits; not dates, ids or versions.
    ("phone", re.compile(r"(?<![\w.-])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?|\d{2,4}[\s.-])\d{3,4}[\s.-]\d{3,4}(?![\w.-])"), 0),
]


@dataclass(frozen=True)
class Redacted:
    text: str
    kinds: Counter


class Redactor:
    def __init__(self, pii: bool) -> None:
        self.rules = SECRET_RULES + (PII_RULES if pii else [])

    def redact(self, text: str) -> Redacted:
        kinds: Counter = Counter()
        for kind, pattern, group in self.rules:
            def replace(m: re.Match[str], kind: str = kind, group: int = group) -> str:
                kinds[kind] += 1
                if group == 0:
                    return f"[REDACTED:{kind}]"
                start, end = m.span(group)
                return m.group(0)[: start - m.start()] + f"[REDACTED:{kind}]" + m.group(0)[end - m.start():]

            text = pattern.sub(replace, text)
        return Redacted(text, kinds)
