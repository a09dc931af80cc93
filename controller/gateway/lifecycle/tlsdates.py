"""Whether the gateway's certificate is in date: an expired one (or one not valid yet)
loads and serves like any other, and every client that checks certificates refuses it,
so the daemon's start and each SIGHUP reload warn about it (nginx says nothing either:
its users find out from their clients).

Python's ``ssl`` reads no certificate's dates without a private helper, so OpenSSL is
asked the way a client would find out: a handshake in memory between the certificate and
a client that trusts that certificate alone (``VERIFY_X509_PARTIAL_CHAIN``, no hostname
check). Only its dates can then fail the verification; any other failure is not ours to
report here. The leaf is asked alone (a client checks the dates of every certificate it
is sent), then, for a file that sends intermediates with it, the whole file to a client
trusting its last certificate alone: an expired intermediate is refused as an expired
leaf is, and the warning says which of the two it is.

A CRL in ``--tls-client-ca``'s file past its nextUpdate refuses every client certificate of
its CA (as nginx's ``ssl_crl``): said at start and at each reload too (``crl_out_of_date``).
No handshake can ask OpenSSL that without a client certificate of the CA, so the date is
read from the CRL's DER itself (RFC 5280 5.1: a few fixed fields at its head).
"""

from __future__ import annotations

import base64
import binascii
import re
import ssl
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from controller.gateway.lifecycle.tls import no_passphrase
from controller.logsetup import get_logger

# OpenSSL's X509_V_ERR_CERT_NOT_YET_VALID and X509_V_ERR_CERT_HAS_EXPIRED
_OUT_OF_DATE = {9: "is not valid yet (its notBefore is in the future)", 10: "has expired"}
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)
_TURNS = 8  # a TLS 1.3 handshake settles in 2 round trips; this many is plenty


def out_of_date(cert: Path, key: Path) -> str | None:
    """The warning for ``cert`` (a pair already checked) when clients refuse it for its
    dates, or for those of an intermediate the file sends with it; None when all are in
    date (or cannot be looked at: the pair's check says why)."""
    try:
        pems = _PEM.findall(cert.read_text(encoding="ascii", errors="replace"))
        what, why = "the certificate", _dates(_server(cert, key, pems[:1]), pems[0])
        if why is None and len(pems) > 1:  # the leaf in date: its chain, up to the last
            what, why = "a certificate of its chain", _dates(_server(cert, key), pems[-1])
    except (OSError, ValueError, IndexError):  # ssl.SSLError is an OSError
        return None
    if why is None:
        return None
    return (
        f"--tls-cert {cert}: {what} {why}: every client that checks certificates "
        "refuses it; put a certificate in date there, then `kill -HUP` the daemon"
    )


def _server(cert: Path, key: Path, only: list[str] | None = None) -> ssl.SSLContext:
    """A server's context for the pair; ``only``: sending these certificates alone (a
    server sends its whole file, and a client checks the dates of all it is sent)."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    if only is None:
        server.load_cert_chain(certfile=cert, keyfile=key, password=no_passphrase)
        return server
    with tempfile.TemporaryDirectory() as folder:
        leaf = Path(folder, "leaf.pem")
        leaf.write_text("\n".join(only) + "\n")
        server.load_cert_chain(certfile=leaf, keyfile=key, password=no_passphrase)
    return server


def _dates(server: ssl.SSLContext, anchor: str) -> str | None:
    """Why a client trusting ``anchor`` alone refuses the server's chain for its dates
    (OpenSSL checks every certificate's up to the anchor, the anchor's too)."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    client.load_verify_locations(cadata=anchor)
    return _OUT_OF_DATE.get(_verify_code(server, client))


def _verify_code(server_side: ssl.SSLContext, client_side: ssl.SSLContext) -> int:
    """The client's verification error in a handshake with the server, 0 when none."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = server_side.wrap_bio(to_server, to_client, server_side=True)
    client = client_side.wrap_bio(to_client, to_server)
    for _ in range(_TURNS):
        for side in (client, server):
            try:
                side.do_handshake()
            except ssl.SSLCertVerificationError as exc:
                return int(exc.verify_code)
            except (ssl.SSLWantReadError, ssl.SSLError):
                pass
    return 0


_CRL = re.compile(rb"-----BEGIN X509 CRL-----(.+?)-----END X509 CRL-----", re.DOTALL)
_COMMON_NAME = b"\x06\x03\x55\x04\x03"  # the OID 2.5.4.3 (CN), DER-encoded
_TIMES = {0x17: "%y%m%d%H%M%SZ", 0x18: "%Y%m%d%H%M%SZ"}  # UTCTime, GeneralizedTime


def warn_crl_out_of_date(client_ca: Path) -> None:
    """The warning, at start and at each reload, for a CRL there past its nextUpdate."""
    dated = crl_out_of_date(client_ca, datetime.now(UTC))
    if dated:
        get_logger("reconcile").warning("TLS client CRL out of date", detail=dated)


def crl_out_of_date(client_ca: Path, now: datetime) -> str | None:
    """The warning for a CRL in ``client_ca`` past its nextUpdate at ``now`` (the first such);
    None when each is in date, or none is there (or cannot be read: the load says why)."""
    try:
        blocks = _CRL.findall(client_ca.read_bytes())
    except OSError:
        return None
    for block in blocks:
        try:
            issuer, due = _issuer_and_due(base64.b64decode(block))
        except (binascii.Error, IndexError, ValueError):  # UnicodeError is a ValueError
            continue
        if due is not None and due <= now:
            return (
                f"--tls-client-ca {client_ca}: the CRL of {issuer} expired at "
                f"{due:%Y-%m-%d %H:%M:%S} UTC (its nextUpdate): every client certificate of "
                "that CA is refused until a CRL in date is put there (openssl ca -gencrl), "
                "then `kill -HUP` the daemon"
            )
    return None


def _issuer_and_due(der: bytes) -> tuple[str, datetime | None]:
    """A CRL's issuer (its CN, else "its CA") and nextUpdate (None: it gives none).
    CertificateList ::= SEQUENCE { tbsCertList SEQUENCE { version INTEGER OPTIONAL,
    signature AlgorithmIdentifier, issuer Name, thisUpdate Time, nextUpdate Time OPTIONAL,
    ... }, ... }"""
    _, certificate_list, _ = _tlv(der, 0)
    _, tbs, _ = _tlv(certificate_list, 0)
    fields = _children(tbs)
    if fields[0][0] == 0x02:  # the version, present in a v2 CRL
        fields = fields[1:]
    issuer = _common_name(fields[1][1])
    due = fields[3] if len(fields) > 3 and fields[3][0] in _TIMES else None
    when = None if due is None else datetime.strptime(due[1].decode("ascii"), _TIMES[due[0]])
    return issuer, None if when is None else when.replace(tzinfo=UTC)


def _common_name(name: bytes) -> str:
    at = name.find(_COMMON_NAME)
    if at < 0:
        return "its CA"
    _, value, _ = _tlv(name, at + len(_COMMON_NAME))
    return repr(value.decode("utf-8", errors="replace"))


def _children(value: bytes) -> list[tuple[int, bytes]]:
    out, at = [], 0
    while at < len(value):
        tag, inner, at = _tlv(value, at)
        out.append((tag, inner))
    return out


def _tlv(data: bytes, at: int) -> tuple[int, bytes, int]:
    """The DER element at ``at``: its tag, its value, and where the next one begins."""
    tag, length, at = data[at], data[at + 1], at + 2
    if length & 0x80:  # the long form: the length in the next (length & 0x7f) bytes
        size = length & 0x7F
        length, at = int.from_bytes(data[at : at + size], "big"), at + size
    if at + length > len(data):
        raise ValueError("a DER element longer than what holds it")
    return tag, data[at : at + length], at + length
