"""The gateway's listening socket: bound beside nobody but a gateway of its own state
dir, and closed without resetting a connection it has just accepted.

**Binding.** ``SO_REUSEPORT`` is set so a successor that cannot take the socket over
(``handover.py``) can still bind beside it; but the kernel lets any process of our uid
join such a port, and a daemon of another state dir given the same ``--listen`` once
took half the requests and answered them 404. So ``bind_alone`` looks, after its bind
and before its listen, at every socket listening there and at who holds it, and the
serving gateway looks again now and then (``strangers``) for one that joined later.

**Closing.** asyncio's selector loop accepts a connection in the listener's callback, but builds its
transport in a task that runs a turn later; that step asserts the server is still open
(``Server._attach``). ``Server.close()`` in between makes it fail, silently unless the
loop is in debug mode (CPython gh-109564, open): the connection is never read nor closed,
and when the process exits the kernel resets the request its client sent. A gateway
handing its socket over closes its listener under load, and lost about one request in
ten hand-overs on 2 busy cores that way. So the callback comes off first, the connections
it accepted are let attach, and only then is the server closed. (uvloop attaches in the
accept callback itself: nothing is pending there.)
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
from asyncio.selector_events import BaseSelectorEventLoop
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from controller.errors import ConfigError
from controller.gateway.lifecycle import registry
from controller.host import ports
from controller.host.sockdiag import Listener
from controller.store.config import stateid

# Loop turns for an accepted connection's transport task to run: it is scheduled by the
# accept callback and attaches in its first step, so one turn; three for margin.
ATTACH_TURNS = 3


class Listening(Protocol):
    """What accepts the gateway's connections: ``create_server``'s ``asyncio.Server``, or
    with TLS the gateway's own (``tlsaccept.Acceptor``)."""

    @property
    def sockets(self) -> Sequence[Any]: ...

    def close(self) -> None: ...

    async def start_serving(self) -> None: ...


async def close_listener(server: Listening) -> None:
    """Stop accepting on ``server``, let what it accepted attach, then close it."""
    loop = asyncio.get_running_loop()
    if isinstance(loop, BaseSelectorEventLoop):
        for sock in server.sockets:
            loop.remove_reader(sock.fileno())  # no accept after this: nothing new pends
        for _ in range(ATTACH_TURNS):
            await asyncio.sleep(0)
    server.close()


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
    return ports.in_use(where, port)


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


@dataclass(frozen=True, slots=True)
class _Dir:
    """A state dir as its gateways are told apart: its path, and its id (``stateid.py``),
    which the gateways it starts carry. A gateway of its path and another id is another
    state dir's at that path (its disk not mounted, the folder replaced), as an engine of
    such is (``reconciler/replaced.py``); one that carries none (an older version's) is
    judged by its path, as is every one while the id cannot be read."""

    path: Path
    id: str | None
    readable: bool

    @classmethod
    def of(cls, path: Path) -> _Dir:
        """The state dir this gateway process serves: the id it was started with (the
        folder at the path may be another's by now), else the one there now."""
        carried = os.environ.get(registry.STATE_ID)
        if carried:
            return cls(path, carried, True)
        try:
            return cls(path, stateid.peek(path), True)
        except (OSError, ConfigError):  # the passes say what is wrong with it
            return cls(path, None, False)

    def holds(self, pid: int, where: Path | None) -> bool:
        """The gateway ``pid``, of the state dir ``where``, is this state dir's."""
        if not _same_dir(where, self.path):
            return False
        theirs = registry.gateway_state_id(pid) if self.readable else None
        return theirs is None or theirs == self.id


def strangers(
    state_dir: Path, address: str, port: int, known: frozenset[int] = frozenset()
) -> list[Stranger]:
    """Who else listens where connections to ``address:port`` could go: every socket
    there but those of ``known`` inodes and those held by gateways of ``state_dir``."""
    found: list[Stranger] = []
    here = _Dir.of(state_dir)
    for one in ports.listeners_on(port):
        if one.inode not in known and one.overlaps(address):
            stranger = _stranger(one, here)
            if stranger is not None:
                found.append(stranger)
    return found


def _stranger(one: Listener, here: _Dir) -> Stranger | None:
    """None when the listener ``one`` is held by gateways of the state dir ``here`` alone."""
    pids = ports.socket_holders(one.inode)
    dirs = {pid: registry.gateway_state_dir(pid) for pid in pids}
    if pids and all(here.holds(pid, d) for pid, d in dirs.items()):
        return None  # our own gateway (one that would not hand over): beside it is fine
    for pid, other in dirs.items():
        if other is not None and not _same_dir(other, here.path):
            who = f"the reconcile gateway of state dir {other} (pid {pid})"
            return Stranger(who, one.port, other)
        if other is not None and not here.holds(pid, other):
            who = (
                f"the reconcile gateway of another state dir once at {other} (pid {pid}; "
                "its disk not mounted, or the folder replaced: mount it back, or stop that "
                f"gateway with `kill {pid}`, it drains and exits)"
            )
            return Stranger(who, one.port, None)
    who = f"another process (pid {pids[0]})" if pids else f"another process (uid {one.uid})"
    return Stranger(who, one.port, None)


def unnamed_gateways(state_dir: Path, address: str, port: int, named: Collection[int]) -> list[int]:
    """The pids of gateways of ``state_dir`` listening where connections to
    ``address:port`` could go that are none of ``named`` (the live gateways its files
    name): ones it forgot (restored from a backup taken before they started), which
    nothing would ever stop and which the kernel gives a share of the connections, routed
    by records they may no longer see (their watch is of the folders the restore removed)."""
    found: set[int] = set()
    for one in ports.listeners_on(port):
        if one.overlaps(address):
            found.update(p for p in ports.socket_holders(one.inode) if p not in named)
    here = _Dir.of(state_dir)  # by its id: one of another state dir at the path is not ours
    return sorted(p for p in found if here.holds(p, registry.gateway_state_dir(p)))


def _same_dir(a: Path | None, b: Path) -> bool:
    if a is None:
        return False
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
