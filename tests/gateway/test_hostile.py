"""Hostile clients through the real daemon's gateway, over raw sockets: keys never reach
the log, paths never leave ``/v1/``, encodings and methods get OpenAI answers, and
garbage is a quiet info line (issue 28: 3, 4, 5, 7, 8)."""

from __future__ import annotations

import gzip
import json
import os
import socket
import zlib
from pathlib import Path
from typing import Any

from harness.rawhttp import Raw, exchange, leaked, openai_error, request

# No hex, no common word: a 6-character run of these cannot appear in a log by chance.
KEY = "sk-Qz7WvKpLmRtYuXnJhGd3"
MODEL = json.dumps({"model": "m", "prompt": "hi"}).encode()


def keyed(reconcile: Any, gateway: Any, **spec: Any) -> Any:
    reconcile.write("m", **spec)
    keys = reconcile.tmp / "keys.txt"
    keys.write_text(KEY + "\n")
    os.chmod(keys, 0o600)
    g = gateway("--api-keys", str(keys))
    g.wait_phase("m", "Ready")
    return g


def send(g: Any, method: str, path: str, body: bytes = MODEL, **headers: str) -> Raw:
    fields = {"Authorization": f"Bearer {KEY}", **headers}
    return exchange(g.port, request(method, path, body, fields))


def refused(answer: Raw, status: int, code: str) -> dict[str, Any]:
    assert answer.status == status, answer
    error = openai_error(answer)
    assert error is not None and error["code"] == code, answer
    return error


def log_lines(text: str) -> list[dict[str, Any]]:
    lines = []
    for line in text.splitlines():
        try:
            lines.append(json.loads(line))
        except ValueError:
            lines.append({"level": "?", "event": line})
    return lines


def assert_quiet(g: Any) -> None:
    """No traceback, no error-level line, no key fragment in the daemon's log."""
    text = g.text()
    assert "Traceback" not in text and "Error handling request" not in text, text[-3000:]
    errors = [line for line in log_lines(text) if line.get("level") in ("error", "critical")]
    assert not errors, errors[:3]
    assert not leaked(text, [KEY]), leaked(text, [KEY])


def engine_log(reconcile: Any) -> str:
    return Path(reconcile.state / "instances" / "logs" / "m.log").read_text()


def test_malformed_requests_never_put_a_key_in_the_log(reconcile: Any, gateway: Any) -> None:
    g = keyed(reconcile, gateway)
    auth = f"Authorization: Bearer {KEY}".encode()
    cases = [
        b"POST /v1/chat/completions HTTP/1.1\nHost: x\n" + auth + b"\n\n",  # LF only
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + b"A" * 9000 + b"\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nx-api-key: "
        + KEY.encode()
        + b"B" * 9000
        + b"\r\n\r\n",
        b"POST /v1/chat/" + KEY.encode() + b"\x01 HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n\r\n",
    ]
    answers = [exchange(g.port, data) for data in cases]
    assert g.request("GET", "/healthz").status == 200
    g.finish()
    assert_quiet(g)
    for answer in answers:
        refused(answer, 400, "malformed_request")
        assert not leaked(answer.data.decode("latin-1"), [KEY]), answer  # nor echoed back


def test_paths_never_leave_v1(reconcile: Any, gateway: Any) -> None:
    g = keyed(reconcile, gateway)
    escapes = [
        "/v1/../../etc/passwd",
        "/v1/%2e%2e/health",
        "/v1/%2E%2e/%2e%2E/health",
        "/v1/../metrics",
        "/v1/../v1/../slots?action=erase",
        "/v1/./../slots",
    ]
    # Each 400 says the next move too (they said what was wrong alone).
    for path in escapes:
        said = refused(send(g, "POST", path), 400, "invalid_path")["message"]
        assert said == (
            "the request path leaves /v1/ once its dot segments are resolved: send a path "
            "under /v1/ with no `..`, e.g. /v1/chat/completions"
        ), said
    for path in ("/v1/%2f..%2fslots", "/v1/..%5cslots", "/v1/a\\..\\..\\slots"):
        said = refused(send(g, "POST", path), 400, "invalid_path")["message"]
        assert said == (
            "the request path is not a plain absolute path (encoded slash, backslash, NUL): "
            "send the API's path as it is named, e.g. /v1/chat/completions"
        ), said
    # Dot segments that stay under /v1/ are resolved, and only that path goes on.
    ok = send(g, "POST", "/v1/x/../completions?a=1")
    assert ok.status == 200 and ok.json()["object"] == "text_completion", ok
    # A target in absolute-form (a client with the gateway as its HTTP proxy: `curl -x`)
    # is its path and query, as RFC 9112 3.2.2 and nginx take it (it was refused as "not
    # a plain absolute path (encoded slash...)"), held to the same rules.
    proxied = send(g, "POST", "http://user:pw@gateway.example:80/v1/y/../completions?b=2")
    assert proxied.status == 200 and proxied.json()["object"] == "text_completion", proxied
    said = refused(send(g, "POST", "HTTP://h/v1/../../etc/passwd"), 400, "invalid_path")
    assert said["message"].startswith("the request path leaves /v1/"), said
    g.finish()
    seen = engine_log(reconcile)
    assert '"POST /v1/completions?a=1 ' in seen and '"POST /v1/completions?b=2 ' in seen, seen
    # "POST /metrics", not "/metrics": the gateway itself GETs each Ready engine's /metrics
    # every 5 s (its load signals), so a GET lands in this log when a read falls in the test
    for word in ("/etc/passwd", "POST /health", "POST /metrics", "slots", "..", "gateway.example"):
        assert word not in seen, seen
    assert_quiet(g)


def test_content_encodings_are_decoded_or_refused(reconcile: Any, gateway: Any) -> None:
    g = keyed(reconcile, gateway)
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    bare = raw_deflate.compress(MODEL) + raw_deflate.flush()
    for coding, body in (
        ("gzip", gzip.compress(MODEL)),
        ("deflate", zlib.compress(MODEL)),
        ("deflate", bare),
        ("identity", MODEL),
        ("gzip, identity", gzip.compress(MODEL)),
    ):
        answer = send(g, "POST", "/v1/completions", body, **{"Content-Encoding": coding})
        assert answer.status == 200 and answer.json()["model"] == "m", (coding, answer)
    for coding in ("gzip", "deflate"):  # a plain body that says it is not
        answer = send(g, "POST", "/v1/completions", MODEL, **{"Content-Encoding": coding})
        refused(answer, 400, "invalid_content_encoding")
    for coding in ("br", "zstd", "compress", "gzip, br"):
        answer = send(g, "POST", "/v1/completions", MODEL, **{"Content-Encoding": coding})
        refused(answer, 415, "unsupported_content_encoding")
    bomb = gzip.compress(b" " * (33 * 1024 * 1024))  # past the default --max-body of 32 MiB
    answer = send(g, "POST", "/v1/completions", bomb, **{"Content-Encoding": "gzip"})
    refused(answer, 413, "request_too_large")
    g.finish()
    assert "Content-Encoding" not in engine_log(reconcile)
    assert_quiet(g)


def test_unrouted_methods_get_405_and_unknown_paths_404(reconcile: Any, gateway: Any) -> None:
    g = keyed(reconcile, gateway)
    for method in ("TRACE", "OPTIONS", "MKCOL", "PROPFIND", "CONNECT"):
        answer = send(g, method, "/v1/chat/completions")
        refused(answer, 405, "method_not_allowed")
        assert "POST" in answer.headers["allow"], answer
    # A method HTTP does not know at all is the parser's to refuse: still an OpenAI body.
    refused(send(g, "BREW", "/v1/chat/completions"), 400, "malformed_request")
    answer = send(g, "POST", "/healthz")
    refused(answer, 405, "method_not_allowed")
    assert answer.headers["allow"] == "GET, HEAD"
    for path in ("/nothing", "/v1", "/", "/metrics"):
        refused(send(g, "GET", path), 404, "not_found")
    g.finish()
    assert not any(m in engine_log(reconcile) for m in ("TRACE", "OPTIONS", "MKCOL"))
    assert_quiet(g)


def test_garbage_is_a_few_info_lines_never_a_traceback(reconcile: Any, gateway: Any) -> None:
    g = keyed(reconcile, gateway)
    garbage = [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"GET / HTTP/9.9\r\n\r\n"]
    garbage += [b"GET /v1/x HTTP/1.1\r\nBad Header\r\n\r\n", b"POST /v1/x HTTP/1.1\n\n"]
    for _ in range(15):
        for data in garbage:
            assert exchange(g.port, data).status in (None, 400)
    assert g.request("GET", "/healthz").status == 200
    g.finish()
    assert_quiet(g)
    said = [line for line in log_lines(g.text()) if "malformed" in str(line.get("event"))]
    assert 0 < len(said) <= 4 * 5, said  # rate-limited: at most 5 of a kind per 10 s
    assert all(line["level"] == "info" for line in said), said


def test_a_client_hanging_up_after_done_is_no_error(reconcile: Any, gateway: Any) -> None:
    g = keyed(reconcile, gateway, command=reconcile.demo_command(chunks="3"))
    for _ in range(10):
        hang_up_after_done(g)
    assert g.post("m", {"x-api-key": KEY}).status == 200
    g.finish()
    assert_quiet(g)


def hang_up_after_done(g: Any) -> None:
    """A streaming client that closes the moment it reads ``data: [DONE]``."""
    body = json.dumps({"model": "m", "stream": True}).encode()
    data = request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {KEY}"})
    with socket.create_connection(("127.0.0.1", g.port), timeout=10) as sock:
        sock.sendall(data)
        seen = b""
        while b"data: [DONE]" not in seen:
            chunk = sock.recv(65536)
            assert chunk, seen
            seen += chunk
