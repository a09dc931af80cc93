"""``[HOST:]PORT``, as the ``--listen`` and ``--metrics-port`` flags take it, and the
loopback-``Host`` rule of a keyless server on loopback (DESIGN.md "The page and local
users"). Pure."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK = "127.0.0.1"


def split_listen(text: str) -> tuple[str, int] | None:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT`` -> (host, port), loopback when no host is
    given; None when it is none of these (the caller names its flag in the error)."""
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]") or LOOPBACK, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def foreign_host(header: str | None) -> str | None:
    """The name a request's ``Host`` header gives when it is not a loopback one (a page
    of a web site whose name was made to resolve to 127.0.0.1: DNS rebinding), else None.

    No header at all names nothing a browser could have rebound (browsers always send
    one), so it passes."""
    if header is None:
        return None
    try:
        name = urlsplit(f"//{header}").hostname or ""
    except ValueError:  # a bracket left open: no host a rule could trust
        return header
    return None if is_loopback(name) else name


def host_refusal(header: str | None) -> str | None:
    """The 403's sentence for a foreign ``Host`` (None: it may pass)."""
    name = foreign_host(header)
    if name is None:
        return None
    return (
        f"this server has no API keys, so it answers only a loopback host name "
        f"(127.0.0.1, localhost, [::1]), not {name!r}: reach it by one of those names "
        "(a reverse proxy in front of it: have it send `Host: localhost`)"
    )
