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
"""

from __future__ import annotations

import re
import ssl
import tempfile
from pathlib import Path

from controller.gateway.lifecycle.tls import no_passphrase

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
