"""A handshake the gateway refuses ends with OpenSSL's alert on the wire, as nginx's does.

asyncio's TLS transport (and uvloop's, its copy) closes a connection whose handshake
failed without sending what OpenSSL wrote for the client: the alert that says why
(``protocol version`` to a TLS 1.1 client, ``handshake failure`` to one with no suite in
common, ``certificate required`` to a client with no certificate under
``--tls-client-ca``). The client read "unexpected eof" (curl: ``SSL_ERROR_SYSCALL``),
which reads as a gateway that crashed, not one that refused it.

The context's ``sslobject_class`` is ``AlertSending`` (``tls.server_context``): the
transport makes each connection's ``SSLObject`` through it, in the context of the
acceptor's task for that connection (``tlsaccept``), where ``alerts_to`` named the
connection's fd. When ``do_handshake`` fails for good, what OpenSSL left in the outgoing
BIO (the alert, a few bytes) is written to that fd before the error goes on to the
transport, which then closes it. The handshake's earlier flights went out through the
transport at once (a few KB, always room in the socket's buffer), so the alert follows
them in order.

It extends ``ssl.SSLObject._create``, the private factory ``SSLContext.wrap_bio`` calls
(CPython 3.11 to 3.13): where a Python has none, ``tls.server_context`` leaves the
context's own class, and a refusal reads EOF as it did before.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import ssl
from typing import Any

_FD: contextvars.ContextVar[int | None] = contextvars.ContextVar("tls_alert_fd", default=None)
_AGAIN = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


def alerts_to(fd: int) -> None:
    """The connections the current task hands on next send their refusals to ``fd``."""
    _FD.set(fd)


class AlertSending(ssl.SSLObject):
    """An ``SSLObject`` whose failed handshake sends its alert (the module's docstring)."""

    _outgoing: ssl.MemoryBIO
    _fd: int | None

    @classmethod
    def _create(  # ssl's private factory (what wrap_bio calls), its arguments passed on
        cls, incoming: ssl.MemoryBIO, outgoing: ssl.MemoryBIO, *args: Any, **kwargs: Any
    ) -> AlertSending:
        made: AlertSending = super()._create(  # type: ignore[misc]
            incoming, outgoing, *args, **kwargs
        )
        made._outgoing = outgoing
        made._fd = _FD.get()
        return made

    def do_handshake(self) -> None:
        try:
            super().do_handshake()
        except _AGAIN:
            raise
        except ssl.SSLError:
            self._send_alert()
            raise

    def _send_alert(self) -> None:
        if self._fd is None:  # no acceptor named a connection: the BIO's bytes stay its own
            return
        alert = self._outgoing.read()
        if alert:
            # A client gone, or (never for a few bytes) a full buffer: it reads EOF, as before.
            with contextlib.suppress(OSError):
                os.write(self._fd, alert)
