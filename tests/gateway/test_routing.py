"""Routing by name, alias and model id; OpenAI error bodies; streaming; disconnects."""

from __future__ import annotations

import http.client
import itertools
import json
import socket
import time
from typing import Any


def _error(answer: Any, status: int, code: str) -> dict[str, Any]:
    assert answer.status == status, answer
    body: dict[str, Any] = answer.json()["error"]
    assert body["code"] == code and body["message"], body
    return body


def test_routes_by_name_model_and_alias_and_answers_errors(reconcile: Any, gateway: Any) -> None:
    reconcile.write("alpha", model="org/alpha-7b", aliases=["a7"])
    reconcile.write("beta")
    g = gateway("--max-body", "4096")
    g.wait_phase("alpha", "Ready")
    g.wait_phase("beta", "Ready")
    models = g.request("GET", "/v1/models").json()
    assert {m["id"] for m in models["data"]} == {"alpha", "org/alpha-7b", "a7", "beta"}
    for name in ("alpha", "org/alpha-7b", "a7"):
        answer = g.post(name)
        assert answer.status == 200, answer
        assert answer.json()["model"] == "alpha"  # the demo engine names itself
    assert g.post("beta").json()["model"] == "beta"
    # query and path go through unchanged
    answer = g.request("POST", "/v1/completions?x=1", {"model": "beta", "prompt": "p"})
    assert answer.json()["object"] == "text_completion"
    _error(g.post("nope"), 404, "model_not_found")
    _error(g.request("POST", "/v1/chat/completions", b"not json"), 400, "invalid_request")
    _error(g.request("POST", "/v1/chat/completions", {"messages": []}), 400, "invalid_request")
    _error(g.post("beta", prompt="x" * 5000), 413, "request_too_large")
    assert g.request("GET", "/healthz").json() == {"status": "ok"}
    g.finish()


def test_a_body_without_a_model_is_told_what_is_wrong_and_where(
    reconcile: Any, gateway: Any
) -> None:
    """Every body the gateway could not take a model from got one sentence, "must be a JSON
    object with a string field `model`", so a client whose JSON had a stray comma was told
    to send what it believed it sent: the 400 says what is wrong, and where; a 413 says the
    limit and the next move."""
    reconcile.write("beta")
    g = gateway("--max-body", "4096")
    g.wait_phase("beta", "Ready")
    said = {
        b"": "the request body is empty",
        b'{"model": "beta",}': "not JSON (line 1 column 18: Expecting property name",
        b'{"model":\n "beta" "x"}': "not JSON (line 2 column 9: Expecting ',' delimiter)",
        b"[1, 2]": "the request body is a JSON array, not an object",
        b'{"messages": []}': "the request body has no field `model`",
        b'{"model": 7}': "the request body's `model` is a JSON number, not a model's name",
        b'{"model": ""}': "the request body's `model` is an empty string",
        b'{"model": null}': "the request body's `model` is a JSON null",
    }
    for body, wanted in said.items():
        message = _error(g.request("POST", "/v1/chat/completions", body), 400, "invalid_request")
        assert wanted in message["message"], (body, message)
        assert "names one of `GET /v1/models`" in message["message"], message  # the next move
    # past --max-body: a bare byte count told no one what to do
    message = _error(g.post("beta", prompt="x" * 5000), 413, "request_too_large")["message"]
    assert "limit of 4096 bytes (4Ki, its --max-body): send a smaller one" in message, message
    assert "ask the gateway's operator to raise --max-body" in message, message
    assert g.post("beta").status == 200  # and the connection's next request is served
    g.finish()


def test_not_ready_waits_then_503(reconcile: Any, gateway: Any) -> None:
    # An engine that never answers its probe: the request waits out the deadline, then 503.
    reconcile.write(
        "slow",
        command=reconcile.demo_command(load_seconds="600"),
        readiness={"httpGet": {"path": "/health"}, "deadlineSeconds": 2, "periodSeconds": 0.2},
    )
    g = gateway()
    g.wait_phase("slow", "Starting")
    started = time.monotonic()
    answer = g.post("slow")
    assert time.monotonic() - started >= 1.5
    _error(answer, 503, "model_not_ready")
    assert int(answer.headers["Retry-After"]) >= 1
    g.finish()


def test_stream_chunks_arrive_as_sent(reconcile: Any, gateway: Any) -> None:
    reconcile.write("streamer", command=reconcile.demo_command(chunks="4", chunk_delay="0.4"))
    g = gateway()
    g.wait_phase("streamer", "Ready")
    conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=30)
    body = json.dumps({"model": "streamer", "stream": True, "messages": []})
    conn.request("POST", "/v1/chat/completions", body=body)
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.getheader("Content-Type", "").startswith("text/event-stream")
    arrivals = []
    while True:
        line = resp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            arrivals.append((time.monotonic(), line))
    conn.close()
    assert arrivals[-1][1].strip() == b"data: [DONE]"
    chunks = [a for a, line in arrivals if b"chunk" in line]
    assert len(chunks) == 4
    gaps = [b - a for a, b in itertools.pairwise(chunks)]
    assert all(gap >= 0.25 for gap in gaps), gaps  # not buffered into one burst
    g.finish()


def test_client_disconnect_cancels_upstream(reconcile: Any, gateway: Any) -> None:
    reconcile.write("talker", command=reconcile.demo_command(chunks="50", chunk_delay="0.2"))
    g = gateway()
    g.wait_phase("talker", "Ready")
    body = json.dumps({"model": "talker", "stream": True}).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", g.port), timeout=10) as sock:
        sock.sendall(head + body)
        assert b"chunk 0" in sock.recv(65536) or b"chunk" in sock.recv(65536)
    log = reconcile.state / "instances" / "logs" / "talker.log"
    # The engine's write fails once the gateway closed upstream: far before 50 x 0.2 s.
    reconcile.wait_for(
        lambda: "BrokenPipe" in log.read_text() or "ConnectionReset" in log.read_text(),
        timeout=5,
        what="the engine to see its client go",
    )
    g.finish()


def test_an_ambiguous_model_name_is_a_validation_error(reconcile: Any) -> None:
    """An alias that is another deployment's own name: the gateway could not tell which."""
    reconcile.write("one", model="shared/model")
    reconcile.write("two", aliases=["one"])
    result = reconcile("validate", check=1)
    assert "one.yaml" in result.err and "two.yaml" in result.err
    assert "'one'" in result.err and "metadata.name" in result.err


def test_a_model_shared_by_two_deployments_is_valid(reconcile: Any) -> None:
    reconcile.write("one", model="shared/model")
    reconcile.write("two", aliases=["shared/model"])
    assert "2 deployment(s) in 2 file(s): valid" in reconcile("validate", check=0).out


def test_once_does_not_import_aiohttp(reconcile: Any) -> None:
    import subprocess
    import sys

    code = (
        "import sys; from controller.cli.main import main; "
        "rc = main(sys.argv[1:]); print('AIOHTTP' if 'aiohttp' in sys.modules else 'CLEAN')"
    )
    argv = reconcile.argv("--once", "--allow-empty")[3:]
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=reconcile.tmp
    )
    assert out.stdout.strip().endswith("CLEAN"), out
