"""Revoking a client certificate: a CRL in ``--tls-client-ca``'s file beside its CA (as
nginx's ``ssl_crl``), made with ``openssl ca`` (``-revoke``, ``-gencrl``), a real daemon,
gateway process and engine. A certificate it lists is refused, another of the CA served;
a CRL past its nextUpdate refuses every certificate of its CA, and the log says which."""

from __future__ import annotations

import signal
import ssl
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from controller.gateway.lifecycle.tlsdates import crl_out_of_date
from tests.gateway.test_tls import WAIT, Pki, _admitted, _chat, _https, _pair, _tls_gateway

_CONFIG = """[ca]
default_ca = test
[test]
database = index.txt
crlnumber = crlnumber
default_md = sha256
default_crl_days = 2
"""


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    folder = tmp_path / "pki"
    folder.mkdir()
    made = Pki(folder)
    made.make_ca()
    (folder / "ca.cnf").write_text(_CONFIG)
    (folder / "index.txt").write_text("")
    (folder / "crlnumber").write_text("01\n")
    return made


def _ca(pki: Pki, *args: str | Path) -> None:
    """``openssl ca`` with the test CA's database and key."""
    subprocess.run(
        ["openssl", "ca", "-batch", "-config", "ca.cnf", "-keyfile", "ca.key", "-cert", "ca.pem",
         *map(str, args)],
        cwd=pki.folder, check=True, capture_output=True,
    )  # fmt: skip


def _client(pki: Pki, serial: int) -> tuple[ssl.SSLContext, Path]:
    """A client holding a certificate of the CA with ``serial``, and that certificate."""
    cert, key = pki.folder / f"client-{serial}.pem", pki.folder / f"client-{serial}.key"
    pki.server(serial, cert, key, usage="clientAuth")
    ctx = pki.client()
    ctx.load_cert_chain(cert, key)
    return ctx, cert


def _trusted(pki: Pki, *dates: str) -> bytes:
    """The CA and a CRL of it as one PEM file (``dates``: the CRL's own, else in date)."""
    _ca(pki, "-gencrl", "-out", "crl.pem", *dates)
    return pki.ca.read_bytes() + (pki.folder / "crl.pem").read_bytes()


def _stamp(at: datetime) -> str:
    return at.strftime("%Y%m%d%H%M%SZ")


def test_a_crl_past_its_next_update_is_found_in_the_file(pki: Pki) -> None:
    """The load warns of it as of a certificate out of date: OpenSSL loads it, and then
    refuses every client of its CA."""
    now = datetime.now(UTC)
    trusted = pki.folder / "client-cas.pem"
    trusted.write_bytes(_trusted(pki))
    assert crl_out_of_date(trusted, now) is None
    assert crl_out_of_date(trusted, now + timedelta(days=3)) is not None  # its 2 days past
    old = (pki.folder / "crl.pem").read_bytes()
    dates = ("-crl_lastupdate", _stamp(now - timedelta(days=2)),
             "-crl_nextupdate", _stamp(now - timedelta(days=1)))  # fmt: skip
    trusted.write_bytes(_trusted(pki, *dates) + old)  # the expired one first: any is said
    said = crl_out_of_date(trusted, now)
    due = f"{now - timedelta(days=1):%Y-%m-%d %H:%M:%S} UTC (its nextUpdate)"
    assert said == (
        f"--tls-client-ca {trusted}: the CRL of 'reconcile test CA' expired at {due}: every "
        "client certificate of that CA is refused until a CRL in date is put there (openssl "
        "ca -gencrl), then `kill -HUP` the daemon"
    )
    trusted.write_bytes(pki.ca.read_bytes())  # no CRL
    assert crl_out_of_date(trusted, now) is None
    trusted.write_bytes(b"-----BEGIN X509 CRL-----\nMAUCAQ==\n-----END X509 CRL-----\n")
    assert crl_out_of_date(trusted, now) is None, "not a CRL: the load says so, not this"


def test_a_revoked_client_is_refused_and_an_expired_crl_refuses_all(
    reconcile: Any, gateway: Any, pki: Pki
) -> None:
    cert, key = _pair(pki)
    good, _ = _client(pki, 21)
    revoked, revoked_cert = _client(pki, 22)
    _ca(pki, "-revoke", revoked_cert)
    trusted = pki.folder / "client-cas.pem"
    trusted.write_bytes(_trusted(pki))
    g = _tls_gateway(reconcile, gateway, pki, cert, key, "--tls-client-ca", str(trusted),
                     client=good)  # fmt: skip
    try:
        status, body, _ = _https(g.port, good, "POST", "/v1/chat/completions", _chat("alpha"))
        assert status == 200, body
        assert not _admitted(g.port, revoked), "the revoked certificate is refused"
        said = "TLS handshake refused: the client's certificate is revoked (a CRL in"
        reconcile.wait_for(lambda: said in g.text(), timeout=WAIT, what="the revocation said")
        # The CRL past its nextUpdate (its issuer's cron stopped): nginx refuses every
        # certificate of that CA, and so does the gateway, saying why.
        now = datetime.now(UTC)
        dates = ("-crl_lastupdate", _stamp(now - timedelta(days=2)),
                 "-crl_nextupdate", _stamp(now - timedelta(days=1)))  # fmt: skip
        trusted.write_bytes(_trusted(pki, *dates))
        g.proc.send_signal(signal.SIGHUP)
        reconcile.wait_for(lambda: not _admitted(g.port, good), timeout=WAIT, what="refused")
        expired = "the CRL of the client's CA in --tls-client-ca's file has expired"
        reconcile.wait_for(lambda: expired in g.text(), timeout=WAIT, what="the expiry said")
        # ...and by the reload itself, whether a client comes or not: which CRL, since when
        # (the reload's thread says it once the new context is in force on the loop, so a
        # client's refusal there may be logged first: a CI run saw it so)
        reloaded = f"--tls-client-ca {trusted}: the CRL of 'reconcile test CA' expired at "
        reconcile.wait_for(
            lambda: reloaded in g.text() and "TLS client CRL out of date" in g.text(),
            timeout=WAIT,
            what="the reload's CRL warning",
        )
        # A CRL in date again: served again.
        trusted.write_bytes(_trusted(pki))
        g.proc.send_signal(signal.SIGHUP)
        reconcile.wait_for(lambda: _admitted(g.port, good), timeout=WAIT, what="served again")
        assert not _admitted(g.port, revoked)
        assert "Traceback" not in g.text()
    finally:
        g.finish()
