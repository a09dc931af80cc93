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

Sockets are bound with ``SO_REUSEPORT`` too, so a gateway that cannot hand over (an
older one, one that does not answer) can still be replaced: bind beside it, then
``SIGTERM`` it (the queue caveat above applies to that path only). Beside a gateway of
the same state dir only (``bind_alone``): the kernel lets any process of our uid join,
and a gateway of another state dir there answered half the requests with 404.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.errors import ConfigError
from controller.gateway import registry
from controller.host import ports
from controller.host.sockdiag import Listener
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
                self._stop("handed over")
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


def _connect(conn: socket.socket, address: str) -> None:
    """Connect to a gateway's control socket; OSError unless it runs as our uid or root
    (an abstract name of a gateway gone may have been taken by anyone)."""
    conn.connect(address)
    if not registry.trusted_peer(conn):
        raise PermissionError(f"the control socket {address!r} is another user's")


def bind(host: str, port: int, backlog: int) -> socket.socket:
    """One listening socket for ``host:port`` (its first address), with ``SO_REUSEPORT``
    so a successor that cannot take this one over can still bind beside it."""
    sock = _bound(host, port)
    return _listening(sock, backlog)


def bind_alone(host: str, port: int, backlog: int, state_dir: Path) -> socket.socket:
    """``bind``, refused (ConfigError) when anything but a gateway of ``state_dir``
    listens where connections to ``host:port`` could go: ``SO_REUSEPORT`` lets any
    process of our uid join the port, and the kernel would give it half of them.

    Looked at after the bind and before the listen: a bound socket that does not
    listen gets no connection, so closing it on a refusal loses none of the other's."""
    where = f"--listen {host}:{port}"
    try:
        sock = _bound(host, port)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise ConfigError(_in_use(where, state_dir, _address(host, port)[3][0], port)) from exc
    try:
        found = strangers(state_dir, sock.getsockname()[0], port)
        if found:
            raise ConfigError(found[0].refusal(where))
    except BaseException:
        sock.close()
        raise
    return _listening(sock, backlog)


def _in_use(where: str, state_dir: Path, address: str, port: int) -> str:
    """The bind was refused: who holds the port, when we may know."""
    with contextlib.suppress(OSError):
        found = strangers(state_dir, address, port)
        if found:
            return found[0].refusal(where)
    return (
        f"{where}: the address is already in use by another process (see `ss -ltnp "
        f"'sport = :{port}'`): pick another port or stop that process"
    )


@dataclass(frozen=True, slots=True)
class Stranger:
    """A socket listening on the gateway's port that is no gateway's of its state dir."""

    who: str  # "the reconcile gateway of state dir S (pid N)", "another process (pid N)"
    port: int
    state_dir: Path | None  # the other gateway's, when it is one

    def refusal(self, where: str) -> str:
        if self.state_dir is not None:
            return (
                f"{where}: the port is served by {self.who}; two gateways on one port "
                f"would each answer half the requests: give this daemon another --listen "
                f"port, or stop that gateway (reconcile --state-dir {self.state_dir} "
                f"gateway stop)"
            )
        return (
            f"{where}: the address is already in use by {self.who} (see `ss -ltnp "
            f"'sport = :{self.port}'`): pick another port or stop that process"
        )


def strangers(
    state_dir: Path, address: str, port: int, known: frozenset[int] = frozenset()
) -> list[Stranger]:
    """Who else listens where connections to ``address:port`` could go: every socket
    there but those of ``known`` inodes and those held by gateways of ``state_dir``."""
    found: list[Stranger] = []
    for one in ports.listeners_on(port):
        if one.inode not in known and one.overlaps(address):
            stranger = _stranger(one, state_dir)
            if stranger is not None:
                found.append(stranger)
    return found


def _stranger(one: Listener, state_dir: Path) -> Stranger | None:
    """None when the listener ``one`` is held by gateways of ``state_dir`` alone."""
    pids = ports.socket_holders(one.inode)
    dirs = {pid: registry.gateway_state_dir(pid) for pid in pids}
    if pids and all(d is not None and _same_dir(d, state_dir) for d in dirs.values()):
        return None  # our own gateway (one that would not hand over): beside it is fine
    for pid, other in dirs.items():
        if other is not None and not _same_dir(other, state_dir):
            who = f"the reconcile gateway of state dir {other} (pid {pid})"
            return Stranger(who, one.port, other)
    who = f"another process (pid {pids[0]})" if pids else f"another process (uid {one.uid})"
    return Stranger(who, one.port, None)


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.absolute() == b.absolute()


def _address(host: str, port: int) -> tuple[int, int, int, Any]:
    """``host:port``'s first address: family, type, protocol, sockaddr."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    return family, kind, proto, addr


def _bound(host: str, port: int) -> socket.socket:
    family, kind, proto, addr = _address(host, port)
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):  # Linux: only sockets of our own uid may join
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except BaseException:
        sock.close()
        raise
    return sock


def _listening(sock: socket.socket, backlog: int) -> socket.socket:
    try:
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


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
