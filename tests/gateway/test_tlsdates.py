"""`tlsdates.out_of_date` on real `openssl` chains: the leaf's dates, and those of an
intermediate the certificate file sends with it (it looked at the first certificate
only, so an expired intermediate, which every client refuses, was served unsaid)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from controller.gateway.lifecycle.tlsdates import out_of_date


def _openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


def _signed(folder: Path, name: str, issuer: str, days: int, *, ca: bool) -> None:
    """``name``.pem/.key: a certificate ``issuer`` signed, valid ``days`` from now
    (negative: expired that long ago)."""
    _openssl(folder, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")  # fmt: skip
    ext = folder / f"{name}.ext"
    ext.write_text(
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign\n"
        if ca
        else "subjectAltName=DNS:localhost\n"
    )
    _openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.pem",
             "-CAkey", f"{issuer}.key", "-set_serial", "7", "-days", str(days),
             "-extfile", ext.name, "-out", f"{name}.pem")  # fmt: skip


def _chain(folder: Path, intermediate_days: int, leaf_days: int = 2) -> tuple[Path, Path]:
    """A leaf valid ``leaf_days``, signed by an intermediate valid ``intermediate_days``,
    signed by a root; the file sends the leaf and the intermediate, as a CA's bundle does."""
    _openssl(folder, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", "root.key", "-out", "root.pem", "-days", "2",
             "-subj", "/CN=root")  # fmt: skip
    _signed(folder, "mid", "root", intermediate_days, ca=True)
    _signed(folder, "leaf", "mid", leaf_days, ca=False)
    bundle = folder / "bundle.pem"
    bundle.write_text((folder / "leaf.pem").read_text() + (folder / "mid.pem").read_text())
    return bundle, folder / "leaf.key"


def test_an_expired_intermediate_sent_with_the_certificate_is_said(tmp_path: Path) -> None:
    bundle, key = _chain(tmp_path, intermediate_days=-1)
    said = out_of_date(bundle, key)
    assert said is not None and "a certificate of its chain has expired" in said, said


def test_a_chain_in_date_is_said_nothing(tmp_path: Path) -> None:
    bundle, key = _chain(tmp_path, intermediate_days=2)
    assert out_of_date(bundle, key) is None


def test_an_expired_leaf_sent_with_its_chain_is_said_as_the_certificate(tmp_path: Path) -> None:
    bundle, key = _chain(tmp_path, intermediate_days=2, leaf_days=-1)
    said = out_of_date(bundle, key)
    assert said is not None and ": the certificate has expired:" in said, said
