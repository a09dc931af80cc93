"""Ports on this node: which TCP ports something listens on, and whether one can be bound."""

from __future__ import annotations

import contextlib
import errno
import socket

from controller.host import sockdiag


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
