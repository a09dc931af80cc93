"""What TLS costs through the gateway (issue 39), plain HTTP and HTTPS in one run.

    python -m benchmarks --only tls

One demo engine behind ``reconcile --listen``, the daemon started twice: plain, then
with ``--tls-cert/--tls-key`` (a self-signed P-256 pair made here with ``openssl``). Per
daemon, N chat completions on a new connection each (the handshake paid every time, as
curl pays it) and N on one kept-alive connection (the handshake paid once). The rows
give the median per request and the ratio HTTPS / plain. Figures are whole-request
times on this box, the engine's answer included.
"""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import (
    HTTP_READY,
    PYTHON,
    Row,
    Workspace,
    free_port_block,
    manifest,
    median,
    reconcile_argv,
    run,
    stop,
    wait_for,
    workspace,
)

SECTION = "12. tls"
WAIT = 60.0
BODY = json.dumps({"model": "tls", "messages": [{"role": "user", "content": "hi"}]})

Connect = Callable[[], http.client.HTTPConnection]


def _pair(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True, capture_output=True,
    )  # fmt: skip
    key.chmod(0o600)
    return cert, key


def _ask(conn: http.client.HTTPConnection) -> None:
    conn.request("POST", "/v1/chat/completions", BODY, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        raise RuntimeError(f"the gateway answered {resp.status}")


def _fresh(connect: Connect, n: int) -> list[float]:
    took = []
    for _ in range(n):
        t = time.perf_counter()
        conn = connect()
        try:
            _ask(conn)
        finally:
            conn.close()
        took.append((time.perf_counter() - t) * 1000)
    return took


def _kept(connect: Connect, n: int) -> list[float]:
    took = []
    conn = connect()
    try:
        _ask(conn)  # the handshake, not measured
        for _ in range(n):
            t = time.perf_counter()
            _ask(conn)
            took.append((time.perf_counter() - t) * 1000)
    finally:
        conn.close()
    return took


def _measure(
    ws: Workspace, port: int, tls: tuple[Path, Path] | None, n: int
) -> dict[str, list[float]]:
    flags = ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])] if tls else []
    argv = [*reconcile_argv(), "--listen", str(port), "--resync", "1h", *flags, *ws.common()]
    if tls:
        ctx = ssl.create_default_context(cafile=str(tls[0]))

        def connect() -> http.client.HTTPConnection:
            return http.client.HTTPSConnection("127.0.0.1", port, timeout=WAIT, context=ctx)
    else:

        def connect() -> http.client.HTTPConnection:
            return http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)

    with open(ws.root / "daemon.log", "ab") as log:
        daemon = subprocess.Popen(argv, env=ws.env(), stdin=subprocess.DEVNULL, stderr=log)
    try:
        wait_for(lambda: _answers(connect), WAIT, "the gateway and its engine", poll=0.05)
        _fresh(connect, 5)  # warm: the engine's and the gateway's first requests
        return {"fresh": _fresh(connect, n), "kept": _kept(connect, n)}
    finally:
        stop(daemon)
        run([*reconcile_argv(), "gateway", "stop", *ws.common()], env=ws.env())


def _answers(connect: Connect) -> bool:
    try:
        _fresh(connect, 1)
    except (OSError, RuntimeError, http.client.HTTPException):
        return False
    return True


def bench(n: int = 300) -> list[Row]:
    with workspace("tls") as ws:
        base = free_port_block(8, start=26500)
        command = [PYTHON, "-m", "controller.demo.engine", "--port", "{port}", "--model", "tls"]
        (ws.manifests / "tls.yaml").write_text(
            manifest("tls", command, base_port=base, readiness=HTTP_READY)
        )
        plain = _measure(ws, base + 7, None, n)
        tls = _measure(ws, base + 7, _pair(ws.root), n)
        run([*reconcile_argv(), "down", "--gateway", *ws.common()], env=ws.env())
    return [
        Row(
            SECTION,
            f"chat completion through the gateway, a new connection each ({n}): HTTPS vs plain",
            "ms",
            tls["fresh"],
            plain["fresh"],
            alt="plain HTTP",
            note="TLS 1.3 handshake (P-256) + request",
        ),
        Row(
            SECTION,
            f"chat completion through the gateway, one kept-alive connection ({n}): HTTPS vs plain",
            "ms",
            tls["kept"],
            plain["kept"],
            alt="plain HTTP",
            note="the request's encryption alone",
        ),
    ]


def medians(rows: list[Row]) -> list[str]:  # pragma: no cover - for a quick look
    return [f"{r.metric}: {median(r.ours):.2f} vs {median(r.theirs):.2f}" for r in rows]


if __name__ == "__main__":  # pragma: no cover
    for line in medians(bench(50)):
        print(line)
