"""The gateway's engine sockets give up on a lost host (gateway/surface/enginesock.py): keep-alive
probes and TCP_USER_TIMEOUT are set, read back from the kernel. The partition itself is
tests/cluster/test_partition.py: a cut host's requests go to the other replica."""

from __future__ import annotations

import socket

from controller.gateway.surface.enginesock import (
    COUNT,
    IDLE,
    INTERVAL,
    USER_TIMEOUT_MS,
    engine_socket,
)


def test_an_engine_socket_gives_up_on_a_lost_host() -> None:
    info = socket.getaddrinfo("127.0.0.1", 80, type=socket.SOCK_STREAM)[0]
    with engine_socket(info) as sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        tcp = socket.IPPROTO_TCP
        assert sock.getsockopt(tcp, socket.TCP_KEEPIDLE) == IDLE
        assert sock.getsockopt(tcp, socket.TCP_KEEPINTVL) == INTERVAL
        assert sock.getsockopt(tcp, socket.TCP_KEEPCNT) == COUNT
        assert sock.getsockopt(tcp, socket.TCP_USER_TIMEOUT) == USER_TIMEOUT_MS
