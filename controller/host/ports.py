"""Ports on this node: which TCP ports something listens on, whose listening sockets
they are, and whether one can be bound."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
from collections.abc import Iterable

from controller.host import sockdiag
from controller.host.sockdiag import Listener


def listening_ports() -> frozenset[int]:
    """TCP ports some process listens on: netlink's answer, else /proc/net (no bind probes)."""
    try:
        return sockdiag.listening()
    except OSError:
        return _proc_net_listening()


def _proc_net_listening() -> frozenset[int]:
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if len(fields) > 3 and fields[3] == "0A":  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return frozenset(ports)


def listeners_on(port: int) -> list[Listener]:
    """The sockets listening on TCP ``port`` (netlink's answer, else /proc/net)."""
    try:
        return sockdiag.listeners(port)
    except OSError:
        return [one for one in _proc_net_listeners() if one.port == port]


def _proc_net_listeners() -> list[Listener]:
    found: list[Listener] = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with contextlib.suppress(OSError), open(table) as f:
            next(f, None)
            for line in f:
                fields = line.split()
                if len(fields) > 9 and fields[3] == "0A":  # LISTEN
                    address, port = fields[1].rsplit(":", 1)
                    where = _proc_net_address(family, address)
                    found.append(
                        Listener(family, where, int(port, 16), int(fields[7]), int(fields[9]))
                    )
    return found


def _proc_net_address(family: int, text: str) -> str:
    """/proc/net's address: each 32-bit word of it printed as a number (host order)."""
    words = (int(text[i : i + 8], 16) for i in range(0, len(text), 8))
    return socket.inet_ntop(family, b"".join(w.to_bytes(4, sys.byteorder) for w in words))


def socket_holders(inode: int) -> list[int]:
    """The processes holding socket ``inode`` open, among those whose fds we may read
    (our uid's; every process's for root)."""
    link = f"socket:[{inode}]"
    with os.scandir("/proc") as procs:
        pids = [int(entry.name) for entry in procs if entry.name.isdigit()]
    return [pid for pid in pids if _holds(pid, link)]


def listener_commands(port: int) -> list[tuple[int, list[str]]]:
    """The processes holding the sockets that listen on ``port`` and their command lines,
    among those whose fds we may read (our uid's; every process's for root)."""
    inodes = {one.inode for one in listeners_on(port)}
    pids = sorted({pid for inode in inodes for pid in socket_holders(inode)})
    return [(pid, _command(pid)) for pid in pids]


def _command(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            raw = file.read()
    except OSError:
        return []  # gone meanwhile
    return [arg.decode(errors="replace") for arg in raw.split(b"\0") if arg]


def foreign_holders(port: int, ours: Iterable[int]) -> list[int]:
    """The processes holding the sockets that listen on ``port``, when none of ``ours``
    holds one; [] when one of ours does, nothing listens, or no holder can be seen
    (another user's process). A connection to ``port`` then reached one of them."""
    inodes = {one.inode for one in listeners_on(port)}
    if not inodes or any(holds_any(pid, inodes) for pid in ours):
        return []
    return sorted({pid for inode in inodes for pid in socket_holders(inode)})


def holds_any(pid: int, inodes: set[int]) -> bool:
    """Process ``pid`` holds one of the sockets ``inodes`` open (False when its fds are
    not ours to read, or it is gone)."""
    links = {f"socket:[{inode}]" for inode in inodes}
    try:
        with os.scandir(f"/proc/{pid}/fd") as fds:
            return any(_link(fd.path) in links for fd in fds)
    except OSError:
        return False


def _holds(pid: int, link: str) -> bool:
    try:
        with os.scandir(f"/proc/{pid}/fd") as fds:
            return any(_link(fd.path) == link for fd in fds)
    except OSError:
        return False  # gone, or not ours to read


def _link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None  # that fd closed meanwhile


def port_bindable(port: int) -> bool:
    """A bind probe on 127.0.0.1 and 0.0.0.0 (and :: where IPv6 exists)."""
    addresses: list[tuple[socket.AddressFamily, str]] = [
        (socket.AF_INET, "127.0.0.1"),
        (socket.AF_INET, "0.0.0.0"),
    ]
    if socket.has_ipv6:
        addresses.append((socket.AF_INET6, "::"))
    for family, host in addresses:
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this host
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False
        finally:
            sock.close()
    return True


def privileged(port: int) -> str | None:
    """Why this user may not bind ``port`` at all, else None.

    A bind probe, so the kernel decides (root, CAP_NET_BIND_SERVICE, the sysctl): an
    engine given a port below net.ipv4.ip_unprivileged_port_start by a reconcile that
    is not root would only die of "Permission denied" at each restart.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
    except PermissionError:
        start = _unprivileged_start()
        return (
            f"port {port} is below {start} (net.ipv4.ip_unprivileged_port_start), which only "
            f"root or CAP_NET_BIND_SERVICE may bind, and reconcile runs as uid {os.geteuid()}: "
            f"the engine could not bind it; give a port from {start} up (or put the gateway, "
            "`--listen`, in front of it)"
        )
    except OSError:
        return None  # in use, or no such address: placement's own checks say so
    finally:
        sock.close()
    return None


def _unprivileged_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as file:
            return int(file.read())
    except (OSError, ValueError):
        return 1024  # the kernel's default, and the BSDs' and macOS' reserved range


def in_use(where: str, port: int) -> str:
    """Why a bind of ``port`` found it in use, in words, and the next move: a process
    that listens there, or none, when a connection of this host holds the port as its
    own end (it was drawn from the range outgoing connections use, or is closing)."""
    if port in listening_ports():
        return (
            f"{where}: the address is already in use by another process (see `ss -ltnp "
            f"'sport = :{port}'`): pick another port or stop that process"
        )
    low, high = ephemeral_range()
    drawn = (
        f"; {low}-{high} is where this host draws the ports of its outgoing connections "
        f"(net.ipv4.ip_local_port_range): pick one below {low}"
        if low <= port <= high
        else ""
    )
    return (
        f"{where}: the address is in use, though nothing listens there: a connection of "
        f"this host holds it as its own end (see `ss -tanp 'sport = :{port}'`){drawn}"
    )


_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range() -> tuple[int, int]:
    """The ports outgoing connections are given (Linux' default where it cannot be read)."""
    with contextlib.suppress(OSError, ValueError), open(_RANGE) as f:
        low, high = f.read().split()
        return int(low), int(high)
    return 32768, 60999
