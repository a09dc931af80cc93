"""TLS on the gateway: ``--tls-cert FILE --tls-key FILE`` (issue 39), and with
``--tls-client-ca FILE`` a client certificate that CA signed required of every client.

The gateway then speaks HTTPS only, TLS 1.2 at least. The key file is held to the key
file's rule (``keys.py``): group and others have no access, and as root root owns it.
Both files are loaded and checked by the daemon before it starts (exit 64 with what is
wrong), and again by each gateway process.

**Reload (SIGHUP).** A reload builds a fresh context from the files and puts it in
place of the old one; the acceptor (``tlsaccept.py``) reads ``Tls.context`` at each
handshake, so new connections get the new pair and open ones keep the certificate they
began with. It is never loaded into the live context: OpenSSL keeps one certificate per
key type there, so a renewal from an ECDSA key to an RSA one (or back) left the old
certificate beside the new, and clients that prefer the old type kept getting it while
the log said "reloaded". A bad pair (a key of another certificate, a half-written file)
is refused while the fresh context is built, and the one in force stays. The listening
socket handed to a successor (``handover.py``) is a plain TCP socket: the successor
wraps it with its own context from the same settings.
"""

from __future__ import annotations

import os
import ssl
import stat
from pathlib import Path

from controller.errors import ConfigError
from controller.store.sources import security


class TlsError(ConfigError):
    """A certificate or key that cannot serve: refused at start (exit 64)."""


def check_key_mode(key: Path) -> None:
    """The key file's rule, as the API keys file's: no access for group or others."""
    try:
        info = os.stat(key)
    except FileNotFoundError:
        raise TlsError(f"--tls-key {key}: no such file") from None
    except OSError as exc:
        raise TlsError(f"--tls-key {key}: cannot read: {exc.strerror}") from None
    owner = security.path_problem(key) if security.strict() else None
    if owner is not None:
        raise TlsError(
            f"--tls-key {key} is {owner}: whoever owns it can impersonate this gateway "
            f"(run: chown root {key})"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise TlsError(
            f"--tls-key {key} has mode {mode:04o}: group and others must have no access "
            f"(run: chmod 600 {key})"
        )


def server_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """A server context holding ``cert`` and ``key``, TLS 1.2 at least, and with
    ``client_ca`` a client certificate it signed required; TlsError when a file cannot
    be read or the certificate and key are no pair."""
    check_key_mode(key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context, cert, key)
    if client_ca is not None:
        _trust(context, client_ca)
    return context


def _trust(context: ssl.SSLContext, client_ca: Path) -> None:
    """Every client must show a certificate ``client_ca`` signed (mutual TLS)."""
    try:
        context.load_verify_locations(cafile=client_ca)
    except FileNotFoundError:
        raise TlsError(f"--tls-client-ca {client_ca}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        why = exc.reason if isinstance(exc, ssl.SSLError) else exc.strerror
        raise TlsError(f"--tls-client-ca {client_ca}: not PEM CA certificates ({why})") from None
    context.verify_mode = ssl.CERT_REQUIRED


def _load(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    if not cert.is_file():
        raise TlsError(f"--tls-cert {cert}: no such file")
    try:
        context.load_cert_chain(certfile=cert, keyfile=key)
    except ssl.SSLError as exc:
        raise TlsError(
            f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate and its private key "
            f"({exc.reason or exc.strerror}); the key must be unencrypted and belong to the "
            "certificate"
        ) from None
    except OSError as exc:
        where = f"--tls-cert {cert} / --tls-key {key}"
        raise TlsError(f"{where}: cannot read: {exc.strerror}") from None


class Tls:
    """The gateway's live context and its reload."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        self.context = server_context(cert, key, client_ca)

    def reload(self) -> None:
        """The pair (and client CA) on disk now, for the handshakes from now on;
        TlsError (and what is in force kept) when it cannot serve. Call on the loop's
        thread: handshakes read the context there. The client CA file is read afresh
        too: a CA removed from it is no longer trusted."""
        self.context = server_context(self.cert, self.key, self.client_ca)


def plain_warning(host: str, port: int, loopback: bool, tls: bool) -> str | None:
    """The warning for a gateway reachable from other machines in clear text."""
    if loopback or tls:
        return None
    return (
        f"the gateway on {host}:{port} speaks plain HTTP to other machines: API keys and "
        "prompts cross the network in clear text; give --tls-cert FILE --tls-key FILE"
    )
