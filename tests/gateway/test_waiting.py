"""Waiting comments (issue 41): a streaming request held while its engine starts gets
``: waiting for <name>: <phase> <n>s`` lines until the engine's answer begins; a raw client
sees them, the official ``openai`` client skips them; a stream that was begun and then
cannot be served ends with an OpenAI error event; a non-streaming request gets none."""

from __future__ import annotations

import http.client
import json
import socket
import sys
from typing import Any

import openai

from controller.gateway.accounting.requestlog import path_in
from controller.gateway.settings import WAITING_ENV, WAITING_EVERY, waiting_every_from_env

FAST = {WAITING_ENV: "0.2"}  # a comment every 0.2 s: several during a 1.5 s cold start
COLD = {"activation": "OnDemand", "idleTimeout": "10m"}


def raw_stream(port: int, body: dict[str, Any]) -> tuple[int, dict[str, str], list[str]]:
    """The answer's status, headers and body lines, read as they come."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body).encode())
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read().decode().splitlines()
    finally:
        conn.close()


def raw_answer(
    port: int, body: dict[str, Any], version: str = "1.1"
) -> tuple[str, list[str], list[str], list[str]]:
    """A streamed answer read off the socket as sent: its status line, its header lines,
    its body's lines (an HTTP/1.1 answer's chunks joined) and its trailer lines (what
    ``http.client`` reads past and drops; none in HTTP/1.0, whose body ends with the
    connection)."""
    data = json.dumps(body).encode()
    ask = (
        f"POST /v1/chat/completions HTTP/{version}\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(ask.encode() + data)
        whole = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, rest = whole.partition(b"\r\n\r\n")
    status, *fields = head.decode("latin-1").split("\r\n")
    if version == "1.0":
        assert not any(f.startswith("Transfer-Encoding") for f in fields), fields
        return status, fields, rest.decode().splitlines(), []
    assert "Transfer-Encoding: chunked" in fields, fields
    text = b""
    while True:
        size, _, rest = rest.partition(b"\r\n")
        if int(size, 16) == 0:
            break
        text, rest = text + rest[: int(size, 16)], rest[int(size, 16) + 2 :]
    trailers = rest.decode("latin-1").split("\r\n")
    assert trailers[-2:] == ["", ""], trailers  # the trailer section ends with a blank line
    return status, fields, text.decode().splitlines(), trailers[:-2]


def test_a_cold_start_streams_comments_then_the_answer(reconcile: Any, gateway: Any) -> None:
    reconcile.write("cold", command=reconcile.demo_command(load_seconds="1.5"), **COLD)
    g = gateway(env=FAST)
    body = {"model": "cold", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    status, headers, lines = raw_stream(g.port, body)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream"), headers
    comments = [line for line in lines if line.startswith(":")]
    data = [line for line in lines if line.startswith("data:")]
    assert len(comments) >= 2, lines
    assert all(line.startswith(": waiting for cold: ") for line in comments), comments
    assert lines.index(comments[-1]) < lines.index(data[0])  # none once the answer began
    phases = {line.split(": ")[2].rsplit(" ", 1)[0] for line in comments}
    # The phases a cold start passes through (DESIGN.md's list): `Reserved` is the record's
    # between the pass's reservation and the engine's spawn, seen when a comment fell there.
    assert phases <= {"Idle", "Pending", "Reserved", "Starting"}, phases
    assert data[-1] == "data: [DONE]" and "chat.completion.chunk" in data[0], data
    assert headers["x-reconcile-deployment"] == "cold"
    g.finish()


def test_the_request_log_says_when_the_first_comment_went_out_and_when_the_answer_did(
    reconcile: Any, gateway: Any
) -> None:
    """A cold stream's ``ttfb_s`` was the engine's first byte, with nothing saying the
    client had been getting waiting comments long before: ``first_comment_s`` says it."""
    reconcile.write("cold", command=reconcile.demo_command(load_seconds="1.5"), **COLD)
    g = gateway(env=FAST)
    body = {"model": "cold", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    status, _, lines = raw_stream(g.port, body)
    assert status == 200 and any(line.startswith(": waiting for cold: ") for line in lines)
    log = path_in(reconcile.state)
    reconcile.wait_for(lambda: log.is_file() and log.read_text(), what="the request logged")
    cold = json.loads(log.read_text().splitlines()[0])
    assert cold["status"] == 200 and cold["first_comment_s"] is not None, cold
    assert 0 < cold["first_comment_s"] < cold["ttfb_s"] <= cold["duration_s"], cold
    assert g.post("cold", stream=True).status == 200  # warm now: no comment
    reconcile.wait_for(lambda: len(log.read_text().splitlines()) == 2, what="the 2nd line")
    warm = json.loads(log.read_text().splitlines()[1])
    assert warm["first_comment_s"] is None and warm["ttfb_s"] is not None, warm
    g.finish()


def test_the_openai_client_streams_through_a_cold_start(reconcile: Any, gateway: Any) -> None:
    reconcile.write("cold", command=reconcile.demo_command(load_seconds="1.5"), **COLD)
    g = gateway(env=FAST)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{g.port}/v1", api_key="-", max_retries=0)
    stream = client.chat.completions.create(
        model="cold", messages=[{"role": "user", "content": "one two three"}], stream=True
    )
    chunks = list(stream)
    assert chunks and all(c.object == "chat.completion.chunk" for c in chunks), chunks
    assert chunks[-1].choices[0].finish_reason == "stop"
    g.finish()


def test_a_begun_stream_that_cannot_be_served_ends_with_an_error_event(
    reconcile: Any, gateway: Any
) -> None:
    """An engine that never gets Ready: the comments run until the readiness deadline,
    then the 503 the gateway would have answered is the stream's last event, and the
    request log's status."""
    reconcile.write(
        "stuck",
        command=reconcile.demo_command(load_seconds="600"),
        readiness={"httpGet": {"path": "/health"}, "deadlineSeconds": 1.5, "periodSeconds": 0.2},
        **COLD,
    )
    g = gateway(env=FAST)
    body = {"model": "stuck", "messages": [], "stream": True}
    status, _, lines = raw_stream(g.port, body)
    assert status == 200 and any(line.startswith(": waiting for stuck: ") for line in lines)
    last = json.loads(next(line for line in reversed(lines) if line.startswith("data:"))[5:])
    assert last["error"]["code"] == "model_not_ready", last
    # Logged and counted as the 503 it ended with, not as the 200 its comments began.
    log = path_in(reconcile.state)
    reconcile.wait_for(lambda: log.is_file() and log.read_text(), what="the request logged")
    line = json.loads(log.read_text().splitlines()[0])
    assert (line["status"], line["deployment"]) == (503, "stuck"), line
    g.finish()


def test_a_json_answer_to_a_held_stream_is_its_one_event(reconcile: Any, gateway: Any) -> None:
    """``stream: true`` on a path that answers JSON (embeddings): held while the engine
    starts, the stream's comments began, and the JSON is its one ``data:`` event, then
    ``[DONE]``, the same JSON the request gets once the engine is Ready. It became an
    error event ("answered 200"): the outcome hung on the timing."""
    reconcile.write("cold", command=reconcile.demo_command(load_seconds="1.5"), **COLD)
    g = gateway(env=FAST)
    body = json.dumps({"model": "cold", "input": "one two", "stream": True}).encode()

    def post() -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=60)
        try:
            conn.request("POST", "/v1/embeddings", body)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    status, headers, held = post()
    lines = held.decode().splitlines()
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream"), headers
    assert any(line.startswith(": waiting for cold: ") for line in lines), lines
    data = [line for line in lines if line.startswith("data: ")]
    assert len(data) == 2 and data[1] == "data: [DONE]", lines
    status, headers, warm = post()  # Ready now: no stream begun, the engine's JSON
    assert status == 200 and headers["Content-Type"].startswith("application/json"), headers
    assert json.loads(data[0][6:]) == json.loads(warm), (data[0][:300], warm[:300])
    assert json.loads(warm)["object"] == "list"
    g.finish()


# An engine that starts in 1.5 s, then answers every POST 200 in plain text.
PLAIN = """
import http.server, sys, time
time.sleep(1.5)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200); self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "5"); self.end_headers(); self.wfile.write(b"hello")
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_a_plain_text_answer_to_a_held_stream_says_what_the_engine_answered(
    reconcile: Any, gateway: Any
) -> None:
    """A 200 in plain text cannot be an event: the stream's last event names the engine's
    status and Content-Type (it said "answered 200: hello", as if the engine had failed),
    and the next move (it gave none), which does get the answer: a retry, now Ready."""
    command = [sys.executable, "-c", PLAIN, "{port}"]
    reconcile.write("cold", engine="command", command=command, **COLD)
    g = gateway(env=FAST)
    body = {"model": "cold", "messages": [], "stream": True}
    status, _, lines = raw_stream(g.port, body)
    assert status == 200 and any(line.startswith(": waiting for cold: ") for line in lines)
    last = json.loads(next(line for line in reversed(lines) if line.startswith("data:"))[5:])
    said = last["error"]["message"]
    assert last["error"]["code"] == "upstream_error", last
    assert "answered 200 with text/plain, not JSON" in said, said
    assert "an event stream cannot carry" in said, said
    assert said.endswith(
        "; retry now that it is Ready (no stream begins: its answer comes as it is), or send "
        "the request without `stream: true`"
    ), said
    status, headers, again = raw_stream(g.port, body)
    assert status == 200 and again == ["hello"], (status, headers, again)
    g.finish()


def test_no_comment_for_a_plain_request(reconcile: Any, gateway: Any) -> None:
    reconcile.write("cold", command=reconcile.demo_command(load_seconds="1"), **COLD)
    g = gateway(env=FAST)
    answer = g.post("cold")
    assert answer.status == 200 and answer.body.startswith(b"{"), answer
    g.finish()


def test_the_period_setting() -> None:
    assert waiting_every_from_env({}) == WAITING_EVERY == 5.0
    assert waiting_every_from_env({WAITING_ENV: "0.25"}) == 0.25
    for bad in ("0", "-1", "soon", "1e9"):
        assert waiting_every_from_env({WAITING_ENV: bad}) == WAITING_EVERY
