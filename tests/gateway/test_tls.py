"""The gateway over TLS (issue 39): certificates made here with ``openssl`` (a CA, server
certificates for 127.0.0.1 and localhost), a real daemon, gateway process and engine.

- the official ``openai`` client, trusting the CA, gets a chat completion; the page
  answers over HTTPS and ``reconcile ui`` prints the https URL;
- plain HTTP to the TLS port gets a 400 saying so (as nginx answers); a TLS 1.1 client
  is refused; each refused client reads the alert that says why (protocol version,
  handshake failure, certificate required), not an unexpected EOF;
- a key file readable by others, a missing half of the pair, or a key of another
  certificate is refused before the daemon starts (exit 64, naming the file);
- SIGHUP under load: the new certificate is served to new connections (its serial),
  no request failed; a renewal of another key type (ECDSA to RSA and back) is
  served too, and so is one renewed before a daemon restart (the gateway adopted
  re-reads it); an expired certificate is warned about at start and at reload; a
  hand-over (``reconcile gateway restart``) under load over TLS: no request failed, and
  the successor speaks TLS; a client CA taken out of ``--tls-client-ca``'s file is no
  longer trusted after a SIGHUP.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest

from controller.gateway.lifecycle import registry, tls

WAIT = 40.0
KEY = "sk-Qz7WvKpLmRtYuXnJhGd3"  # no hex, no word (see test_keys.py)


# -- certificates ---------------------------------------------------------------------------


def _openssl(*args: str | Path, cwd: Path) -> None:
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


@dataclass
class Pki:
    """A CA of the test's own and the server pairs it signed."""

    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    def make_ca(self) -> None:
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=reconcile test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            cwd=self.folder,
        )  # fmt: skip

    def server(
        self,
        serial: int,
        cert: Path,
        key: Path,
        usage: str = "serverAuth",
        rsa: bool = False,
        days: int = 2,
    ) -> None:
        """A server pair for 127.0.0.1 and localhost with ``serial``, at cert and key (0600);
        ``usage="clientAuth"``: a client's; ``rsa``: an RSA key (else ECDSA P-256);
        ``days=-1``: expired a day before it was made."""
        ext = self.folder / "server.ext"
        ext.write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
            f"extendedKeyUsage={usage}\nkeyUsage=digitalSignature\n"
            "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
        )
        fresh_key = self.folder / f"fresh-{serial}.key"
        kind = ["rsa:2048"] if rsa else ["ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
        _openssl(
            "req", "-newkey", *kind, "-nodes",
            "-keyout", fresh_key, "-out", "server.csr", "-subj", "/CN=localhost",
            cwd=self.folder,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-set_serial", str(serial), "-days", str(days), "-extfile", ext,
            "-out", f"fresh-{serial}.pem",
            cwd=self.folder,
        )  # fmt: skip
        os.chmod(fresh_key, 0o600)
        # Each file replaced whole (rename): a reload never reads half of one.
        os.replace(self.folder / f"fresh-{serial}.pem", cert)
        os.replace(fresh_key, key)

    def client(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca)


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    folder = tmp_path / "pki"
    folder.mkdir()
    made = Pki(folder)
    made.make_ca()
    return made


def _pair(pki: Pki, serial: int = 1) -> tuple[Path, Path]:
    cert, key = pki.folder / "cert.pem", pki.folder / "key.pem"
    pki.server(serial, cert, key)
    return cert, key


# -- clients --------------------------------------------------------------------------------


def _https(
    port: int, ctx: ssl.SSLContext, method: str, path: str, body: Any = None
) -> tuple[int, bytes, int]:
    """One request on a new connection: status, body and the server certificate's serial."""
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=WAIT, context=ctx)
    try:
        conn.connect()  # the certificate is read now: an answer that says close drops sock
        assert isinstance(conn.sock, ssl.SSLSocket)
        cert = conn.sock.getpeercert()
        assert cert is not None
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"x-api-key": KEY})
        resp = conn.getresponse()
        return resp.status, resp.read(), int(str(cert["serialNumber"]), 16)
    finally:
        conn.close()


def _chat(model: str, word: str = "hi", stream: bool = False) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": word}], "stream": stream}


@dataclass
class Loop:
    """A client over HTTPS, a new connection (a new handshake) per request."""

    port: int
    ctx: ssl.SSLContext
    stream: bool
    ok: int = 0
    serials: set[int] = field(default_factory=set)
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                status, body, serial = _https(
                    self.port,
                    self.ctx,
                    "POST",
                    "/v1/chat/completions",
                    _chat("alpha", stream=self.stream),
                )
            except (OSError, http.client.HTTPException) as exc:
                self.failed.append(repr(exc))
                continue
            if status != 200 or (self.stream and b"data: [DONE]" not in body):
                self.failed.append(f"{status} {body[-200:]!r}")
            else:
                self.ok += 1
                self.serials.add(serial)


class Load:
    def __init__(self, port: int, ctx: ssl.SSLContext, n: int) -> None:
        self.loops = [Loop(port, ctx, i % 2 == 0) for i in range(n)]
        self.threads = [threading.Thread(target=lp.run, daemon=True) for lp in self.loops]

    @property
    def ok(self) -> int:
        return sum(lp.ok for lp in self.loops)

    def more(self, rc: Any, n: int, what: str) -> None:
        target = self.ok + n
        rc.wait_for(lambda: self.ok >= target, timeout=WAIT, what=what)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for lp in self.loops:
            lp.stop.set()
        for t in self.threads:
            t.join(timeout=WAIT)

    def check(self) -> None:
        failed = [f for lp in self.loops for f in lp.failed]
        assert failed == [], f"{len(failed)} failed: {failed[:5]}"
        assert self.ok > 0


# -- the gateway ----------------------------------------------------------------------------


def _keyfile(rc: Any) -> Path:
    path = rc.tmp / "keys.txt"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    return path


def _tls_gateway(
    rc: Any,
    gateway: Any,
    pki: Pki,
    cert: Path,
    key: Path,
    *extra: str,
    client: ssl.SSLContext | None = None,
    prefix: list[str] | None = None,
) -> Any:
    """The daemon with --listen over TLS, once /healthz answers over HTTPS (``prefix``:
    the gateway fixture's, a wrapper that execs the daemon)."""
    rc.write("alpha", command=rc.demo_command(chunks="3", chunk_delay="0.01"))
    flags = ["--tls-cert", str(cert), "--tls-key", str(key), "--api-keys", str(_keyfile(rc))]
    g = gateway(*flags, *extra, wait=False, prefix=prefix or [])
    ctx = client or pki.client()

    def up() -> bool:
        if g.proc.poll() is not None:
            raise AssertionError(f"daemon exited {g.proc.returncode}:\n{g.text()[-3000:]}")
        try:
            return _https(g.port, ctx, "GET", "/healthz")[0] == 200
        except OSError:
            return False

    rc.wait_for(up, timeout=WAIT, what="gateway /healthz over HTTPS")
    g.wait_phase("alpha", "Ready")
    return g


def test_openai_client_page_ui_url_and_refusals_over_tls(
    reconcile: Any, gateway: Any, pki: Pki
) -> None:
    cert, key = _pair(pki)
    g = _tls_gateway(reconcile, gateway, pki, cert, key)
    try:
        client = openai.OpenAI(
            base_url=f"https://localhost:{g.port}/v1",
            api_key=KEY,
            http_client=httpx2.Client(verify=pki.client()),
            max_retries=0,
        )
        answer = client.chat.completions.create(
            model="alpha", messages=[{"role": "user", "content": "hello"}]
        )
        assert answer.choices[0].message.content, answer
        assert answer.usage is not None and answer.usage.total_tokens > 0
        client.close()
        # The page and its data, with a key, over HTTPS.
        url = reconcile("ui").out.strip()
        assert url == f"https://127.0.0.1:{g.port}/ui", url
        status, body, _ = _https(g.port, pki.client(), "GET", "/ui")
        assert status == 200 and b"<html" in body.lower(), body[:300]
        status, body, _ = _https(g.port, pki.client(), "GET", "/ui/api/state")
        assert status == 200, body[:300]
        # Over HTTPS the page tells the browser to come back over it only (HSTS).
        conn = http.client.HTTPSConnection("127.0.0.1", g.port, timeout=WAIT, context=pki.client())
        try:
            conn.request("GET", "/ui")
            page = conn.getresponse()
            page.read()
        finally:
            conn.close()
        hsts = page.getheader("Strict-Transport-Security")
        assert hsts == "max-age=31536000", page.getheaders()
        assert '"tls": true' in g.text()  # the gateway's own lines go to the daemon's stderr
        _plain_http_and_tls_1_1_are_refused(g, pki, cert, key)
    finally:
        g.finish()


def _plain_http_and_tls_1_1_are_refused(g: Any, pki: Pki, cert: Path, key: Path) -> None:
    """On the gateway of the test above (these only read: a daemon, gateway and engine
    of their own cost a start and a stop, ~4 s under load)."""
    # Plain HTTP gets a 400 that says so (nginx's and Go's answer), with or without
    # a body, then the close; the TLS server is not disturbed by it.
    for method, sent in (("GET", None), ("POST", json.dumps(_chat("echo")).encode() * 50)):
        plain = http.client.HTTPConnection("127.0.0.1", g.port, timeout=WAIT)
        try:
            plain.request(method, "/v1/chat/completions", body=sent)
            answer = plain.getresponse()
            said = json.loads(answer.read())
        finally:
            plain.close()
        assert answer.status == 400 and answer.getheader("Connection") == "close"
        assert said["error"]["code"] == "plain_http_to_https_port", said
        assert "https://" in said["error"]["message"], said
    with socket.create_connection(("127.0.0.1", g.port), timeout=WAIT):
        pass  # a client that connects and says nothing
    old = _tls_1_1_client(pki)
    with (
        socket.create_connection(("127.0.0.1", g.port), timeout=WAIT) as raw,
        pytest.raises(ssl.SSLError) as refused,
    ):
        old.wrap_socket(raw, server_hostname="localhost")
    # Refused by the gateway with its alert (tlsalerts.py), not by the client: the same
    # client completes its handshake with a server that allows 1.1.
    assert "PROTOCOL_VERSION" in str(refused.value), refused.value
    assert _lenient_handshake(old, cert, key) == "TLSv1.1"
    # The gateway serves on.
    assert _https(g.port, pki.client(), "GET", "/healthz")[0] == 200


@pytest.mark.parametrize("rsa", [False, True], ids=["ecdsa", "rsa"])
def test_tls_1_2_offers_no_cbc_suite(pki: Pki, rsa: bool) -> None:
    """The server context took Python's default suites, which beside the AEAD ones offer
    TLS 1.2's CBC ones (``ECDHE-ECDSA-AES128-SHA256``...: Lucky13; testssl and SSL Labs
    flag them, Mozilla's "intermediate" has none): a client that offers CBC alone was
    served (checked with ``openssl s_client -tls1_2 -cipher``). It is refused, and the
    AES-GCM and ChaCha20 suites of either key type are served."""
    cert, key = pki.folder / "cert.pem", pki.folder / "key.pem"
    pki.server(1, cert, key, rsa=rsa)
    server = tls.server_context(cert, key)
    cbc = "ECDHE+AES+SHA256:ECDHE+AES+SHA384:!AESGCM"
    for suites, served in ((cbc, False), ("ECDHE+AESGCM", True), ("ECDHE+CHACHA20", True)):
        client = pki.client()
        client.maximum_version = ssl.TLSVersion.TLSv1_2  # 1.3's suites are all AEAD
        client.set_ciphers(suites)
        got = _handshake(server, client)
        assert (got is not None) == served, (suites, got)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str | None:
    """The suite ``client`` and ``server`` agree on over a real connection, or None."""
    with _served_once(server) as port:
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=WAIT) as raw,
                client.wrap_socket(raw, server_hostname="localhost") as done,
            ):
                agreed = done.cipher()
        except ssl.SSLError:
            agreed = None
    return None if agreed is None else agreed[0]


@contextlib.contextmanager
def _served_once(server: ssl.SSLContext) -> Iterator[int]:
    """A port on which ``server`` takes one connection's handshake (in a thread), whatever
    becomes of it, until the end."""
    with socket.create_server(("127.0.0.1", 0)) as listening:

        def serve() -> None:
            conn, _ = listening.accept()
            with contextlib.suppress(OSError), server.wrap_socket(conn, server_side=True):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            yield listening.getsockname()[1]
        finally:
            thread.join(timeout=WAIT)


def _tls_1_1_client(pki: Pki) -> ssl.SSLContext:
    """A client that offers TLS 1.1 alone (its own security level lowered so that it
    would): the server's refusal is what the test sees."""
    old = pki.client()
    with warnings.catch_warnings():  # the version is deprecated: that is the point
        warnings.simplefilter("ignore", DeprecationWarning)
        old.minimum_version = ssl.TLSVersion.TLSv1_1
        old.maximum_version = ssl.TLSVersion.TLSv1_1
    old.set_ciphers("DEFAULT:@SECLEVEL=0")
    return old


def _lenient_handshake(client: ssl.SSLContext, cert: Path, key: Path) -> str | None:
    """The version ``client`` gets from a server of the pair that allows TLS 1.1."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        server.minimum_version = ssl.TLSVersion.TLSv1_1
    server.set_ciphers("DEFAULT:@SECLEVEL=0")
    server.load_cert_chain(cert, key)
    with (
        _served_once(server) as port,
        socket.create_connection(("127.0.0.1", port), timeout=WAIT) as raw,
        client.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        version = tls.version()
    return version


def test_bad_pairs_are_refused_before_the_daemon_starts(
    reconcile: Any, gateway: Any, pki: Pki
) -> None:
    cert, key = _pair(pki)
    key.chmod(0o644)
    g = gateway("--tls-cert", str(cert), "--tls-key", str(key), wait=False)
    assert g.proc.wait(timeout=WAIT) == 64, g.text()
    assert f"--tls-key {key} has mode 0644" in g.text() and f"chmod 600 {key}" in g.text()
    key.chmod(0o600)
    g = gateway("--tls-cert", str(cert), wait=False)
    assert g.proc.wait(timeout=WAIT) == 64, g.text()
    assert "--tls-cert without --tls-key" in g.text()
    other = pki.folder / "other.pem"
    pki.server(7, other, pki.folder / "other.key")  # a certificate of another key
    g = gateway("--tls-cert", str(other), "--tls-key", str(key), wait=False)
    assert g.proc.wait(timeout=WAIT) == 64, g.text()
    assert f"--tls-key {key} is not the private key of --tls-cert {other}" in g.text()
    assert "Traceback" not in g.text()
    assert registry.current_live(reconcile.state) is None


def test_an_encrypted_key_is_refused_without_asking_for_its_passphrase(
    reconcile: Any, pki: Pki
) -> None:
    """A key with a passphrase, the daemon started from a terminal: exit 64 saying so.
    (OpenSSL asked for the passphrase on the terminal: the start hung on a prompt, and
    a reload wrote it into the gateway's log and logged "cannot read: Invalid argument".)"""
    cert, key = _pair(pki)
    locked = pki.folder / "locked.key"
    _openssl(
        "pkey", "-in", key, "-aes256", "-passout", "pass:hunter2", "-out", locked, cwd=pki.folder
    )
    locked.chmod(0o600)
    terminal, tty = os.openpty()  # its stdin a terminal, as in a shell
    try:
        argv = reconcile.argv("--listen", str(reconcile.port + 15))
        argv += ["--tls-cert", str(cert), "--tls-key", str(locked)]
        proc = reconcile.spawn(argv, stdin=tty, stderr=subprocess.PIPE, start_new_session=True)
        _, err = proc.communicate(timeout=WAIT)
    finally:
        os.close(tty)
        os.close(terminal)
    text = err.decode()
    assert proc.returncode == 64, text
    assert f"--tls-key {locked} is encrypted (it asks for a passphrase)" in text
    assert f"openssl pkey -in {locked} -out FILE" in text
    assert "pass phrase" not in text and "Traceback" not in text


@pytest.mark.parametrize(
    ("cert_name", "key_name", "said"),
    [
        pytest.param("cert.pem", "rsa.key", "is not the private key of", id="key-of-another-type"),
        pytest.param("key.pem", "key.pem", "holds no PEM certificate", id="key-as-certificate"),
        pytest.param("cert.pem", "cert.pem", "is not a PEM private key", id="cert-as-key"),
        pytest.param(".", "key.pem", "is not a file", id="folder-as-certificate"),
    ],
)
def test_a_bad_pair_names_the_file_at_fault(
    pki: Pki, cert_name: str, key_name: str, said: str
) -> None:
    """OpenSSL says "PEM lib" for either file and NO_CERTIFICATE_ASSIGNED for a key of
    another type; the error names the file at fault and what it should be."""
    _pair(pki)
    pki.server(2, pki.folder / "rsa.pem", pki.folder / "rsa.key", rsa=True)
    cert, key = pki.folder / cert_name, pki.folder / key_name
    key.chmod(0o600)
    with pytest.raises(tls.TlsError) as caught:
        tls.server_context(cert, key)
    assert said in str(caught.value)
    assert "PEM lib" not in str(caught.value)
    # The good pair still loads, with no passphrase asked of it.
    assert tls.server_context(pki.folder / "cert.pem", pki.folder / "key.pem")


def test_node_yaml_and_environment_forms(reconcile: Any, gateway: Any, pki: Pki) -> None:
    """node.yaml's tlsCert/tlsKey (relative to its folder), RECONCILE_TLS_KEY over it."""
    _, key = _pair(pki)
    reconcile.state.mkdir(parents=True, exist_ok=True)
    node = pki.folder / "node.yaml"
    node.write_text("tlsCert: cert.pem\ntlsKey: missing.pem\n")
    env = {"RECONCILE_TLS_KEY": str(key)}
    g = gateway("--node-config", str(node), wait=False, env=env)
    ctx = pki.client()
    reconcile.wait_for(
        lambda: _alive_https(g, ctx), timeout=WAIT, what="gateway /healthz over HTTPS"
    )
    g.finish()


HEAD = "# the gateway's pair, below other settings\nlogMaxFiles: 2\n"  # lines 1 and 2


@pytest.mark.parametrize(
    ("text", "said"),
    [
        pytest.param(
            "tlsCert: cert.pem\n",
            "node.yaml:3: tlsCert without tlsKey: HTTPS needs both the certificate and its "
            "private key; give both or neither",
            id="half-a-pair",
        ),
        pytest.param(
            "tlsCert: none.pem\ntlsKey: key.pem\n",
            "node.yaml:3: tlsCert {folder}/none.pem: no such file",
            id="no-cert-file",
        ),
        pytest.param(
            "tlsCert: sub\ntlsKey: key.pem\n",
            "node.yaml:3: tlsCert {folder}/sub is not a file",
            id="cert-unreadable",
        ),
        pytest.param(
            "tlsCert: cert.pem\ntlsKey: missing.pem\n",
            "node.yaml:4: tlsKey {folder}/missing.pem: no such file",
            id="no-key-file",
        ),
        pytest.param(
            "tlsCert: cert.pem\ntlsKey: cert.pem\n",
            "node.yaml:4: tlsKey {folder}/cert.pem has mode 0644",
            id="key-mode",
        ),
        pytest.param(
            "tlsCert: cert.pem\ntlsKey: other-key.pem\n",
            "node.yaml:4: tlsKey {folder}/other-key.pem is not the private key of tlsCert "
            "{folder}/cert.pem",
            id="key-not-the-certs",
        ),
    ],
)
def test_a_pair_node_yaml_names_is_refused_naming_node_yaml_not_flags(
    reconcile: Any, pki: Pki, text: str, said: str
) -> None:
    """No flag named the pair: the refusal named `--tls-cert`/`--tls-key` all the same,
    flags the operator never gave, and node.yaml without the line. It names node.yaml's
    line and field, as the file's other errors do."""
    _pair(pki)
    pki.server(2, pki.folder / "other-cert.pem", pki.folder / "other-key.pem")
    (pki.folder / "sub").mkdir()
    (pki.folder / "cert.pem").chmod(0o644)
    node = pki.folder / "node.yaml"
    node.write_text(HEAD + text)
    refused = reconcile("--listen", str(reconcile.port + 15), "--node-config", str(node), check=64)
    assert refused.err.startswith(f"reconcile: {pki.folder}/"), refused
    assert said.format(folder=pki.folder) in refused.err, refused
    assert "--tls-" not in refused.err, refused


def test_an_expired_certificate_node_yaml_names_is_warned_about_at_its_line(
    reconcile: Any, gateway: Any, pki: Pki
) -> None:
    cert, key = pki.folder / "cert.pem", pki.folder / "key.pem"
    pki.server(1, cert, key, days=-1)
    node = pki.folder / "node.yaml"
    node.write_text(HEAD + "tlsCert: cert.pem\ntlsKey: key.pem\n")
    g = gateway("--node-config", str(node), wait=False)
    said = f"{node}:3: tlsCert {cert}: the certificate has expired: every client"
    try:
        reconcile.wait_for(lambda: said in g.text(), timeout=WAIT, what="the warning at start")
        assert "--tls-cert" not in g.text(), g.text()[-3000:]
        # It serves all the same (to a client that checks no dates): the daemon is up.
        lenient = ssl.create_default_context(cafile=pki.ca)
        lenient.check_hostname, lenient.verify_mode = False, ssl.CERT_NONE
        reconcile.wait_for(lambda: _healthz(g.port, lenient), timeout=WAIT, what="HTTPS")
    finally:
        g.finish()


def _healthz(port: int, ctx: ssl.SSLContext) -> bool:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=WAIT, context=ctx)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


def test_a_node_yaml_pair_the_gateway_refuses_at_sighup_is_named_as_node_yaml(
    reconcile: Any, gateway: Any, pki: Pki
) -> None:
    """The gateway's own re-read at SIGHUP (the paths unchanged, the key file made
    readable by others): its refusal, in `gateway status`, named `--tls-key`, a flag the
    daemon was never given; it names node.yaml's tlsKey."""
    _, key = _pair(pki)
    node = pki.folder / "node.yaml"
    node.write_text("tlsCert: cert.pem\ntlsKey: key.pem\n")
    g = gateway("--node-config", str(node), wait=False)
    try:
        reconcile.wait_for(lambda: _alive_https(g, pki.client()), timeout=WAIT, what="HTTPS")
        key.chmod(0o644)
        g.proc.send_signal(signal.SIGHUP)
        said = f"{node}:2: tlsKey {key} has mode 0644"

        def shown_now() -> str:
            out: str = reconcile("gateway", check=0).out
            return out if said in out else ""

        shown = reconcile.wait_for(shown_now, timeout=WAIT, what="the refusal shown")
        assert "reload refused (TLS pair" in shown and "--tls-" not in shown, shown
        key.chmod(0o600)
        # Half a pair: `gateway reload` refuses it at the line of the half that is there.
        node.write_text("tlsCert: cert.pem\n")
        half = reconcile("gateway", "reload", check=1)
        assert f"{node}:1: tlsCert and tlsKey go together" in half.err, half
    finally:
        g.finish()


def _alive_https(g: Any, ctx: ssl.SSLContext) -> bool:
    if g.proc.poll() is not None:
        raise AssertionError(f"daemon exited {g.proc.returncode}:\n{g.text()[-3000:]}")
    try:
        return _https(g.port, ctx, "GET", "/healthz")[0] == 200
    except OSError:
        return False


def test_sighup_reloads_the_certificate_under_load(reconcile: Any, gateway: Any, pki: Pki) -> None:
    cert, key = _pair(pki, serial=1)
    g = _tls_gateway(reconcile, gateway, pki, cert, key)
    try:
        with Load(g.port, pki.client(), 6) as load:
            load.more(reconcile, 16, "answers with the first certificate")
            pki.server(2, cert, key)
            g.proc.send_signal(signal.SIGHUP)  # the daemon forwards it to its gateway
            reconcile.wait_for(
                lambda: _https(g.port, pki.client(), "GET", "/healthz")[2] == 2,
                timeout=WAIT,
                what="the new certificate served",
            )
            load.more(reconcile, 16, "answers with the new certificate")
        load.check()
        assert {s for lp in load.loops for s in lp.serials} == {1, 2}
        # A bad pair on SIGHUP keeps the one in force.
        key.write_text("not a key\n")
        g.proc.send_signal(signal.SIGHUP)
        reconcile.wait_for(
            lambda: "TLS certificate not reloaded" in g.text(), timeout=WAIT, what="refusal"
        )
        assert _https(g.port, pki.client(), "GET", "/healthz")[2] == 2
        # ... and says so where the operator looks (once the log alone did), until the
        # pair is fixed and reloaded.
        said = f"reload refused (TLS pair, by gateway pid {g.serving().ref.pid})"
        shown = reconcile.wait_for(
            lambda: _showing(reconcile, said), timeout=WAIT, what="the refusal shown"
        )
        assert str(key) in shown and "keeps the certificate in force" in shown, shown
        pki.server(3, cert, key)
        g.proc.send_signal(signal.SIGHUP)
        reconcile.wait_for(
            lambda: "reload refused" not in reconcile("gateway", "status", check=0).out,
            timeout=WAIT,
            what="the refusal cleared",
        )
        assert _serial(g.port, pki) == 3
        _sighup_serves_a_renewal_of_another_key_type(g, reconcile, pki, cert, key, 3)
    finally:
        g.finish()


def _showing(reconcile: Any, said: str) -> str:
    """`reconcile gateway status`'s words once they hold ``said`` ("" before)."""
    shown: str = reconcile("gateway", "status", check=0).out
    return shown if said in shown else ""


def _serial(port: int, pki: Pki) -> int:
    """The serial of the certificate a new connection is served (0: none, not yet)."""
    try:
        return _https(port, pki.client(), "GET", "/healthz")[2]
    except OSError:  # not listening yet, or a certificate the client refuses
        return 0


def _sighup_serves_a_renewal_of_another_key_type(
    g: Any, reconcile: Any, pki: Pki, cert: Path, key: Path, serving: int
) -> None:
    """An ECDSA certificate (serial ``serving``) renewed as RSA, then as ECDSA again: each
    SIGHUP serves the new one. (Loaded into the live context, the new pair sat beside the
    old one of the other key type, and clients that prefer ECDSA kept getting the old
    certificate while the log said "TLS certificate reloaded".) On the gateway of
    test_sighup_reloads_the_certificate_under_load (a daemon, gateway and engine of its
    own cost a start and a stop, ~4 s under load)."""
    for serial, rsa in ((serving + 1, True), (serving + 2, False)):
        pki.server(serial, cert, key, rsa=rsa)
        g.proc.send_signal(signal.SIGHUP)  # the daemon forwards it to its gateway
        reconcile.wait_for(
            lambda serial=serial: _serial(g.port, pki) == serial,
            timeout=WAIT,
            what=f"certificate {serial} served",
        )


def test_a_restarted_daemon_has_the_gateway_it_adopts_serve_the_renewed_certificate(
    reconcile: Any, gateway: Any, pki: Pki
) -> None:
    """Renewed on disk, then the daemon restarted instead of sent SIGHUP: the gateway it
    adopts serves the new certificate (it kept the old one, expired or not)."""
    cert, key = _pair(pki, serial=1)
    g = _tls_gateway(reconcile, gateway, pki, cert, key)
    serving = g.serving().ref.pid
    assert g.stop() == 0  # the daemon ends; its gateway serves on
    pki.server(2, cert, key)
    flags = ["--tls-cert", str(cert), "--tls-key", str(key), "--api-keys", str(_keyfile(reconcile))]
    g = gateway(*flags, wait=False)
    try:
        reconcile.wait_for(lambda: _serial(g.port, pki) == 2, timeout=WAIT, what="serial 2")
        # The daemon signals the gateway, then logs: serial 2 may be served before the line.
        reconcile.wait_for(lambda: "gateway adopted" in g.text(), what="the gateway adopted")
        assert g.serving().ref.pid == serving
    finally:
        g.finish()


def test_a_certificate_out_of_date_is_warned_about(reconcile: Any, gateway: Any, pki: Pki) -> None:
    """An expired certificate loads and serves like any other, and every client refuses
    it: the daemon's start says so, and so does a SIGHUP that reloads one (it said
    "TLS certificate reloaded" and nothing more); one in date brings no warning."""
    cert, key = pki.folder / "cert.pem", pki.folder / "key.pem"
    pki.server(1, cert, key, days=-1)
    reconcile.write("alpha", command=reconcile.demo_command())
    flags = ["--tls-cert", str(cert), "--tls-key", str(key), "--api-keys", str(_keyfile(reconcile))]
    g = gateway(*flags, wait=False)
    said = f"--tls-cert {cert}: the certificate has expired: every client"
    try:
        reconcile.wait_for(lambda: said in g.text(), timeout=WAIT, what="the warning at start")
        pki.server(2, cert, key)
        g.proc.send_signal(signal.SIGHUP)
        reconcile.wait_for(lambda: _serial(g.port, pki) == 2, timeout=WAIT, what="serial 2")
        assert g.text().count(said) == 1, g.text()[-3000:]
        pki.server(3, cert, key, days=-1)
        g.proc.send_signal(signal.SIGHUP)
        # At least once more: a reload a restart or an adoption adds (each re-reads the
        # pair) may say it again between two looks; the log's end names a wait that ends.
        try:
            reconcile.wait_for(lambda: g.text().count(said) >= 2, timeout=WAIT, what="reload")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: no warning at reload\n{g.text()[-4000:]}") from None
        assert "TLS certificate out of date" in g.text()
    finally:
        g.finish()


def test_sighup_serves_the_pair_node_yaml_names_now(reconcile: Any, gateway: Any, pki: Pki) -> None:
    """node.yaml's tlsCert/tlsKey pointed at another pair, then SIGHUP: a new gateway with
    it takes the port over under load (no request failed). The gateway once re-read the
    old paths and logged "TLS certificate reloaded" for them, serving the old pair until
    a daemon restart. A pair the checks refuse is said; the gateway serves on as it was."""
    for name, serial in (("a", 1), ("b", 2)):
        (pki.folder / name).mkdir()
        pki.server(serial, pki.folder / name / "cert.pem", pki.folder / name / "key.pem")
    node = pki.folder / "node.yaml"
    node.write_text("tlsCert: a/cert.pem\ntlsKey: a/key.pem\n")
    reconcile.write("alpha", command=reconcile.demo_command(chunks="3", chunk_delay="0.01"))
    keys = str(_keyfile(reconcile))
    g = gateway("--node-config", str(node), "--api-keys", keys, wait=False)
    try:
        reconcile.wait_for(lambda: _serial(g.port, pki) == 1, timeout=WAIT, what="serial 1")
        g.wait_phase("alpha", "Ready")
        first = g.serving()
        with Load(g.port, pki.client(), 4) as load:
            load.more(reconcile, 8, "answers with the first pair")
            node.write_text("tlsCert: b/cert.pem\ntlsKey: b/key.pem\n")
            g.proc.send_signal(signal.SIGHUP)
            reconcile.wait_for(lambda: _serial(g.port, pki) == 2, timeout=WAIT, what="pair b")
            load.more(reconcile, 8, "answers with the new pair")
        load.check()
        assert g.serving().ref != first.ref
        assert g.serving().settings["tls_cert"] == str(pki.folder / "b" / "cert.pem")
        assert "gateway settings changed: a new gateway takes the port over" in g.text()
        node.write_text("tlsCert: a/cert.pem\ntlsKey: missing.pem\n")
        g.proc.send_signal(signal.SIGHUP)
        said = "gateway settings not changed; the gateway serves on with its own"
        reconcile.wait_for(lambda: said in g.text(), timeout=WAIT, what="the refusal")
        assert "missing.pem" in g.text()
        assert _serial(g.port, pki) == 2 and g.proc.poll() is None
    finally:
        g.finish()


def test_hand_over_under_load_keeps_tls(reconcile: Any, gateway: Any, pki: Pki) -> None:
    cert, key = _pair(pki)
    g = _tls_gateway(reconcile, gateway, pki, cert, key)
    old = g.serving()
    try:
        with Load(g.port, pki.client(), 6) as load:
            load.more(reconcile, 16, "answers from the first gateway")
            took = reconcile("gateway", "restart", check=0)
            assert f"took it over from pid {old.ref.pid}" in took.out, took
            reconcile.wait_for(lambda: not old.alive(), timeout=WAIT, what="the old gateway gone")
            load.more(reconcile, 16, "answers from the new gateway alone")
        load.check()
        assert g.serving().ref != old.ref
        assert g.serving().settings["tls_cert"] == str(cert)
    finally:
        g.finish()


def test_a_plain_bind_beyond_loopback_warns_once(reconcile: Any, gateway: Any, pki: Pki) -> None:
    port = reconcile.port + 15
    keys = str(_keyfile(reconcile))
    g = gateway("--listen", f"0.0.0.0:{port}", "--api-keys", keys)
    try:
        assert g.text().count("gateway without TLS") == 1, g.text()[-3000:]
        assert "--tls-cert FILE --tls-key FILE" in g.text()
    finally:
        g.finish()
    cert, key = _pair(pki)
    flags = ["--tls-cert", str(cert), "--tls-key", str(key), "--api-keys", keys]
    g = gateway("--listen", f"0.0.0.0:{port}", *flags, wait=False)
    try:
        reconcile.wait_for(lambda: _alive_https(g, pki.client()), timeout=WAIT, what="HTTPS")
        assert "gateway without TLS" not in g.text()
    finally:
        g.finish()


def test_client_certificates_with_tls_client_ca(reconcile: Any, gateway: Any, pki: Pki) -> None:
    cert, key = _pair(pki)
    g = gateway("--tls-client-ca", str(pki.ca), wait=False)
    assert g.proc.wait(timeout=WAIT) == 64, g.text()
    assert "--tls-client-ca without --tls-cert" in g.text()
    mine, mine_key = pki.folder / "client.pem", pki.folder / "client.key"
    pki.server(9, mine, mine_key, usage="clientAuth")
    ctx = pki.client()
    ctx.load_cert_chain(mine, mine_key)
    trusted = pki.folder / "client-cas.pem"
    trusted.write_bytes(pki.ca.read_bytes())
    flags = ("--tls-client-ca", str(trusted))
    g = _tls_gateway(reconcile, gateway, pki, cert, key, *flags, client=ctx)
    try:
        _a_refused_handshake_is_said_in_the_log(g, reconcile, pki)
        status, body, _ = _https(g.port, ctx, "POST", "/v1/chat/completions", _chat("alpha"))
        assert status == 200, body
        _a_refused_client_reads_the_alert_that_says_why(g, reconcile, pki)
        # The CA taken out of the file (another in its place): SIGHUP, and its clients
        # are refused (it stayed trusted while reloads loaded into the live context).
        other = Pki(pki.folder / "other")
        other.folder.mkdir()
        other.make_ca()
        trusted.write_bytes(other.ca.read_bytes())
        g.proc.send_signal(signal.SIGHUP)
        reconcile.wait_for(lambda: not _admitted(g.port, ctx), timeout=WAIT, what="refused")
    finally:
        g.finish()


def _a_refused_handshake_is_said_in_the_log(g: Any, reconcile: Any, pki: Pki) -> None:
    """A client that does not trust the certificate, and (``--tls-client-ca``) one that
    sends none: each handshake refused is an info line naming why and the next move. (Each
    was a silent close: the operator had only the client's side of the story.) A client
    that closes mid-handshake refused nothing: no line. On the gateway of
    test_client_certificates_with_tls_client_ca before anything else is refused there (a
    daemon, gateway and engine of its own cost a start and a stop, ~4 s under load)."""
    # A probe that opens a handshake and closes (a port scan): it refused nothing.
    with socket.create_connection(("127.0.0.1", g.port), timeout=WAIT) as probe:
        probe.sendall(b"\x16\x03\x01\x00\x50\x01\x00")
    untrusting = ssl.create_default_context()  # the system's CAs, not the test's
    with pytest.raises(ssl.SSLCertVerificationError):
        _https(g.port, untrusting, "GET", "/healthz")
    with pytest.raises((OSError, http.client.HTTPException)):  # no client certificate
        _https(g.port, pki.client(), "GET", "/healthz")
    said = (
        "TLS handshake refused: the client does not trust the gateway's certificate",
        "TLS handshake refused: the client sent no certificate, and --tls-client-ca",
    )
    reconcile.wait_for(lambda: all(s in g.text() for s in said), what="both refusals")
    assert g.text().count("TLS handshake refused") == 2, g.text()[-3000:]
    assert "Traceback" not in g.text()


def _a_refused_client_reads_the_alert_that_says_why(g: Any, reconcile: Any, pki: Pki) -> None:
    """Each refused handshake ends with OpenSSL's alert, as nginx's does: a TLS 1.1 client
    reads ``protocol version``, one offering CBC suites alone ``handshake failure`` (and
    the log says so in words), one with no certificate ``handshake failure`` (TLS 1.2) or
    ``certificate required`` (1.3, read once its own handshake is done). asyncio's TLS
    transport closed each without the alert OpenSSL wrote: the client read "unexpected
    eof" (SSLEOFError), as from a gateway that crashed. None of these clients sends a byte
    after its last handshake message, so the gateway's close reads nothing unread (no
    reset that could overtake the alert)."""
    with pytest.raises(ssl.SSLError, match="PROTOCOL_VERSION"):
        _handshake_to(g.port, _tls_1_1_client(pki))
    cbc = pki.client()
    cbc.maximum_version = ssl.TLSVersion.TLSv1_2
    cbc.set_ciphers("ECDHE+AES+SHA256:ECDHE+AES+SHA384:!AESGCM")
    with pytest.raises(ssl.SSLError, match="HANDSHAKE_FAILURE"):
        _handshake_to(g.port, cbc)
    no_cert_1_2 = pki.client()
    no_cert_1_2.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises(ssl.SSLError, match="HANDSHAKE_FAILURE"):
        _handshake_to(g.port, no_cert_1_2)
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"):
        _handshake_to(g.port, pki.client(), then_read=True)
    said = "TLS handshake refused: the client offers none of the gateway's cipher suites"
    reconcile.wait_for(lambda: said in g.text(), what="the refusal in words")


def _handshake_to(port: int, ctx: ssl.SSLContext, then_read: bool = False) -> None:
    """A handshake with the gateway (and with ``then_read``, a read of its first record)."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=WAIT) as raw,
        ctx.wrap_socket(raw, server_hostname="localhost") as done,
    ):
        if then_read:
            done.recv(1)


def _admitted(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        return _https(port, ctx, "GET", "/healthz")[0] == 200
    except (OSError, http.client.HTTPException):
        return False


def test_silent_connections_exhaust_nothing_over_tls(
    reconcile: Any, gateway: Any, pki: Pki
) -> None:
    """A flood of connections that never send their handshake (issue 28's half-open
    flood, on the TLS port): each may wait there up to a minute, but they share the
    connection cap with the rest, the oldest let go first; so a real client still gets
    its answer and a pass still starts an engine, under an fd limit below the flood."""
    cert, key = _pair(pki)
    g = _tls_gateway(reconcile, gateway, pki, cert, key, prefix=["prlimit", "--nofile=256:256"])
    held: list[socket.socket] = []
    try:
        for _ in range(300):
            held.append(socket.create_connection(("127.0.0.1", g.port), timeout=10))
        reconcile.write("beta", basePort=reconcile.port + 5)  # a pass must start it
        g.wait_phase("beta", "Ready")
        status, body, _ = _https(
            g.port, pki.client(), "POST", "/v1/chat/completions", _chat("alpha")
        )
        assert status == 200, body
    finally:
        for sock in held:
            sock.close()
        g.finish()
