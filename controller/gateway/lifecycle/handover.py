"""Hand-over of the listening socket from a running gateway to its successor.

Why the socket itself and not only ``SO_REUSEPORT``: with two reuseport listeners the
kernel hashes each new connection to one of them, and when the old one closes its
listener every connection still in *its* accept queue is reset (unless
``net.ipv4.tcp_migrate_req=1``, off by default). Passing the one listening socket
(``SCM_RIGHTS``) leaves a single accept queue that both processes accept from for a
moment; the old one then closes its descriptor (the socket lives on in the new one),
finishes the requests it holds and exits. Nothing queued is ever dropped.

The control channel is a unix stream socket per gateway (``registry.control_of``), one
line per command; each end checks that the other runs as our uid or root:

- ``handover`` -> ``ok`` with the listening socket's fd attached; then the successor,
  once it serves, sends ``stop`` -> ``bye``, and the old gateway stops accepting and
  drains. A successor that hangs up before ``stop`` (it died) changes nothing.
- ``stop`` -> ``bye``: stop accepting and drain (what ``SIGTERM`` does);
- ``metrics`` -> the Prometheus text, then EOF (the daemon's ``/metrics`` asks at each
  scrape, so it is never staler than the request that just ended).

Sockets are bound with ``SO_REUSEPORT`` too (``listener.py``), so a gateway that cannot
hand over (an older one, one that does not answer) can still be replaced: bind beside
it, then ``SIGTERM`` it (the queue caveat above applies to that path only).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from controller.gateway.lifecycle import registry
from controller.gateway.routing.table import HANDED_OVER as HANDED_OVER  # its stop's reason
from controller.logsetup import get_logger

log = get_logger("reconcile")

TALK_TIMEOUT = 5.0  # seconds for one line of the control protocol
STOP_WAIT = 30.0  # seconds a successor may take between "ok" and "stop"
LINE_MAX = 64


def _line(conn: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) < LINE_MAX:
        chunk = conn.recv(LINE_MAX)
        if not chunk:
            break
        data += chunk
    return data.strip()


class Control:
    """The old gateway's side: a thread answering on its control socket."""

    def __init__(
        self,
        address: str,
        listener_fd: Callable[[], int | None],
        stop: Callable[[str], None],
        metrics: Callable[[], str],
    ) -> None:
        self.address = address
        self._listener_fd = listener_fd
        self._stop = stop
        self._metrics = metrics
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        registry.unlink_address(address)  # a crashed namesake's leftover
        self._sock.bind(address)
        self._sock.listen(4)
        self._thread = threading.Thread(target=self._serve, name="gateway-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        registry.unlink_address(self.address)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed: the gateway is ending
            # A thread each: a hand-over waits for its "stop", a scrape must not wait on it.
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                self._talk(conn)
            except OSError as exc:
                log.info("gateway control connection failed", error=str(exc))

    def _talk(self, conn: socket.socket) -> None:
        conn.settimeout(TALK_TIMEOUT)
        if not registry.trusted_peer(conn):
            log.warning("gateway control: a caller of another user was refused")
            return
        command = _line(conn)
        if command == b"metrics":
            conn.sendall(self._metrics().encode())
        elif command == b"stop":
            conn.sendall(b"bye\n")
            self._stop("asked to stop")
        elif command == b"handover":
            fd = self._listener_fd()
            if fd is None:
                conn.sendall(b"no\n")
                return
            socket.send_fds(conn, [b"ok\n"], [fd])
            conn.settimeout(STOP_WAIT)
            if _line(conn) == b"stop":  # the successor serves now
                conn.sendall(b"bye\n")
                self._stop(HANDED_OVER)
            else:
                log.info("gateway hand-over abandoned by the successor; serving on")
        else:
            conn.sendall(b"unknown\n")


@dataclass
class Taken:
    """A listening socket received from the old gateway, and the line to tell it to go."""

    sock: socket.socket
    conn: socket.socket

    def release(self) -> None:
        """We serve now: the old gateway stops accepting and drains."""
        try:
            self.conn.sendall(b"stop\n")
            _line(self.conn)
        except OSError as exc:
            log.info("old gateway did not confirm the hand-over", error=str(exc))
        finally:
            self.conn.close()

    def abandon(self) -> None:
        self.sock.close()
        self.conn.close()


def ask_metrics(address: str) -> str | None:
    """The gateway's metrics text, asked now; None when it does not answer."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(TALK_TIMEOUT)
    chunks: list[bytes] = []
    try:
        _connect(conn, address)
        conn.sendall(b"metrics\n")
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        conn.close()
    text = b"".join(chunks).decode(errors="replace")
    return text if text.endswith("\n") else None


class Scraped(NamedTuple):
    """The gateway's metrics for a scrape, and how fresh they are: a stopped or hung
    gateway's file still holds its last counters, which must not pass for live ones."""

    text: str  # its Prometheus text ("": none)
    answered: bool  # it answered now; else ``text`` is its file's
    at: float  # when ``text`` was rendered (Unix time): now, or the file's mtime; 0: none


def scrape(state_dir: Path, serving: registry.GatewayInfo | None) -> Scraped:
    """``serving``'s metrics asked now; its file's when it does not answer within
    ``TALK_TIMEOUT`` (starting, handing over, stopped, hung) or there is none."""
    if serving is not None:
        text = ask_metrics(registry.control_of(state_dir, serving))
        if text is not None:
            return Scraped(text, True, time.time())
    text, at = registry.metrics_file(state_dir)
    return Scraped(text, False, at)


def _connect(conn: socket.socket, address: str) -> None:
    """Connect to a gateway's control socket; OSError unless it runs as our uid or root
    (an abstract name of a gateway gone may have been taken by anyone)."""
    conn.connect(address)
    if not registry.trusted_peer(conn):
        raise PermissionError(f"the control socket {address!r} is another user's")


def take(address: str, port: int) -> Taken | None:
    """The listening socket of the gateway at ``address``, if it hands it over and it
    listens on ``port``; None otherwise (then bind beside it: ``SO_REUSEPORT``)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(TALK_TIMEOUT)
    try:
        _connect(conn, address)
        conn.sendall(b"handover\n")
        msg, fds, _flags, _addr = socket.recv_fds(conn, LINE_MAX, 1)
    except OSError as exc:
        conn.close()
        log.info("no hand-over from the old gateway", error=str(exc))
        return None
    if not msg.startswith(b"ok") or not fds:
        conn.close()
        for fd in fds:
            socket.close(fd)
        return None
    sock = socket.socket(fileno=fds[0])
    if sock.type != socket.SOCK_STREAM or sock.getsockname()[1] != port:
        sock.close()
        conn.close()
        return None
    return Taken(sock=sock, conn=conn)
