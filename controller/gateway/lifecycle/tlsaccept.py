"""The TLS gateway's accepting: a plain-HTTP request on its port gets a 400 that says so.

asyncio's (and uvloop's) TLS server ends a connection whose first bytes are no TLS
handshake without a byte back: a client that forgot ``https://`` read "empty reply from
server" and nothing more. nginx answers such a request 400 "The plain HTTP request was
sent to HTTPS port", Go's server 400 "Client sent an HTTP request to an HTTPS server".
So with TLS the gateway accepts by itself: each connection's first byte is peeked at
(``MSG_PEEK``: it stays for the handshake), and a TLS record (0x16, a handshake) is
handed to ``loop.connect_accepted_socket`` with the context, as ``create_server`` would;
anything else is answered 400 in clear text and closed. A client that sends nothing is
held no longer than a handshake would be (``FIRST_BYTE_TIMEOUT``, asyncio's default), and
not at all once the connection cap needs its room (``Acceptor``).

A handshake that fails is a quiet, rate-limited info line naming the peer and why in
words (nginx logs "SSL_do_handshake() failed" at info): a client that does not trust the
certificate, finds it expired, or (``--tls-client-ca``) sent no certificate of that CA
was a silent close, and the operator had only the client's side to go by. A client
that gave up or timed out says nothing.

``Acceptor`` stands where ``create_server``'s ``asyncio.Server`` stands for plain HTTP:
its ``sockets`` name the listening socket (what a hand-over passes on), ``close`` stops
accepting and closes it (``listener.close_listener``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
from collections.abc import Callable

from controller.gateway.http.answers import body
from controller.gateway.http.quiet import Throttle
from controller.gateway.http.server import FRESH_WAIT, Connections, quiet
from controller.gateway.lifecycle.tlsalerts import alerts_to
from controller.logsetup import get_logger

log = get_logger("reconcile")

FIRST_BYTE_TIMEOUT = 60.0  # seconds a new connection may send nothing (a handshake's limit)
HANDSHAKE_TIMEOUT = 60.0  # asyncio's default for a TLS handshake
LINGER = 1.0  # seconds the plain request's rest is read after the 400 (closing on unread
# bytes resets the connection, and the client may lose the answer)
ACCEPT_RETRY = 1.0  # seconds without accepting after the fds ran out (asyncio's delay)
ACCEPT_BATCH = 100  # connections taken at most per wake-up (asyncio's server: backlog's)
TLS_HANDSHAKE = 0x16  # the first byte of a TLS record that carries a handshake

_SAID = (
    "this gateway speaks HTTPS only: the plain HTTP request was sent to its HTTPS port "
    "(use https://)"
)
_BODY = json.dumps(body(400, _SAID, "plain_http_to_https_port")).encode()
# OpenSSL's reasons for the handshakes a client or its certificate failed, in words
_REFUSALS = {
    "TLSV1_ALERT_UNKNOWN_CA": "the client does not trust the gateway's certificate (an "
    "unknown CA): give the client the CA that signed --tls-cert, or serve one it trusts",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the client refused the gateway's certificate (its name, "
    "or its use?)",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "the client refused the gateway's certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the client refused the gateway's certificate as out "
    "of date: put one in date at --tls-cert, then `kill -HUP` the daemon",
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "the client sent no certificate, and "
    "--tls-client-ca requires one",
    "CERTIFICATE_VERIFY_FAILED": "the client's certificate is not one --tls-client-ca "
    "signed (or is out of date)",
    "UNSUPPORTED_PROTOCOL": "the client offers no TLS 1.2 or later",
    "NO_SHARED_CIPHER": "the client offers none of the gateway's cipher suites (TLS 1.2's "
    "ECDHE with AES-GCM or ChaCha20; no CBC suite, as Mozilla's intermediate set): an old "
    "client or TLS library",
}


# OpenSSL's verify results for a client certificate a CRL in --tls-client-ca's file judged
# (X509_V_ERR_*), which its reason alone calls CERTIFICATE_VERIFY_FAILED
_CRL_VERDICTS = {
    23: "the client's certificate is revoked (a CRL in --tls-client-ca's file lists it)",
    12: "the CRL of the client's CA in --tls-client-ca's file has expired (past its "
    "nextUpdate): every certificate of that CA is refused until a CRL in date is put there "
    "(openssl ca -gencrl), then `kill -HUP` the daemon",
    11: "the CRL of the client's CA in --tls-client-ca's file is not valid yet (its "
    "lastUpdate is in the future: this host's clock?)",
    3: "--tls-client-ca's file holds CRLs, but none of the client's CA: with a CRL there, "
    "each CA needs its own (openssl ca -gencrl) beside it",
}


def refusal(exc: ssl.SSLError) -> str:
    """Why a handshake failed, for the operator."""
    reason = exc.reason or exc.library or "unknown"
    code = getattr(exc, "verify_code", None)  # ssl.SSLCertVerificationError's alone
    if code in _CRL_VERDICTS:
        return _CRL_VERDICTS[code]
    return _REFUSALS.get(reason, f"the TLS handshake failed ({reason})")


PLAIN_ANSWER = (
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BODY), _BODY)
)


class Acceptor:
    """Accepts on ``sock`` for a TLS server of ``protocol`` with ``context()``, asked at
    each handshake: a SIGHUP puts a fresh context in place (``tls.Tls.reload``).

    The connections not yet handed on (silent, or mid-handshake) count against the
    server's cap with its own (``server.Connections``): past it the oldest of them is let
    go, so a flood of connections that never finish a handshake holds no more fds than a
    flood of half-open requests does on plain HTTP (tests/gateway/test_fds.py). They count
    in its drain too (``Connections.arriving``): a gateway that hands over mid-handshake
    finishes the handshake and the request before it exits.

    Accepting is a reader callback that takes every connection waiting, as asyncio's own
    server does, not an awaited ``loop.sock_accept``: a connection that call had accepted
    but its task had not yet taken when ``close`` cancelled it was dropped unseen, and
    its client read a reset (a hand-over under load, tests/gateway/test_tls.py)."""

    def __init__(
        self,
        sock: socket.socket,
        protocol: Callable[[], asyncio.Protocol],
        context: Callable[[], ssl.SSLContext],
        connections: Connections,
        throttle: Throttle | None = None,
    ) -> None:
        self._sock = sock
        self._throttle = throttle or Throttle()  # the server's: one budget for its lines
        self._protocol = protocol
        self._context = context
        self._connections = connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._accepting = False
        self._retry: asyncio.TimerHandle | None = None
        # connections not yet handed on, oldest first (a dict keeps the order they came in)
        self._greeting: dict[asyncio.Task[None], socket.socket] = {}
        self._silent: set[asyncio.Task[None]] = set()  # no byte heard from them yet
        sock.setblocking(False)

    @property
    def sockets(self) -> list[socket.socket]:
        return [self._sock] if self._accepting else []

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._accepting = True
        self._loop.add_reader(self._sock.fileno(), self._accept)

    async def start_serving(self) -> None:
        """``asyncio.Server``'s name for ``start``, on the loop."""
        if not self._accepting:
            self.start()

    def close(self) -> None:
        """No new connection from now on; those accepted are greeted on, those still
        silent ``FRESH_WAIT`` s more at most (as plain HTTP's drain waits for them)."""
        if self._accepting and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._loop.call_later(FRESH_WAIT, self._let_go_silent)
        if self._retry is not None:
            self._retry.cancel()
        self._accepting = False
        self._sock.close()

    def _accept(self) -> None:
        """Every connection waiting, each greeted in a task of its own."""
        assert self._loop is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                self._pause(exc)
                return
            self._greet_new(conn)

    def _pause(self, exc: OSError) -> None:
        """Out of fds (or another refusal but a client's that gave up): no accepting for
        ``ACCEPT_RETRY`` s, then on, as asyncio's server does."""
        assert self._loop is not None
        log.warning("gateway cannot accept", reason=exc.strerror, retry_in=ACCEPT_RETRY)
        self._loop.remove_reader(self._sock.fileno())
        self._retry = self._loop.call_later(ACCEPT_RETRY, self._resume)

    def _resume(self) -> None:
        self._retry = None
        if self._accepting and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def _greet_new(self, conn: socket.socket) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._greet(conn))
        self._greeting[task] = conn
        self._connections.arriving += 1
        task.add_done_callback(self._greeted)
        # The newest is never let go here: with the cap full of connections handed on,
        # it is admitted once its handshake is done, in place of an idle one
        # (``Connections.admit``), as on plain HTTP.
        while len(self._greeting) > 1 and self._over_cap():
            self._let_go(next(iter(self._greeting)))

    def _over_cap(self) -> bool:
        return len(self._greeting) + len(self._connections) > self._connections.cap

    def _greeted(self, task: asyncio.Task[None]) -> None:
        self._silent.discard(task)
        if self._greeting.pop(task, None) is not None:
            self._connections.arriving -= 1

    def _let_go(self, task: asyncio.Task[None]) -> None:
        """The oldest connection not yet handed on is closed to make room."""
        conn = self._greeting.pop(task)
        self._connections.arriving -= 1
        task.cancel()
        task.add_done_callback(lambda done: _close_if_cancelled(done, conn))

    def _let_go_silent(self) -> None:
        """The drain's wait for a silent connection's first byte is over."""
        for task in list(self._silent):
            if task in self._greeting:
                self._let_go(task)

    async def _greet(self, conn: socket.socket) -> None:
        """Hand ``conn`` to the TLS server, or answer its plain HTTP 400."""
        conn.setblocking(False)
        task = asyncio.current_task()
        assert task is not None
        self._silent.add(task)
        try:
            first = await asyncio.wait_for(_first_byte(conn), FIRST_BYTE_TIMEOUT)
        except (OSError, TimeoutError):
            conn.close()
            return
        except asyncio.CancelledError:
            conn.close()
            raise
        finally:
            self._silent.discard(task)
        if first and first[0] == TLS_HANDSHAKE:
            await self._handshake(conn)
            return
        try:
            if first:
                await _answer_plain(conn)
        finally:
            conn.close()

    async def _handshake(self, conn: socket.socket) -> None:
        """Hand ``conn`` to the TLS server; a handshake refused is said (``refusal``). The
        loop closed the socket of a failed one; a client that gave up is not news."""
        loop = asyncio.get_running_loop()
        peer = _peer(conn)
        alerts_to(conn.fileno())  # this task's context is the transport's: tlsalerts.py
        try:
            await loop.connect_accepted_socket(
                self._protocol, conn, ssl=self._context(), ssl_handshake_timeout=HANDSHAKE_TIMEOUT
            )
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
            pass  # the client closed mid-handshake: it gave up (a probe), nothing refused
        except ssl.SSLError as exc:
            quiet(f"TLS handshake refused: {refusal(exc)}", self._throttle, peer=peer)
        except (OSError, TimeoutError):
            pass


def _peer(conn: socket.socket) -> str:
    with contextlib.suppress(OSError):
        return str(conn.getpeername()[0])
    return "-"


def _close_if_cancelled(task: asyncio.Task[None], conn: socket.socket) -> None:
    """A task cancelled before it began runs no code of its own: its socket is closed
    here (one cancelled in its handshake the loop closed already: a no-op). One that
    handed its socket on just before the cancel came is left alone: the TLS server holds
    it now."""
    if task.cancelled():
        conn.close()


async def _first_byte(conn: socket.socket) -> bytes:
    """The connection's first byte, left in its buffer (b"": the client closed)."""
    loop = asyncio.get_running_loop()
    fd = conn.fileno()
    readable: asyncio.Future[None] = loop.create_future()

    def heard() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, heard)
    try:
        await readable
    finally:
        loop.remove_reader(fd)
    return conn.recv(1, socket.MSG_PEEK)


async def _answer_plain(conn: socket.socket) -> None:
    """The 400 in clear text, then the request's rest read (briefly) before the close."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(OSError, TimeoutError):
        await loop.sock_sendall(conn, PLAIN_ANSWER)
        conn.shutdown(socket.SHUT_WR)
        async with asyncio.timeout(LINGER):
            while await loop.sock_recv(conn, 65536):
                pass
