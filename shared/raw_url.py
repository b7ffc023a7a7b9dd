"""A request's URL as the client sent it. Starlette decodes query and path parameters as UTF-8
with U+FFFD for any byte that is not, so `?reason=caf%e9` would be stored as "caf\ufffd" and
`?user=%ff` would name a user "\ufffd": the services check the raw bytes instead."""

from __future__ import annotations

from urllib.parse import unquote_plus, unquote_to_bytes

NOT_UTF8 = "not UTF-8 once percent-decoded"


def query_pairs(scope: dict) -> list[tuple[str, bytes]]:
    """Each query parameter's name (decoded) and its value's bytes once percent-decoded."""
    pairs = []
    for pair in scope.get("query_string", b"").decode("latin-1").split("&"):
        if pair:
            raw_name, _, raw_value = pair.partition("=")
            pairs.append((unquote_plus(raw_name), unquote_to_bytes(raw_value.replace("+", " "))))
    return pairs


def is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _path_is_utf8(scope: dict) -> bool:
    return is_utf8(unquote_to_bytes(scope.get("raw_path", b"").decode("latin-1")))


def not_utf8_parameters(scope: dict, path_params: dict[str, str]) -> list[str]:
    """The query and path parameters whose bytes are not UTF-8. Of a path that is not, the
    parameters holding the U+FFFD each bad byte became (all of them when none does)."""
    names = [name for name, raw in query_pairs(scope) if not is_utf8(raw)]
    if _path_is_utf8(scope):
        return names
    return names + ([name for name, value in path_params.items() if "\ufffd" in value] or list(path_params))
