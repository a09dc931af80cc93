"""Whether the gateway's certificate is in date: an expired one (or one not valid yet)
loads and serves like any other, and every client that checks certificates refuses it,
so the daemon's start and each SIGHUP reload warn about it (nginx says nothing either:
its users find out from their clients).

Python's ``ssl`` reads no certificate's dates without a private helper, so OpenSSL is
asked the way a client would find out: a handshake in memory between the certificate and
a client that trusts that certificate alone (``VERIFY_X509_PARTIAL_CHAIN``, no hostname
check). Only its dates can then fail the verification; any other failure is not ours to
report here.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path

# OpenSSL's X509_V_ERR_CERT_NOT_YET_VALID and X509_V_ERR_CERT_HAS_EXPIRED
_OUT_OF_DATE = {9: "is not valid yet (its notBefore is in the future)", 10: "has expired"}
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.DOTALL)
_TURNS = 8  # a TLS 1.3 handshake settles in 2 round trips; this many is plenty


def out_of_date(cert: Path, key: Path) -> str | None:
    """The warning for ``cert`` (a pair already checked) when clients refuse it for its
    dates; None when it is in date (or cannot be looked at: the pair's check says why)."""
    try:
        leaf = _PEM.search(cert.read_text(encoding="ascii", errors="replace"))
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(certfile=cert, keyfile=key)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False
        client.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        client.load_verify_locations(cadata=leaf.group(0) if leaf else "")
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return None
    why = _OUT_OF_DATE.get(_verify_code(server, client))
    if why is None:
        return None
    return (
        f"--tls-cert {cert}: the certificate {why}: every client that checks certificates "
        "refuses it; put a certificate in date there, then `kill -HUP` the daemon"
    )


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
