"""``[HOST:]PORT``, as the ``--listen`` and ``--metrics-port`` flags take it. Pure."""

from __future__ import annotations

LOOPBACK = "127.0.0.1"


def split_listen(text: str) -> tuple[str, int] | None:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT`` -> (host, port), loopback when no host is
    given; None when it is none of these (the caller names its flag in the error)."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]") or LOOPBACK, int(port)
