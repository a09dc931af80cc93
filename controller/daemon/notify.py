"""systemd's notify protocol: ``READY=1``, ``WATCHDOG=1``, ``STATUS=...`` datagrams.

A few lines instead of a library: one datagram to ``$NOTIFY_SOCKET`` (a path, or
``@name`` in the abstract namespace). Outside systemd every call is a no-op.
The variables are taken out of the environment so engines do not inherit them.
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
# systemd ignores a whole datagram over PIPE_BUF (4096 bytes): READY=1 with it. A status
# of this many characters (4 bytes each at most) leaves room for READY=1 beside it.
STATUS_MAX = 1000


class Notifier:
    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = _address(address)
        self.watchdog_usec = watchdog_usec

    @classmethod
    def from_environ(cls, environ: MutableMapping[str, str] | None = None) -> Notifier:
        env = os.environ if environ is None else environ
        values = {name: env.pop(name, None) for name in VARIABLES}
        usec = _int(values["WATCHDOG_USEC"])
        pid = _int(values["WATCHDOG_PID"])
        if pid is not None and pid != os.getpid():
            usec = None  # the watchdog is someone else's
        return cls(values["NOTIFY_SOCKET"], usec if usec and usec > 0 else None)

    @property
    def ping_interval(self) -> float | None:
        """Seconds between ``WATCHDOG=1`` pings: half of systemd's WatchdogSec."""
        return self.watchdog_usec / 2e6 if self.watchdog_usec else None

    def send(self, *fields: str) -> bool:
        """Send one message (``READY=1``, ``STATUS=...``); False when none was sent."""
        if self.address is None:
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                sock.sendto("\n".join(fields).encode(), self.address)
            except OSError:
                return False  # systemd went away: nothing the daemon can do about it
        return True


def status_field(text: str) -> str:
    """``STATUS=text`` on one line (a newline would start another field), cut to fit."""
    line = " ".join(text.split())
    if len(line) > STATUS_MAX:
        line = line[: STATUS_MAX - 1] + "…"
    return f"STATUS={line}"


def _address(value: str | None) -> str | None:
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]  # the abstract namespace
    return value if value.startswith("/") else None  # vsock: not supported


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None
