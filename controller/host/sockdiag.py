"""TCP ports in LISTEN, asked of the kernel by netlink (``NETLINK_SOCK_DIAG``).

``/proc/net/tcp`` lists every socket, TIME_WAIT included: on a busy box (a gateway,
a benchmark) that is thousands of lines the kernel formats on each read, tens of
milliseconds before every spawn. sock_diag filters by state in the kernel and answers
only the listeners. Linux only; the caller falls back to ``/proc/net`` on any error.
"""

from __future__ import annotations

import socket
import struct

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


def listening() -> frozenset[int]:
    """Ports some TCP socket (IPv4 or IPv6) listens on; OSError if netlink says no."""
    ports: set[int] = set()
    for family in (socket.AF_INET, socket.AF_INET6):
        ports |= _dump(family)
    return frozenset(ports)


def _dump(family: int) -> set[int]:
    body = REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
    head = HEADER.pack(
        HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0
    )
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(1.0)
        sock.sendto(head + body, (0, 0))
        ports: set[int] = set()
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise OSError("sock_diag: empty answer")
            if _parse(data, ports):
                return ports


def _parse(data: bytes, ports: set[int]) -> bool:
    """Add the ports of one datagram's messages; True at the dump's end."""
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind, _, _, _ = HEADER.unpack_from(data, offset)
        if kind == NLMSG_DONE:
            return True
        if kind == NLMSG_ERROR or length < HEADER.size:
            raise OSError("sock_diag: the kernel refused the dump")
        (port,) = struct.unpack_from("!H", data, offset + SPORT_AT)
        ports.add(port)
        offset += (length + 3) & ~3
    return False
