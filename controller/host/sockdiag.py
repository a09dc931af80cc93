"""TCP ports in LISTEN, asked of the kernel by netlink (``NETLINK_SOCK_DIAG``).

``/proc/net/tcp`` lists every socket, TIME_WAIT included: on a busy box (a gateway,
a benchmark) that is thousands of lines the kernel formats on each read, tens of
milliseconds before every spawn. sock_diag filters by state in the kernel and answers
only the listeners. Linux only; the caller falls back to ``/proc/net`` on any error.

Each listener also comes with its address, owner uid and socket inode (``listeners``):
the gateway asks who else listens on its port before it listens there itself.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
TCP_LISTEN = 10
HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, protocol, ext, pad, states, id
SPORT_AT = HEADER.size + 4  # inet_diag_msg: family, state, timer, retrans, then sport (BE)
SRC_AT = SPORT_AT + 4  # after sport and dport: the source address, 16 bytes (IPv4: 4)
UID_INODE_AT = HEADER.size + 64  # after the 48-byte sockid, expires, rqueue, wqueue


@dataclass(frozen=True, slots=True)
class Listener:
    """One TCP socket in LISTEN: where, whose (uid), and which (inode, as in /proc fds)."""

    family: int
    address: str
    port: int
    uid: int
    inode: int

    def overlaps(self, address: str) -> bool:
        """Connections to ``address`` on this port could reach this socket: the same
        address, or either side is a wildcard (0.0.0.0, ::)."""
        ours = ipaddress.ip_address(address)
        theirs = ipaddress.ip_address(self.address)
        return ours.is_unspecified or theirs.is_unspecified or ours == theirs


def listening() -> frozenset[int]:
    """Ports some TCP socket (IPv4 or IPv6) listens on; OSError if netlink says no."""
    return frozenset(one.port for one in _all())


def listeners(port: int) -> list[Listener]:
    """The TCP sockets (IPv4 and IPv6) listening on ``port``; OSError if netlink says no."""
    return [one for one in _all() if one.port == port]


def _all() -> list[Listener]:
    found: list[Listener] = []
    for family in (socket.AF_INET, socket.AF_INET6):
        found += _dump(family)
    return found


def _dump(family: int) -> list[Listener]:
    body = REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
    head = HEADER.pack(
        HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0
    )
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(1.0)
        sock.sendto(head + body, (0, 0))
        found: list[Listener] = []
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise OSError("sock_diag: empty answer")
            if _parse(data, family, found):
                return found


def _parse(data: bytes, family: int, found: list[Listener]) -> bool:
    """Add the listeners of one datagram's messages; True at the dump's end."""
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind, _, _, _ = HEADER.unpack_from(data, offset)
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR or length < HEADER.size:
            raise OSError("sock_diag: the kernel refused the dump")
        found.append(_listener(data, offset, family))
        offset += (length + 3) & ~3
    return False


def _listener(data: bytes, offset: int, family: int) -> Listener:
    (port,) = struct.unpack_from("!H", data, offset + SPORT_AT)
    size = 4 if family == socket.AF_INET else 16
    raw = data[offset + SRC_AT : offset + SRC_AT + size]
    uid, inode = struct.unpack_from("=II", data, offset + UID_INODE_AT)
    return Listener(family, socket.inet_ntop(family, raw), port, uid, inode)
