"""The readiness probe's HTTP GET against real servers on loopback (no http.client)."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from controller.core.state import ProbeConfig
from controller.host.probes import ProbeTarget, http_get, probe


def _serve(answer: Callable[[socket.socket], None]) -> Iterator[int]:
    """A one-thread server handing each connection to ``answer``; yields its port."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                answer(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def _fixed(raw: bytes, *, hold_open: bool = False) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.sendall(raw)
        if hold_open:  # a keep-alive server that ignores `Connection: close`
            conn.settimeout(3)
            with contextlib.suppress(OSError):
                conn.recv(1)

    return answer


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[int]:
    yield from _serve(request.param)


OK_JSON = b'HTTP/1.1 200 OK\r\nContent-Length: 23\r\n\r\n{"data": [{"id": "m"}]}'


@pytest.mark.parametrize(
    ("server", "status", "body"),
    [
        (_fixed(OK_JSON), 200, '{"data": [{"id": "m"}]}'),
        (_fixed(OK_JSON, hold_open=True), 200, '{"data": [{"id": "m"}]}'),
        (_fixed(b"HTTP/1.0 503 Service Unavailable\r\n\r\nloading"), 503, "loading"),
        (_fixed(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", hold_open=True), 204, ""),
    ],
    indirect=["server"],
    ids=["content-length", "keep-alive", "close-delimited", "empty-keep-alive"],
)
def test_http_get_reads_status_and_body(server: int, status: int, body: str) -> None:
    assert http_get("127.0.0.1", server, "/health", 2.0) == (status, body)


@pytest.mark.parametrize("server", [_fixed(b"SSH-2.0-OpenSSH_9.6\r\n")], indirect=True)
def test_a_server_that_is_not_http_fails_the_probe(server: int) -> None:
    config = ProbeConfig(http=(("/health", None),))
    result = probe(ProbeTarget("127.0.0.1", server, config), timeout=2.0)
    assert not result.ready and "not an HTTP answer" in result.detail


@pytest.mark.parametrize("server", [_fixed(OK_JSON)], indirect=True)
def test_the_probe_checks_what_the_body_lists(server: int) -> None:
    ready = ProbeConfig(http=(("/v1/models", '"m"'),))
    waiting = ProbeConfig(http=(("/v1/models", "other-model"),))
    assert probe(ProbeTarget("0.0.0.0", server, ready)).ready
    result = probe(ProbeTarget("127.0.0.1", server, waiting))
    assert not result.ready and "does not list 'other-model' yet" in result.detail


def test_a_closed_port_fails_the_probe() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = ProbeConfig(http=(("/health", None),))
    result = probe(ProbeTarget("127.0.0.1", port, config))
    assert not result.ready and "ConnectionRefusedError" in result.detail


REDIRECT = (
    b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:1/\r\nContent-Length: 0\r\n\r\n"
)


@pytest.mark.parametrize("server", [_fixed(REDIRECT)], indirect=True)
def test_a_redirect_passes_the_probe_unfollowed(server: int) -> None:
    """Kubernetes counts 200-399 as success and never follows the Location (here a
    closed port: followed, the probe would fail)."""
    result = probe(ProbeTarget("127.0.0.1", server, ProbeConfig(http=(("/health", None),))))
    assert result.ready and "307" in result.detail


@pytest.mark.parametrize(
    "server", [_fixed(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")], indirect=True
)
def test_a_4xx_fails_the_probe(server: int) -> None:
    result = probe(ProbeTarget("127.0.0.1", server, ProbeConfig(http=(("/health", None),))))
    assert not result.ready and "-> 400" in result.detail


class _Keyed(http.server.BaseHTTPRequestHandler):
    """/v1/models behind the bearer key `right`, as vLLM's and llama.cpp's servers keep it."""

    def do_GET(self) -> None:
        keyed = self.headers.get("Authorization") == "Bearer right"
        self.send_response(200 if keyed else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def keyed() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Keyed)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize(
    ("bearer", "ready", "said"),
    [
        ("right", True, "GET /v1/models -> 200"),
        ("wrong", False, "GET /v1/models -> 401: the engine refused the API key the probe"),
        ("", False, "GET /v1/models -> 401: the engine refused the probe, which presented no"),
    ],
)
def test_an_http_probe_presents_the_engines_key(
    keyed: int, bearer: str, ready: bool, said: str
) -> None:
    """An httpGet probe on a path behind the engine's key got 401 every time: it sent no
    key. It presents the one it holds; a refusal says so and what to do, never the key."""
    target = ProbeTarget("127.0.0.1", keyed, ProbeConfig(http=(("/v1/models", None),)), bearer)
    result = probe(target, timeout=10)
    assert result.ready is ready and result.detail.startswith(said), result
    assert "wrong" not in f"{result.detail} {target!r}" and "right" not in repr(target)
