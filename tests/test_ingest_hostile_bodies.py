"""Hostile bodies to the ingest API found by fault-injection (round fault9): each is a 4xx that
names what is wrong and stays small, and nothing is stored. And a body that stalls holds
neither ingest nor the recall service past its stop grace."""

from __future__ import annotations

import codecs
import contextlib
import gzip
import json
import re
import socket
import time

import httpx
import pytest

from shared.stream_schema import RETENTION_OVERRIDES
from shared.tenant_paths import user_hash
from tests.conftest import INGEST_KEY, conversation_payload, ingest_url, mint, wait_until


@pytest.fixture
def ingest(services, service_env):
    services("ingest")
    return ingest_url(service_env)


def post_raw(url: str, raw: bytes, query: str = "") -> httpx.Response:
    return httpx.post(f"{url}/turns{query}", headers={"content-type": "application/json", "x-ingest-key": INGEST_KEY},
                      content=raw, timeout=60)


def test_a_body_of_a_hundred_thousand_unknown_keys_gets_a_short_422_not_a_reply_larger_than_the_body(ingest, r):
    keys = b",".join(b'"k%d": 1' % i for i in range(100_000))
    raw = b"{" + keys + b', "user": "alice", "conversation_id": "c", "turns": []}'
    resp = post_raw(ingest, raw)
    assert resp.status_code == 422, resp.text[:300]
    fields = resp.json()["fields"]
    assert len(resp.content) < 10_000, f"{len(resp.content)} bytes of errors for a {len(raw)}-byte body"
    assert {"field": "turns", "message": "List should have at least 1 item after validation, not 0"} in fields
    assert fields[-1]["field"] == "body" and fields[-1]["message"].startswith(f"{100_000 + 1 - 20} more problems")
    assert r.xlen("recall:turns") == 0


def test_thousands_of_unknown_query_parameters_get_a_short_422(ingest, r):
    query = "?" + "&".join(f"q{i}=1" for i in range(3000))
    resp = post_raw(ingest, b'{"user": "alice", "conversation_id": "c", "turns": []}', query)
    assert resp.status_code == 422 and len(resp.json()["fields"]) == 21, resp.text[:300]
    assert r.xlen("recall:turns") == 0


@pytest.mark.parametrize("raw, field", [
    (b'{"user": "alice", "conversation_id": "c", "turns": [{"role": "user", "text": "a", "ts": "2026-10-08T10:00:00Z"},'
     b' {"role": "user", "text": "b", "ts": "2026-10-08T10:01:00Z", "role": "assistant"}]}', "turns[1].role"),
    (b'{"user": "alice", "conversation_id": "c", "turns": [{"role": "user", "text": "a", "ts": "2026-10-08T10:00:00Z",'
     b' "id": {"x": [1, {"\\ud800": 1, "\\ud800": 2}]}}]}', "turns[0].id.x[1].\\ud800"),
    (b'{"conversation_id": "c", "user": "a", "conversation_id": "d", "turns": []}', "conversation_id"),
])
def test_a_key_given_twice_is_422_naming_where_it_is_in_the_body(ingest, r, raw, field):
    """Fifty turns each have a `text`: the error must say which object gave a key twice."""
    resp = post_raw(ingest, raw)
    assert resp.status_code == 422, resp.text
    assert resp.json()["fields"] == [{"field": field, "message": "given more than once in one JSON object"}]
    assert r.xlen("recall:turns") == 0


def delete(url: str, path_and_query: str) -> httpx.Response:
    return httpx.request("DELETE", f"{url}{path_and_query}", headers={"x-ingest-key": INGEST_KEY}, timeout=10)


@pytest.mark.parametrize("path_and_query, field", [
    ("/users?user=%ff%fe", "user"),
    ("/users?user=%ED%A0%80", "user"),  # a lone surrogate, UTF-8-encoded
    ("/conversations/c?user=al%C3ice", "user"),
    ("/users/%ff%fe", "user"),
    ("/users/al%ED%A0%80ice/retention", "user"),
])
def test_a_user_id_that_is_not_utf8_in_the_url_forgets_nobody_and_is_422_naming_user(ingest, r, path_and_query, field):
    """Its bytes were replaced by U+FFFD: a forget of "\ufffd\ufffd" was accepted (202, then
    `done`) while the user the gateway meant kept everything."""
    resp = delete(ingest, path_and_query)
    assert resp.status_code == 422, resp.text
    assert resp.json()["fields"] == [{"field": field, "message": "not UTF-8 once percent-decoded"}]
    assert r.xlen("recall:turns") == 0


def test_a_user_id_holding_a_real_replacement_character_is_still_forgotten(ingest, r):
    resp = delete(ingest, "/users?user=al%EF%BF%BDice+b")
    assert resp.status_code == 202, resp.text
    assert r.xlen("recall:turns") == 1


# ---- round hard10: control characters, body encodings, integers Python will not convert -------
@pytest.mark.parametrize("mutate, field, char", [
    (lambda b: b["turns"][2].update(text="before\x00after"), "turns[2].text", "a NUL character (U+0000)"),
    (lambda b: b.update(user="ali\x00ce"), "user", "a NUL character (U+0000)"),
    (lambda b: b.update(user="ali\x1b[2Jce"), "user", "the control character U+001B"),
    (lambda b: b.update(user="ali\x9b2Jce"), "user", "the control character U+009B"),
    (lambda b: b.update(user=" "), "user", "blank"),  # no token may name a blank subject: no one could read it
    (lambda b: b.update(user="\t\n"), "user", "blank"),
    (lambda b: b["turns"][1].update(role="tool", tool_name="grep\x7f"), "turns[1].tool_name", "the control character U+007F"),
    (lambda b: b["turns"][1].update(role="tool", tool_name="grep\x07"), "turns[1].tool_name", "the control character U+0007"),
    (lambda b: b["turns"][0].update(id="t\x0c1"), "turns[0].id", "control characters"),
])
def test_a_nul_anywhere_or_a_control_character_in_a_name_is_422_naming_the_field_and_nothing_is_stored(
        ingest, r, mutate, field, char):
    """A NUL reached the agent raw (and PostgreSQL-backed agent memory refuses it); ESC and the
    other C0 controls in a name rewrite a terminal that prints it."""
    body = conversation_payload("alice", "c", ["one", "two", "three"])
    mutate(body)
    resp = post_raw(ingest, json.dumps(body).encode())
    assert resp.status_code == 422, resp.text
    [problem] = resp.json()["fields"]
    assert problem["field"] == field and char in problem["message"], problem
    assert not problem["message"].startswith("Value error"), "the reason itself, not pydantic's prefix"
    assert r.xlen("recall:turns") == 0


def test_terminal_output_in_a_turns_text_is_kept_as_written(ingest, r):
    """Tool turns carry terminal output: colour codes, backspaces, form feeds, tabs, CR LF. A
    refused turn would leave its whole conversation unstorable, so the text keeps them."""
    written = ["col1\tcol2\r\nline two\n", "\x1b[31mFAILED\x1b[0m tests/test_x.py\x08\x0c"]
    body = conversation_payload("alice", "c", written)
    resp = post_raw(ingest, json.dumps(body).encode())
    assert resp.status_code == 202, resp.text
    [(_, fields)] = r.xrange("recall:turns")
    assert [t["text"] for t in json.loads(fields["event"])["turns"]] == written


@pytest.mark.parametrize("method, path_and_query, user", [
    ("DELETE", "/users/ali%00ce", "ali\x00ce"),
    ("DELETE", "/users?user=ali%1B%5B2Jce", "ali\x1b[2Jce"),
    ("DELETE", "/conversations/c?user=%1B%5B2J", "\x1b[2J"),
])
def test_a_user_whose_id_holds_control_characters_is_still_forgotten(ingest, r, method, path_and_query, user):
    """Ingest took any character in a user id until this release (NUL and ESC too): such users'
    conversations are stored, and a forget, which only hashes the id, must still reach them."""
    resp = httpx.request(method, f"{ingest}{path_and_query}", headers={"x-ingest-key": INGEST_KEY}, timeout=10)
    assert resp.status_code == 202, resp.text
    [(_, fields)] = r.xrange("recall:turns")
    assert fields["user_hash"] == user_hash(user)


def test_a_user_whose_id_holds_control_characters_keeps_a_retention_override(ingest, r):
    resp = httpx.put(f"{ingest}/users/ali%07ce/retention", json={"days": 30}, headers={"x-ingest-key": INGEST_KEY}, timeout=10)
    assert resp.status_code == 200, resp.text
    assert r.hget(RETENTION_OVERRIDES, user_hash("ali\x07ce")) == "30"


@pytest.mark.parametrize("raw, named", [
    (codecs.BOM_UTF8 + b'{"user": "alice", "conversation_id": "c", "turns": []}', "byte order mark"),
    ('{"user": "alice", "conversation_id": "c", "turns": []}'.encode("utf-16"), "is UTF-16LE (with a byte order mark)"),
    ('{"user": "alice", "conversation_id": "c", "turns": []}'.encode("utf-16-be"), "is UTF-16BE (by its NUL bytes)"),
    ('{"user": "alice", "conversation_id": "c", "turns": []}'.encode("utf-32"), "is UTF-32LE (with a byte order mark)"),
])
def test_a_body_that_is_not_plain_utf8_is_415_naming_its_encoding(ingest, r, raw, named):
    """Python's json guessed the encoding and took these (RFC 8259: JSON between systems is UTF-8,
    and a sender must not add a BOM); the same body posted correctly is then a 422 on its turns."""
    resp = post_raw(ingest, raw)
    assert resp.status_code == 415, resp.text
    [problem] = resp.json()["fields"]
    assert problem["field"] == "body" and named in problem["message"] and "RFC 8259" in problem["message"], problem
    assert r.xlen("recall:turns") == 0


@pytest.mark.parametrize("encoding", ["gzip", "br", "GZIP, identity"])
def test_a_compressed_body_is_415_naming_content_encoding_and_stores_nothing(ingest, r, encoding):
    """A gzip body was answered 400 "malformed JSON: not UTF-8: byte 0x8b at offset 1", which sent
    the gateway's author after its JSON; inflated, it would pass every size limit."""
    body = json.dumps(conversation_payload("alice", "c", ["the N-11 upgrade"])).encode()
    headers = {"content-type": "application/json", "x-ingest-key": INGEST_KEY, "content-encoding": encoding}
    resp = httpx.post(f"{ingest}/turns", content=gzip.compress(body), headers=headers, timeout=30)
    assert resp.status_code == 415, resp.text
    assert resp.json()["fields"] == [{"field": "content-encoding",
                                      "message": f"Content-Encoding {encoding!r} is not accepted: send the body uncompressed"}]
    assert r.xlen("recall:turns") == 0
    assert post_raw(ingest, body).status_code == 202


@pytest.mark.parametrize("method, path, raw, field", [
    ("POST", "/turns", b'{"user": "alice", "conversation_id": "c", "turns": [{"role": "user", "text": "a", "ts": ' + b"7" * 5000
     + b"}]}", "turns[0].ts"),
    ("PUT", "/users/alice/retention", b'{"days": -' + b"9" * 5000 + b"}", "days"),
])
def test_an_integer_of_5000_digits_is_422_naming_its_field_in_the_projects_words(ingest, r, method, path, raw, field):
    resp = httpx.request(method, f"{ingest}{path}", content=raw, timeout=10,
                         headers={"content-type": "application/json", "x-ingest-key": INGEST_KEY})
    assert resp.status_code == 422, resp.text
    assert resp.json()["fields"] == [{"field": field, "message": "an integer of 5,000 digits; no field takes one of more than 4,300"}]
    assert "sys.set_int_max_str_digits" not in resp.text
    assert r.xlen("recall:turns") == 0 and r.hlen(RETENTION_OVERRIDES) == 0


def stalled_head(path: str, declared: int) -> str:
    """A request with a valid key and token that announces `declared` bytes of body."""
    return (f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"accept: application/json, text/event-stream\r\nx-ingest-key: {INGEST_KEY}\r\n"
            f"authorization: Bearer {mint('alice')}\r\ncontent-length: {declared}\r\n")


@pytest.mark.parametrize("command, port_var, path", [("ingest", "RECALL_INGEST_PORT", "/turns"),
                                                     ("serve", "RECALL_RECALL_PORT", "/mcp")])
def test_connections_that_send_nothing_or_half_their_headers_are_closed_after_the_read_timeout(services, service_env,
                                                                                             command, port_var, path):
    """uvicorn's keep-alive timer starts only after a response: such connections stayed open for
    good, and enough of them (no key or token needed) took every file descriptor."""
    service = services(command, RECALL_REQUEST_READ_TIMEOUT_S="1.5")
    port = int(service_env[port_var])
    sent = {"nothing": b"", "half the headers": stalled_head(path, 1000).encode()[:60]}
    opened = {what: socket.create_connection(("127.0.0.1", port)) for what in sent}
    try:
        for what, data in sent.items():
            opened[what].sendall(data)
        started = time.monotonic()
        for what, conn in opened.items():
            conn.settimeout(10)
            assert conn.recv(65536) == b"", f"{what}: closed without an answer"
            assert time.monotonic() - started < 6, what
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        assert "Traceback" not in service.output()
    finally:
        for conn in opened.values():
            conn.close()


@pytest.mark.parametrize("command, port_var", [("ingest", "RECALL_INGEST_PORT"), ("serve", "RECALL_RECALL_PORT"),
                                               ("indexer", "RECALL_INDEXER_PORT")])
def test_headers_past_the_limit_get_431_and_the_connection_closed_while_a_long_token_fits(services, service_env,
                                                                                          command, port_var):
    """httptools held a request's headers until their end, however long: four connections without a
    key sending a 64 MiB header each took ingest from 74 to 336 MB (its pod's limit is 512)."""
    service = services(command)
    port = int(service_env[port_var])
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-junk: ")
        with pytest.raises(OSError):  # the service stops reading and closes: the sender is cut off
            for _ in range(64):
                conn.sendall(b"a" * 2**20)
        head, body = read_answer(conn)
    assert head.startswith(b"HTTP/1.1 431 "), head
    assert json.loads(body)["error"] == "headers_too_large"
    assert "http.headers_too_large" in service.output() and "Traceback" not in service.output()
    assert connections_cut(port, "headers_too_large") == 1
    # 32 KiB of headers (an identity provider's token with many groups) still fit in the default 64 KiB.
    ok = httpx.get(f"http://127.0.0.1:{port}/healthz", headers={"x-trace": "t" * 32_768}, timeout=10)
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("command, port_var", [("ingest", "RECALL_INGEST_PORT"), ("serve", "RECALL_RECALL_PORT"),
                                               ("indexer", "RECALL_INDEXER_PORT")])
def test_a_connection_pipelining_more_requests_than_the_bound_is_cut_off_while_a_short_pipeline_is_answered(
        services, service_env, command, port_var):
    """uvicorn queued every pipelined request without a bound: four keyless connections writing
    16 MiB of GET /healthz each, reading no answer, took ingest from 74 MB to 3.6 GB."""
    service = services(command)
    port = int(service_env[port_var])
    request = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"

    def answers_to(count: int) -> tuple[bytes, bool]:
        """What the service wrote back, and whether it closed the connection."""
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(request * count)
            conn.settimeout(2)
            got = b""
            with contextlib.suppress(TimeoutError):
                while chunk := conn.recv(65536):
                    got += chunk
                return got, True
            return got, False

    answered, closed = answers_to(10)
    assert answered.count(b"HTTP/1.1 200") == 10 and not closed
    flooded, closed = answers_to(1000)
    assert closed and b"HTTP/1.1 400 " in flooded and flooded.count(b"HTTP/1.1 200") <= 20, flooded[-300:]
    assert "http.pipeline_too_deep" in service.output() and connections_cut(port, "pipeline_too_deep") == 1
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200


def test_requests_whose_bodies_arrive_with_their_headers_are_not_counted_as_headers(ingest, r):
    """Two posts of ~300 KB written at once on one connection: a socket read that ended a request
    was counted as header bytes of the next one (a first version of the 431), which refused them."""
    def post(conversation_id: str) -> bytes:
        body = json.dumps(conversation_payload("alice", conversation_id, [f"{k} " + "word " * 10_000 for k in range(6)])).encode()
        return (b"POST /turns HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                b"x-ingest-key: %s\r\ncontent-length: %d\r\n\r\n%s" % (INGEST_KEY.encode(), len(body), body))

    port = int(ingest.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.sendall(post("c1") + post("c2"))
        conn.settimeout(30)
        answers = b""
        while answers.count(b"HTTP/1.1 ") < 2 and (chunk := conn.recv(65536)):
            answers += chunk
    assert re.findall(rb"HTTP/1.1 (\d+)", answers) == [b"202", b"202"], answers[:300]
    assert wait_until(lambda: r.xlen("recall:turns") == 2, 10)


def read_answer(conn: socket.socket) -> tuple[bytes, bytes]:
    """(status line and headers, body) of the one answer, read until the service closes."""
    conn.settimeout(15)
    answer = b""
    while chunk := conn.recv(65536):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


def counted(port: int, series: str, reason: str) -> float:
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    [value] = [line.split()[-1] for line in metrics.splitlines() if line.startswith(f'{series}{{reason="{reason}"}}')]
    return float(value)


def bodies_refused(port: int, reason: str) -> float:
    return counted(port, "recall_http_bodies_refused_total", reason)


def connections_cut(port: int, reason: str) -> float:
    return counted(port, "recall_http_connections_cut_total", reason)


@pytest.mark.parametrize("command, port_var, path", [("ingest", "RECALL_INGEST_PORT", "/turns"),
                                                     ("serve", "RECALL_RECALL_PORT", "/mcp")])
def test_a_caller_with_a_valid_key_that_stalls_its_body_gets_a_408_counted_and_logged_in_one_line(
        services, service_env, command, port_var, path):
    """Headers, a Content-Length and part of the body, then nothing: the connection was closed
    without an answer at the read timeout, holding what was sent until then (up to the body limit,
    1 MiB at /mcp), and the MCP endpoint logged the disconnect as an error with its stack while no
    metric counted it (docs/benchmarks.md, round 33)."""
    service = services(command, RECALL_REQUEST_READ_TIMEOUT_S="2")
    port = int(service_env[port_var])
    part = b'{"user": "alice", "turns": ["' + b"x" * 200_000
    with socket.create_connection(("127.0.0.1", port)) as stalled:
        started = time.monotonic()
        stalled.sendall((stalled_head(path, 2**20) + "\r\n").encode() + part)
        head, body = read_answer(stalled)
        waited = time.monotonic() - started
    assert head.startswith(b"HTTP/1.1 408 "), head + body
    assert b"connection: close" in head.lower()
    assert 1.5 < waited < 5, waited
    detail = json.dumps(json.loads(body))
    assert f"{len(part):,} bytes of the 1048576 its Content-Length announced" in detail
    assert "RECALL_REQUEST_READ_TIMEOUT_S" in detail
    assert bodies_refused(port, "stalled") == 1
    [line] = [json.loads(line) for line in service.output().splitlines() if "body_timeout" in line]
    assert line["level"] == "warning" and line["route"] == path and line["received_bytes"] == len(part)
    assert not [line for line in service.output().splitlines() if '"exception"' in line or "Traceback" in line]
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200


def test_a_caller_that_hangs_up_mid_body_at_mcp_is_counted_not_logged_with_a_stack(services, service_env):
    """The MCP SDK, handed the disconnect, logged 'Error handling POST request' with its stack."""
    service = services("serve")
    port = int(service_env["RECALL_RECALL_PORT"])
    with socket.create_connection(("127.0.0.1", port)) as gone:
        gone.sendall((stalled_head("/mcp", 1000) + '\r\n{"jsonrpc": ').encode())
        time.sleep(0.5)
    assert wait_until(lambda: bodies_refused(port, "client_closed") == 1, 10)
    assert "Error handling POST request" not in service.output() and '"exception"' not in service.output()


def one_answer(conn: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the answer, read by its Content-Length (the service may keep
    the connection open after it)."""
    conn.settimeout(15)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += conn.recv(65536) or pytest.fail(f"closed after {answer!r}")
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE).group(1))
    while len(body) < length:
        body += conn.recv(65536) or pytest.fail(f"closed after {head + body!r}")
    return int(head.split()[1]), json.loads(body)


def body_bytes_held(port: int) -> float:
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    [value] = [line.split()[-1] for line in metrics.splitlines() if line.startswith("recall_http_body_buffer_bytes ")]
    return float(value)


@pytest.mark.parametrize("command, port_var, paths", [("ingest", "RECALL_INGEST_PORT", ["/turns"]),
                                                      ("serve", "RECALL_RECALL_PORT", ["/mcp", "/realms/r1/memory"])])
def test_a_body_past_the_process_budget_is_a_busy_503_at_once_and_what_each_body_held_goes_back(
        services, service_env, command, port_var, paths):
    """Until round 33's read deadline each stalled caller held what it sent, up to the body limit,
    and nothing bounded the sum (200 such callers: ingest 70 -> 567 MiB with 4 MiB each, past its
    512 MiB pod limit). A second body past RECALL_BODY_BUFFER_BYTES is refused at once, and the
    bytes of a refused body, a caller that hung up and a stalled one go back to the budget."""
    service = services(command, RECALL_BODY_BUFFER_BYTES=str(3 * 2**19), RECALL_INGEST_MAX_BODY_BYTES=str(2**20),
                       RECALL_REQUEST_READ_TIMEOUT_S="8")
    port = int(service_env[port_var])
    nearly_whole = b"x" * (2**20 - 1)
    with socket.create_connection(("127.0.0.1", port)) as holder:
        holder.sendall((stalled_head(paths[0], 2**20) + "\r\n").encode() + nearly_whole)
        assert wait_until(lambda: body_bytes_held(port) == len(nearly_whole), 10)
        for path in paths:
            with socket.create_connection(("127.0.0.1", port)) as late:
                started = time.monotonic()
                late.sendall((stalled_head(path, 2**20) + "\r\n").encode() + b"y" * 700_000)
                status, body = one_answer(late)
                assert status == 503 and time.monotonic() - started < 4, (path, status, body)  # not at the deadline
            said = body["fields"][0]["message"] if command == "ingest" else body["detail"]
            assert body == ({"error": "busy, retry later", "fields": [{"field": "body", "message": said}]}
                            if command == "ingest" else {"error": "busy", "detail": said}), body
            assert "RECALL_BODY_BUFFER_BYTES" in said and "retry" in said
            assert body_bytes_held(port) == len(nearly_whole), f"{path}: the refused body's part went back"
        assert bodies_refused(port, "budget") == len(paths)
    assert wait_until(lambda: bodies_refused(port, "client_closed") == 1, 10)
    assert body_bytes_held(port) == 0, "the caller that hung up gave its part back"
    with socket.create_connection(("127.0.0.1", port)) as stalled:  # the budget has room for it again
        stalled.sendall((stalled_head(paths[0], 2**20) + "\r\n").encode() + nearly_whole)
        assert one_answer(stalled)[0] == 408
    assert body_bytes_held(port) == 0, "the stalled body gave its part back"
    lines = [json.loads(line) for line in service.output().splitlines() if "http.body_budget" in line]
    assert [(line["level"], line["received_bytes"] < 700_000, line["budget_bytes"]) for line in lines] == \
        [("warning", True, 3 * 2**19)] * len(paths)
    assert not [line for line in service.output().splitlines() if '"exception"' in line or "Traceback" in line]


@pytest.mark.parametrize("command, port_var, path", [("ingest", "RECALL_INGEST_PORT", "/turns"),
                                                     ("serve", "RECALL_RECALL_PORT", "/mcp")])
def test_a_client_stalled_in_the_middle_of_its_body_does_not_hold_a_service_past_its_stop_grace(services, service_env,
                                                                                                command, port_var, path):
    """uvicorn waits for the requests in flight after SIGTERM, without end unless told: one whose
    client stopped sending its body held the process until it was killed."""
    service = services(command, RECALL_STOP_GRACE_S="2")
    with socket.create_connection(("127.0.0.1", int(service_env[port_var]))) as stalled:
        stalled.sendall((stalled_head(path, 1000) + '\r\n{"user": ').encode())
        time.sleep(0.5)  # in flight: its handler waits for the other 990 bytes
        started = time.monotonic()
        service.proc.terminate()
        assert service.proc.wait(30) == 0, service.output()[-2000:]  # a stop as asked is not an error
        assert 1.5 < time.monotonic() - started < 15, "stopped at its grace, once the stalled request was cancelled"
        assert "request cancelled: the stop grace" in service.output() and "CancelledError" not in service.output(), \
            "an expected stop is one warning per cancelled request, not an error with its stack"
