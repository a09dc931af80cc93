"""The gateway's sockets to engines: a lost engine host is noticed in seconds.

A pooled keep-alive connection to an engine whose host is cut off (a partition, a
power cut) never hears a reset: a request written on it, or one waiting for its answer,
would wait forever (the gateway sets no overall timeout: generations are long). The
kernel is told to give up instead: keep-alive probes after ``IDLE`` seconds without
traffic, ``COUNT`` of them ``INTERVAL`` apart, and ``TCP_USER_TIMEOUT`` for data sent
and never acknowledged. A live engine's kernel answers both at once, however long the
engine itself takes to answer, so only a dead or unreachable host is cut. The
connection then fails before any byte of the answer, and the request goes to another
instance (proxy.py: ``retry``).
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

IDLE = 3  # seconds without traffic before the first probe
INTERVAL = 1
COUNT = 3
USER_TIMEOUT_MS = 6000  # data unacknowledged this long: the host is gone
# A new connection's SYN unanswered this long: the host is gone (proxy.py: UpstreamDown,
# the request goes to another instance).
CONNECT_TIMEOUT = 5.0


def engine_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """The engine clients' ``socket_factory`` (upstream.py's and aiohttp's): a TCP socket that
    gives up on a lost host."""
    family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
    sock = socket.socket(family=family, type=type_, proto=proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", IDLE),
        ("TCP_KEEPINTVL", INTERVAL),
        ("TCP_KEEPCNT", COUNT),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS),
    ):
        option = getattr(socket, name, None)
        if option is not None:  # Linux has them all; elsewhere the defaults stay
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    return sock
