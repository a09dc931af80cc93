"""``/metrics`` over HTTP: imported only with ``--metrics-port``.

Its own module because ``http.server`` brings ``http.client``, ``ssl`` and ``email``
(~6 MB resident), which a daemon without ``--metrics-port`` should not carry.

Who may read it: the metrics name every deployment, its phase and its traffic, which
the state dir keeps 0600, so a scrape wants the state dir's access token
(``store/config/accesstoken.py``), as ``Authorization: Bearer <token>`` (Prometheus'
``authorization: {credentials_file: ...}``) or ``?token=<token>`` (its ``params``);
else 401. Bound to loopback, it answers only a loopback ``Host`` (DNS rebinding: 403).

Each connection is a thread of the daemon's and an fd: one that says nothing for
``READ_TIMEOUT`` s is closed, and past ``CONNECTIONS_MAX`` at once a new one is closed
unanswered (idle connections held a thread and an fd each for good: a client could take
the fds the daemon's passes need).
"""

from __future__ import annotations

import errno
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from controller.core.manifest.listen import host_refusal, is_loopback
from controller.daemon.metrics import CONTENT_TYPE, current
from controller.errors import ConfigError
from controller.host import ports
from controller.logsetup import get_logger
from controller.store.config.accesstoken import QUERY, Token

log = get_logger("reconcile")


TEXT = "text/plain; charset=utf-8"
ALLOWED = ("GET", "HEAD")
REFUSED = (
    "/metrics wants the state dir's access token (<state-dir>/access-token, readable by "
    "its owner only): send `Authorization: Bearer <token>` or ?token=<token>\n"
)


READ_TIMEOUT = 10.0  # seconds a connection may send nothing (a scrape sends at once)
CONNECTIONS_MAX = 32  # connections served at once (Prometheus scrapes on one, or a few)


class _Server(ThreadingHTTPServer):
    token: Token
    loopback: bool
    slots: threading.BoundedSemaphore

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.shutdown_request(request)  # all taken: closed, no thread and no fd kept
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()  # its thread never started
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone or silent mid-answer (``READ_TIMEOUT``) is a line, not the
        traceback socketserver prints; anything else is its traceback as before."""
        if isinstance(sys.exc_info()[1], OSError):
            log.info("metrics client dropped", peer=str(client_address[0]))
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = READ_TIMEOUT  # each read's (socketserver sets it on the connection)
    # http.server's own errors (a bad request line, a method no one knows: 501) as a line
    # of text like this server's other answers, not its HTML page.
    error_message_format = "%(code)d %(message)s: %(explain)s\n"
    error_content_type = TEXT

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:  # load balancers and `curl -I` check with HEAD
        self._answer(body=False)

    def _not_allowed(self) -> None:
        """HTTP's other methods: 405 naming the two this server serves (http.server
        answered them with its HTML 501)."""
        said = f"{self.command} is not allowed: /metrics serves {', '.join(ALLOWED)}\n"
        self._send(405, TEXT, said.encode(), True, {"Allow": ", ".join(ALLOWED)})

    do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_TRACE = do_CONNECT = _not_allowed

    def _answer(self, body: bool) -> None:
        refused = host_refusal(self.headers.get("Host")) if self.server.loopback else None
        if refused is not None:
            self._send(403, TEXT, f"{refused}\n".encode(), body)
            return
        where = urlsplit(self.path)
        if where.path != "/metrics":
            self._send(404, TEXT, b"see /metrics\n", body)
            return
        if not self.server.token.accepts(self._presented(where.query)):
            self._send(401, TEXT, REFUSED.encode(), body, {"WWW-Authenticate": "Bearer"})
            return
        self._send(200, CONTENT_TYPE, current().encode(), body)

    def _presented(self, query: str) -> str | None:
        given = parse_qs(query).get(QUERY)
        if given:
            return given[0]
        scheme, _, value = (self.headers.get("Authorization") or "").partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None

    def _send(
        self, code: int, kind: str, data: bytes, body: bool, extra: dict[str, str] | None = None
    ) -> None:
        self.send_response(code)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # scrapes every 15 s would drown the reconciler's own log


def _bind_error(host: str, port: int, exc: OSError) -> str:
    where = f"--metrics-port {host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return ports.in_use(where, port)
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need root): pick a port above 1024"
    return f"{where}: cannot listen there: {exc.strerror or exc}"


def serve(host: str, port: int, state_dir: Path) -> ThreadingHTTPServer:
    """Serve ``/metrics`` from a daemon thread, to those who hold ``state_dir``'s access
    token; the caller may ``shutdown()`` it."""
    token = Token(state_dir)
    token.current()  # made now when missing (an unsafe one is refused before the bind)
    try:
        server = _Server((host, port), _Handler)
    except OSError as exc:  # not the disk: say which address, and what to do
        raise ConfigError(_bind_error(host, port, exc)) from exc
    server.token = token
    server.loopback = is_loopback(host)
    server.slots = threading.BoundedSemaphore(CONNECTIONS_MAX)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    log.info("serving metrics", address=f"http://{host}:{port}/metrics")
    plain = plain_warning(host, port)
    if plain:
        log.warning("metrics without TLS", detail=plain)
    return server


def plain_warning(host: str, port: int) -> str | None:
    """The warning for ``/metrics`` reachable from other machines: it speaks plain HTTP
    alone, and the access token each scrape carries also opens the web page's buttons."""
    if is_loopback(host):
        return None
    return (
        f"--metrics-port {host}:{port} speaks plain HTTP to other machines: the state "
        "dir's access token each scrape carries crosses the network in clear text (it "
        "opens the web page's buttons too); bind it to 127.0.0.1 and scrape through a "
        "TLS proxy or tunnel, or write --metrics-file for node_exporter's textfile collector"
    )
