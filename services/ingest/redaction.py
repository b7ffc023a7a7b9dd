"""Secrets (and optionally e-mail addresses and phone numbers) are replaced by
`[REDACTED:<kind>]` before anything is published, so the original never reaches Redis, disk or
logs. Patterns are anchored on each format's fixed shape (prefixes, lengths, structure) to keep
ticket numbers, hashes and prose that merely mentions a password untouched; what stands in a
secret's place without being one (a placeholder, a variable, pasted code) is left as written
(_NOT_A_SECRET). The corpus test, tests/test_redaction.py and `bench/redaction_bench.py` measure
both sides.

Every pattern runs in time linear in the text: a part that may start at many places of one run
of characters (a URL scheme, an e-mail's local part, a JWT header, the look-ahead of a password
value) is bounded, and a private key's body never spans another BEGIN line. Unbounded, a turn
of "a.a.a…" or "password:password:…" (200k characters are allowed) took a minute of the
ingest's event loop."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

# A value after a secret's name that is no secret, so pasted code, config templates and docs stay
# as written: a variable or template reference (${DB_PASSWORD}, $DB_PASSWORD, {{ … }}, {key},
# %(…)s, (…)), a shell command substitution that makes one when run ($(openssl rand -base64 32),
# `pass show db`), a <placeholder>, a mask or stand-in (********, xxx…, changeme, [password], a NAME
# in capitals), code that reads or makes one (os.environ[…], settings.db_password, get_token(),
# secrets.token_urlsafe(32), uuid.uuid4(), b64encode(…)), an identifier or name of words without
# digits joined by "_", "." or "-", also ending a sentence (sandbox_token, DB_PASSWORD, your-api-key,
# X-Auth-Token, "is one-time-use."), a shell default (${X:-…} leaves ":-…}"), or an earlier rule's
# replacement ("[REDACTED:…]", counted once). Each part is bounded and splits one way only, so it
# costs a constant per candidate value.
_WORDS = r"_{0,2}[A-Za-z]{1,64}"
# A stand-in is the whole value, not its start: "Changeme!2024", "-Xk9mmQ2p", "Password@123" are secrets.
_END = r"(?![^\s\"',;)\]}])"
_NOT_A_SECRET = (
    r"(?!(?-i:\$\{|\$\(|`|\$[A-Z_][A-Z0-9_]{0,63}(?![^\s\"',;])|<[^\s<>\"',;]{1,64}>|[{(\[%]|-(?![A-Za-z0-9])|-[^\s{}]{1,64}\}"
    r"|[xX*.]{3,64}" + _END + r"|[cC]hange[_-]?me" + _END + r"|[yY]our[_-][A-Za-z_-]{1,64}" + _END
    + r"|[A-Z][A-Z_]{0,63}(?![A-Za-z0-9!@#$%^&*+=/~-])"
    r"|(?:[pP]ass(?:word)?|[pP]asswd|[pP]wd|[sS]ecret)@(?=[A-Za-z])"
    r"|" + _WORDS + r"(?:[_.-]{1,2}[A-Za-z]{1,64}){0,8}[(\[]"
    r"|(?:[A-Za-z_][A-Za-z0-9_]{0,63}\.){1,6}[A-Za-z_][A-Za-z0-9_]{0,63}\(|[a-z_][a-z0-9_]{0,63}\("
    r"|" + _WORDS + r"(?:[_.-]{1,2}[A-Za-z]{1,64}){1,8}[.!?:]?(?![^\s\"',;)\]}])))")

# The words a password follows; a token's or key's name takes only the long values above.
_PASSWORD_WORD = r"(?:password|passwd|passphrase|(?<![a-z0-9])(?:pwd|pw)|(?<=[_-])pass)"
_RU_PASSWORD_WORD = r"(?<!\w)(?:пароль|пароля|паролем|паролю|пароли|парольная\s+фраза)"
_RU_TOKEN_WORD = r"(?<!\w)(?:токен|токена|токеном|секрет|секретный\s+ключ|(?:api|апи)[- ]?ключ|ключ\s+(?:api|апи|доступа))"
# Russian: a name and ":", "=" or a dash ("пароль: …", "пароль — …", also after up to three words:
# "пароль от почты: …"), or a name and only the next word ("мой пароль …", "пароль это …").
_RU_MARKED = r"[\"']?(?:[^\S\n]+[^\s:=—–]{1,40}){0,3}?[^\S\n]*(?:[:=]|[^\S\n][—–-])[^\S\n]*[\"'«]?"
_RU_BARE = r"(?:[^\S\n]+это)?[^\S\n]+[\"'«]?"
_ASCII = r"[\x21\x23-\x26\x28-\x2b\x2d-\x3a\x3c-\x7e]"  # printable ASCII but quotes, "," and ";"


def _passphrase(words: int) -> str:
    """`words` to 8 words of 3+ letters, all small or all capitalised, joined by "-", and not a
    stand-in (your-…, xxx-xxx-xxx, enter-the-password): "correct-horse-battery-staple", not
    "X-Auth-Token" (a one-letter word) or "out-of-band". _NOT_A_SECRET takes words joined by "-" for
    an identifier, so a passphrase is matched without it."""
    more = f"{{{words - 1},7}}"
    return (r"(?!(?:[A-Za-z]{3,24}-){0,7}(?i:x{3,}|your|example|password|passphrase|secret|changeme|placeholder|here)(?![A-Za-z]))"
            r"(?-i:[a-z]{3,24}(?:-[a-z]{3,24})" + more + r"|[A-Z][a-z]{2,23}(?:-[A-Z][a-z]{2,23})" + more + r")"
            r"(?![^\s\"',;.!?)\]}])")


class Rule(NamedTuple):
    kind: str
    pattern: re.Pattern[str]
    group: int  # the group replaced: 0 = the whole match
    # Words every match holds, casefolded: a text without any of them skips the rule. Most rules
    # are led by a name or prefix the regex engine cannot search for ahead (a look-behind, a case-
    # less alternation); without this, the rules of round 33 cost 60 % more per snapshot. A case-
    # less rule's words hold no "i": (?i) matches "İ" and "ı" to it, which casefold to other letters.
    needles: tuple[str, ...] = ()


SECRET_RULES: list[Rule] = [Rule(*rule) for rule in [
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----(?:(?!-----BEGIN )[\s\S])*?"
                               r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"), 0, ("private key",)),
    # A key pasted without its END line (a truncated paste): the BEGIN line and the base64 lines
    # (or space- or "\n"-separated runs, as chat clients and JSON strings carry them) that follow,
    # with the encrypted-PEM headers and a short last line. Prose that merely names the BEGIN line
    # has no 16-character base64 run after it.
    ("private_key", re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
                               r"(?:(?:\s|\\[rn]){1,8}(?:[A-Za-z0-9+/=]{16,}|(?:Proc-Type|DEK-Info|Comment):[^\n\\]{0,128}))+"
                               r"(?:(?:\s|\\[rn]){1,4}[A-Za-z0-9+/=]{1,15}(?![^\s\\]))?"), 0, ("private key",)),
    ("aws_access_key", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b"), 0, ("akia", "asia", "agpa", "aida", "aroa")),
    # aws_secret_access_key = …, AWS_SECRET_ACCESS_KEY=…, and STS/CLI JSON's "SecretAccessKey": "…".
    ("aws_secret_key", re.compile(r"(?i)(?<![a-z0-9])(?:aws_?secret_?(?:access_?)?key|secret_?access_?key)[\"']?\s*[:=]\s*[\"']?"
                                  r"([A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])"), 1, ("secret",)),
    ("aws_session_token", re.compile(r"(?i)(?<![a-z0-9])(?:aws_?session_?token|(?-i:SessionToken))[\"']?\s*[:=]\s*[\"']?"
                                     r"([A-Za-z0-9/+=]{16,})"), 1, ("token",)),
    ("github_token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{60,255})\b"), 0,
     ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")),
    ("gitlab_token", re.compile(r"\bglpat-[A-Za-z0-9_-]{20,}\b"), 0, ("glpat-",)),
    ("slack_token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}\b"), 0, ("xox",)),
    ("slack_webhook", re.compile(r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]{20,}"), 0, ("hooks.slack.com",)),
    ("stripe_key", re.compile(r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}\b"), 0, ("_live_", "_test_")),
    ("google_api_key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b"), 0, ("aiza",)),
    ("openai_key", re.compile(r"\bsk-(?:proj-|svcacct-|ant-(?:api\d\d-)?)?[A-Za-z0-9_-]{32,}\b"), 0, ("sk-",)),
    ("npm_token", re.compile(r"\bnpm_[A-Za-z0-9]{36}\b"), 0, ("npm_",)),
    ("hf_token", re.compile(r"\bhf_[A-Za-z]{34}\b"), 0, ("hf_",)),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{8,2048}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), 0, ("eyj",)),
    ("bearer_token", re.compile(r"(?i)\bbearer\s+([A-Za-z0-9._~+/-]{20,}=*)"), 1, ("bearer",)),
    ("basic_auth", re.compile(r"(?i)\bauthorization:\s*basic\s+([A-Za-z0-9+/]{12,}=*)"), 1, ("author",)),
    # Any other scheme (GitHub's "token", "Token token=…", SSWS, Bot, none at all): a credential
    # of 16+ characters with a digit, so "Authorization: token based auth" stays.
    ("authorization", re.compile(r"(?i)\bauthorization[\"']?\s*[:=]\s*[\"']?(?:[a-z][a-z0-9_-]{0,31}\s+)?(?:[a-z_]{1,32}=)?"
                                 r"((?=[A-Za-z0-9._~+/=:-]{0,255}\d)[A-Za-z0-9._~+/=:-]{16,})"), 1, ("author",)),
    # scheme://[user]:password@host; the password may hold "/" or "@" (the host follows the last
    # "@" before a "/"); "host:8080/path@v2" is a port and a path, not a password. A run never
    # ends but at "@", "/" or a space, so it is possessive (no backtracking into it).
    ("url_password", re.compile(r"\b[a-z][a-z0-9+.-]{0,31}://[^\s:/@]{0,256}:(?!\d{1,5}(?:[/?#]|$))(?![:/])" + _NOT_A_SECRET
                                + r"(?=[^\s@]{3}|[^\s@]{1,2}@[^\s@/]{1,256}@)"
                                r"([^\s@]{1,256}+(?:@[^\s@/]{1,256}+){0,8})@(?=[A-Za-z0-9\[])"), 1, ("://",)),
    # Passwords on command lines: mysql/mariadb -pSECRET (-p alone prompts; -P is the port),
    # sshpass -p SECRET, any --password=SECRET.
    ("password", re.compile(r"(?<![\w/.-])(?:mysql(?:dump|admin|import|check|show|slap|pump|binlog)?|mariadb(?:-?dump|-?admin|-?import|-?check)?)"
                            r"(?:[^\S\n]+[^\s;|&]{1,256}){0,30}?[^\S\n]+-p(?=[^\s])[\"']?" + _NOT_A_SECRET + r"([^\s\"',;]{1,256})"), 1,
     ("mysql", "mariadb")),
    ("password", re.compile(r"(?<![\w/.-])sshpass(?:[^\S\n]+-[a-oq-zA-Z]\S{0,256}){0,4}[^\S\n]+-p[^\S\n]*[\"']?" + _NOT_A_SECRET
                            + r"([^\s\"']{1,256})"), 1, ("sshpass",)),
    ("password", re.compile(r"(?i)(?<![\w-])--(?:password|passwd|pass)=[\"']?" + _NOT_A_SECRET + r"([^\s\"']{1,256})"), 1, ("--pass",)),
    # name = value, name: value, "name": "value", name is value. A name may end an identifier
    # (DB_PASSWORD, POSTGRES_PASSWORD, PGPASSWORD, newPassword, DJANGO_SECRET_KEY, MY_API_KEY,
    # GITHUB_CLIENT_SECRET, x-ingest-key, SLACK_BOT_TOKEN, DB_PASS); the value needs 8+ characters
    # with a digit or symbol and must not be a placeholder, a reference or code (_NOT_A_SECRET).
    ("password", re.compile(
        r"(?i)(?:password|passwd|passphrase|secret(?:[_-]?key)?|api[_-]?key|access[_-]?token|auth[_-]?token|client[_-]?secret"
        r"|(?<![a-z0-9])(?:pwd|pw|ingest[_-]?key)|(?<=[_-])(?:pass|token))"
        r"\b[\"']?\s*(?:[:=]|\bis\b)\s*[\"']?" + _NOT_A_SECRET
        + r"((?=[^\s\"',;]{0,255}[0-9!@#$%^&*_+=-])[^\s\"',;]{8,})"), 1, ("pass", "secret", "key", "token", "pw")),
    # After a password word, also a short value with a digit or symbol ("password: hunter2",
    # "pw=abc123"; "password: see 1Password" and "password reset link" have none) …
    ("password", re.compile(r"(?i)" + _PASSWORD_WORD + r"\b[\"']?\s*(?:[:=]|\bis\b)\s*[\"']?" + _NOT_A_SECRET
                            + r"((?=[^\s\"',;]{0,6}[0-9!@#%^&*+=])[^\s\"',;]{4,7}(?![^\s\"',;]))"), 1, ("pass", "pw")),
    # … and a passphrase: 3+ words after ":" or "=", 4+ after "is" ("the password is one-time-use" is prose).
    ("password", re.compile(r"(?i)" + _PASSWORD_WORD + r"\b[\"']?\s*(?:[:=]\s*[\"']?(?=" + _passphrase(3) + r")|\bis\s+[\"']?(?="
                            + _passphrase(4) + "))(" + _passphrase(3) + ")"), 1, ("pass", "pw")),
    # Russian: "пароль: qwerty123", "пароль — Tr0ub4dor", "мой пароль hunter2", "токен: …". The value
    # is ASCII with a digit or symbol, so «пароль от почты я забыл» and «пароль 8-значный» stay;
    # a passphrase as in English (3+ words after a mark, 4+ after the name alone).
    ("password", re.compile(r"(?i)" + _RU_PASSWORD_WORD + "(?:" + _RU_MARKED + "|" + _RU_BARE + ")" + _NOT_A_SECRET
                            + r"((?=" + _ASCII + r"{0,6}[0-9!@#%^&*+=])" + _ASCII + r"{4,256}(?!" + _ASCII + r"))"), 1, ("парол",)),
    ("password", re.compile(r"(?i)" + _RU_PASSWORD_WORD + "(?:" + _RU_MARKED + "(?=" + _passphrase(3) + ")|" + _RU_BARE
                            + "(?=" + _passphrase(4) + "))(" + _passphrase(3) + ")"), 1, ("парол",)),
    ("password", re.compile(r"(?i)" + _RU_TOKEN_WORD + "(?:" + _RU_MARKED + "|" + _RU_BARE + ")" + _NOT_A_SECRET
                            + r"((?=" + _ASCII + r"{0,255}[0-9!@#%^&*+=])" + _ASCII + r"{8,256}(?!" + _ASCII + r"))"), 1,
     ("токен", "секрет", "ключ")),
    # Registry and cluster logins take the password after a space as well: docker/podman/helm
    # registry login -p …, --password …, az/oc/argocd/cf login -p … (--password-stdin reads stdin).
    ("password", re.compile(r"(?<![\w/.-])(?:docker|podman|nerdctl|buildah|skopeo|oras|helm|oc|argocd|az|cf)"
                            r"(?:[^\S\n]+[^\s;|&]{1,256}){0,2}?[^\S\n]+(?:login|repo[^\S\n]+add)"
                            r"(?:[^\S\n]+[^\s;|&]{1,256}){0,30}?[^\S\n]+(?:-p|--password)(?:[^\S\n]+|=)[\"']?" + _NOT_A_SECRET
                            + r"([^\s\"']{1,256})"), 1, ("login", "repo")),
    # Azure: a storage or Service Bus connection string's key, and a SAS URL's or token's signature.
    ("azure_key", re.compile(r"\b(?:AccountKey|SharedAccessKey)=([A-Za-z0-9+/]{20,256}+={0,2})"), 1, ("accountkey=", "sharedaccesskey=")),
    ("azure_sas", re.compile(r"(?<![^?&;\s\"'])sig=([A-Za-z0-9%+/=]{20,256}+)"), 1, ("sig=",)),
    # Twilio: an auth token or API key secret beside its account (AC…) or key (SK…) SID, as a
    # client's two arguments or curl's -u SID:token.
    ("twilio", re.compile(r"\b(?:AC|SK)[0-9a-f]{32}[\"']?[^\S\n]*[:,][^\S\n]*[\"']?([A-Za-z0-9]{32})(?![A-Za-z0-9])"), 1),
    ("sendgrid_key", re.compile(r"\bSG\.[A-Za-z0-9_-]{16,32}\.[A-Za-z0-9_-]{32,64}(?![A-Za-z0-9_-])"), 0, ("sg.",)),
]]
PII_RULES: list[Rule] = [Rule(*rule) for rule in [
    ("email", re.compile(r"(?<![/:])\b[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"), 0, ("@",)),
    # International or grouped national numbers with at least 9 digits; not dates, ids or versions.
    ("phone", re.compile(r"(?<![\w.-])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?|\d{2,4}[\s.-])\d{3,4}[\s.-]\d{3,4}(?![\w.-])"), 0),
]]


def find_secret(text: str) -> str | None:
    """The kind of the first secret in `text`, or None: for ids, which are refused rather than
    redacted (api_models.py). PII is not asked: an id is the client's name for a record, and
    ids like "2026-1108-100" have a phone number's shape."""
    words = text.casefold()
    return next((rule.kind for rule in SECRET_RULES if _may_match(rule, words) and rule.pattern.search(text)), None)


def _may_match(rule: Rule, words: str) -> bool:
    return not rule.needles or any(needle in words for needle in rule.needles)


@dataclass(frozen=True)
class Redacted:
    text: str
    kinds: Counter


class Redactor:
    def __init__(self, pii: bool) -> None:
        self.rules = SECRET_RULES + (PII_RULES if pii else [])

    def redact(self, text: str) -> Redacted:
        kinds: Counter = Counter()
        words = text.casefold()
        for rule in self.rules:
            if not _may_match(rule, words):
                continue

            def replace(m: re.Match[str], kind: str = rule.kind, group: int = rule.group) -> str:
                kinds[kind] += 1
                if group == 0:
                    return f"[REDACTED:{kind}]"
                start, end = m.span(group)
                return m.group(0)[: start - m.start()] + f"[REDACTED:{kind}]" + m.group(0)[end - m.start():]

            text, replaced = rule.pattern.subn(replace, text)
            if replaced:  # the replacement holds words too ("[REDACTED:password]")
                words = text.casefold()
        return Redacted(text, kinds)
