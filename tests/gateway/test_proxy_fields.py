"""``surface/proxy.py``'s ``_kept``: which of a message's header fields go on, in order.
A request's to the engine (hop-by-hop fields, those its ``Connection`` names, the
gateway's key headers when keys are on, the body's coding and an answered ``Expect``
out); an engine's answer to the client (hop-by-hop and ``Connection``-named out, and an
``x-reconcile-deployment`` of its own: the gateway says who served it)."""

from __future__ import annotations

import http.client
import json
import sys
from typing import Any

import pytest

from controller.gateway.surface.proxy import HOP_BY_HOP, SENT_DROPS, SENT_DROPS_KEYED, _kept

REQUEST = [
    ("Host", "gw:8080"),
    ("Connection", "X-Private, keep-alive"),
    ("X-Private", "for the gateway alone"),
    ("Keep-Alive", "timeout=5"),
    ("Authorization", "Bearer sk-1"),
    ("Content-Type", "application/json"),
    ("Content-Length", "17"),
    ("Content-Encoding", "gzip"),
    ("Expect", "100-continue"),
    ("Proxy-Authorization", "Basic x"),
    ("X-A", "1"),
    ("x-a", "2"),
    ("TE", "trailers"),
    ("User-Agent", "OpenAI/Python"),
]


@pytest.mark.parametrize(
    ("drop", "kept"),
    [
        (
            SENT_DROPS_KEYED,
            [("Content-Type", "application/json"), ("X-A", "1"), ("x-a", "2"),
             ("User-Agent", "OpenAI/Python")],
        ),
        (
            SENT_DROPS,
            [("Authorization", "Bearer sk-1"), ("Content-Type", "application/json"),
             ("X-A", "1"), ("x-a", "2"), ("User-Agent", "OpenAI/Python")],
        ),
    ],
)  # fmt: skip
def test_a_requests_fields_go_on_in_order_but_what_is_the_gateways(
    drop: frozenset[str], kept: list[tuple[str, str]]
) -> None:
    assert _kept(REQUEST, drop) == kept


def test_an_answers_fields_go_on_in_order_but_what_is_hop_by_hop() -> None:
    answer = [
        ("Date", "Sat, 05 Dec 2026 18:00:00 GMT"),
        ("connection", "close, X-Engine-Only"),
        ("x-engine-only", "1"),
        ("Transfer-Encoding", "chunked"),
        ("Set-Cookie", "a=1"),
        ("Content-Type", "text/event-stream"),
        ("Set-Cookie", "b=2"),
    ]
    assert _kept(answer, HOP_BY_HOP) == [
        ("Date", "Sat, 05 Dec 2026 18:00:00 GMT"),
        ("Set-Cookie", "a=1"),
        ("Content-Type", "text/event-stream"),
        ("Set-Cookie", "b=2"),
    ]
    assert _kept([], HOP_BY_HOP) == []


# An engine that is a gateway itself (a node's gateway in front of another's): it says
# who served it too. Sized answers, or close-delimited ones (a stream) for /stream.
GATEWAY_LIKE = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = b'{"object": "chat.completion", "choices": []}'
        self.send_response(200)
        self.send_header("x-reconcile-deployment", "inner")
        self.send_header("Content-Type", "application/json")
        if not self.path.endswith("/stream"):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_an_engines_own_served_by_never_reaches_the_client(reconcile: Any, gateway: Any) -> None:
    """The client got two ``x-reconcile-deployment`` fields, the engine's ``inner`` first
    (a client reading one field took it): now only the gateway's, naming its deployment."""
    reconcile.write("outer", command=[sys.executable, "-c", GATEWAY_LIKE, "{port}"])
    g = gateway()
    g.wait_phase("outer", "Ready")
    body = json.dumps({"model": "outer", "messages": []}).encode()
    for path in ("/v1/chat/completions", "/v1/outer/stream"):  # sized; streamed
        conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=30)
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            answer = conn.getresponse()
            named = [v for k, v in answer.getheaders() if k.lower() == "x-reconcile-deployment"]
            assert answer.status == 200 and answer.read().startswith(b"{"), path
        finally:
            conn.close()
        assert named == ["outer"], (path, answer.getheaders())
    g.finish()
