"""TLS on the gateway: ``--tls-cert FILE --tls-key FILE`` (issue 39), and with
``--tls-client-ca FILE`` a client certificate that CA signed required of every client;
a CRL in that file beside its CA (``openssl ca -gencrl``'s PEM) refuses the certificates
it revokes, and once past its nextUpdate every certificate of that CA, as nginx's
``ssl_crl`` does (``tlsaccept.py`` says which in the log).

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
from typing import TYPE_CHECKING, NoReturn

from controller.errors import ConfigError
from controller.gateway.lifecycle.tlsalerts import AlertSending
from controller.store.sources import security

if TYPE_CHECKING:
    from controller.gateway.settings import Settings


class TlsError(ConfigError):
    """A certificate or key that cannot serve: refused at start (exit 64)."""


def as_named(exc: TlsError, settings: Settings) -> TlsError:
    """The refusal naming what named the pair: node.yaml's file and fields when no flag
    did (it said `--tls-key ...: no such file` of a flag the operator never gave)."""
    return TlsError(named(str(exc), settings)) if settings.node_tls else exc


def named(text: str, settings: Settings) -> str:
    """``text``, which names the pair by its flags, as the operator gave the pair: where
    node.yaml named it, `node.yaml:LINE: tlsKey ...` (the field the text names first), as
    the file's other errors say theirs (it said the file alone)."""
    if not settings.node_tls:
        return text
    from controller.store.config.nodeconfig import setting_at  # pydantic: a refusal's only

    at = {flag: text.find(flag) for flag in _FIELDS if flag in text}
    first = min(at, key=at.__getitem__, default="--tls-cert")
    for flag, field in _FIELDS.items():
        text = text.replace(flag, field)
    return f"{setting_at(settings.node_file, _FIELDS[first])}: {text}"


_FIELDS = {"--tls-cert": "tlsCert", "--tls-key": "tlsKey"}  # node.yaml's names of the flags


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


# TLS 1.2's AEAD suites alone, as Mozilla's "intermediate" configuration: Python's default
# adds the CBC ones (ECDHE-*-AES*-SHA256/384: Lucky13), which no client of the API needs
# and scanners flag. TLS 1.3's suites, all AEAD, are OpenSSL's and not set here.
TLS_1_2_SUITES = "ECDHE+AESGCM:ECDHE+CHACHA20"


def server_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    """A server context holding ``cert`` and ``key``, TLS 1.2 at least, and with
    ``client_ca`` a client certificate it signed required; TlsError when a file cannot
    be read or the certificate and key are no pair."""
    check_key_mode(key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_ciphers(TLS_1_2_SUITES)
    if hasattr(ssl.SSLObject, "_create"):  # the private factory it extends (3.11-3.13's)
        context.sslobject_class = AlertSending  # a refused handshake's alert reaches its client
    _load(context, cert, key)
    if client_ca is not None:
        _trust(context, client_ca)
    return context


CRL_BEGIN = b"-----BEGIN X509 CRL-----"  # a CRL's PEM, as `openssl ca -gencrl` writes it


def _trust(context: ssl.SSLContext, client_ca: Path) -> None:
    """Every client must show a certificate ``client_ca`` signed (mutual TLS); with a CRL
    in the file beside its CA, one it does not revoke (as nginx's ``ssl_crl``): OpenSSL
    loads the file's CRLs with its certificates, and checks them once told to."""
    try:
        context.load_verify_locations(cafile=client_ca)
        revokes = CRL_BEGIN in client_ca.read_bytes()
    except FileNotFoundError:
        raise TlsError(f"--tls-client-ca {client_ca}: no such file") from None
    except (ssl.SSLError, OSError) as exc:
        why = exc.reason if isinstance(exc, ssl.SSLError) else exc.strerror
        raise TlsError(
            f"--tls-client-ca {client_ca}: not PEM CA certificates (and CRLs) ({why})"
        ) from None
    context.verify_mode = ssl.CERT_REQUIRED
    if revokes:  # the client's own certificate: nginx's ssl_crl checks the leaf too
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF


class EncryptedKey(ValueError):
    """The key file asks for a passphrase (raised by ``no_passphrase``)."""


def no_passphrase() -> NoReturn:
    """The password callback of every load of the key: without one, OpenSSL asks for the
    passphrase of an encrypted key on the terminal (or stdin), which hung a daemon
    started from a shell and wrote its prompt into the gateway's log at a reload."""
    raise EncryptedKey


# OpenSSL's reasons for a key that is not the certificate's: of another key of its type,
# or of another type (an RSA key beside an ECDSA certificate)
_NOT_ITS_KEY = frozenset({"KEY_VALUES_MISMATCH", "NO_CERTIFICATE_ASSIGNED"})


def _load(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    if not cert.exists():
        raise TlsError(f"--tls-cert {cert}: no such file")
    if not cert.is_file():
        raise TlsError(f"--tls-cert {cert} is not a file: give the certificate's PEM file")
    try:
        context.load_cert_chain(certfile=cert, keyfile=key, password=no_passphrase)
    except EncryptedKey:
        raise TlsError(
            f"--tls-key {key} is encrypted (it asks for a passphrase) and the gateway "
            f"cannot ask for one: write it unencrypted (run: openssl pkey -in {key} -out "
            "FILE, then chmod 600 FILE and give --tls-key FILE)"
        ) from None
    except ssl.SSLError as exc:
        raise TlsError(_unloadable(cert, key, exc)) from None
    except OSError as exc:
        where = f"--tls-cert {cert} / --tls-key {key}"
        raise TlsError(f"{where}: cannot read: {exc.strerror}") from None


def _unloadable(cert: Path, key: Path, exc: ssl.SSLError) -> str:
    """What is wrong with a pair OpenSSL refused, naming the file at fault: OpenSSL says
    only "PEM lib" for either file, so the certificate is tried alone."""
    if exc.reason in _NOT_ITS_KEY:
        return (
            f"--tls-key {key} is not the private key of --tls-cert {cert} (a key of "
            "another certificate?): give the key the certificate was made for"
        )
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert)
    except (ssl.SSLError, OSError):
        return (
            f"--tls-cert {cert} holds no PEM certificate (-----BEGIN CERTIFICATE-----): "
            "give the certificate's file, the key's in --tls-key"
        )
    why = f" ({exc.reason})" if exc.reason else ""  # else only "PEM lib": no news
    return (
        f"--tls-key {key} is not a PEM private key (-----BEGIN PRIVATE KEY-----){why}: "
        f"give the unencrypted key of --tls-cert {cert}"
    )


class Tls:
    """The gateway's live context and its reload."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        self.context = server_context(cert, key, client_ca)

    def fresh(self) -> ssl.SSLContext:
        """A context of the pair (and client CA) on disk now; TlsError (and what is in
        force kept) when it cannot serve. The client CA file is read afresh too: a CA
        removed from it is no longer trusted, a CRL put there revokes from then on."""
        return server_context(self.cert, self.key, self.client_ca)

    def use(self, context: ssl.SSLContext) -> None:
        """``context`` for the handshakes from now on. Call on the loop's thread:
        handshakes read the context there."""
        self.context = context


def plain_warning(host: str, port: int, loopback: bool, tls: bool) -> str | None:
    """The warning for a gateway reachable from other machines in clear text."""
    if loopback or tls:
        return None
    return (
        f"the gateway on {host}:{port} speaks plain HTTP to other machines: API keys and "
        "prompts cross the network in clear text; give --tls-cert FILE --tls-key FILE"
    )
