"""The gateway shares its port with a gateway of its own state dir only (issue 34, item 1).

A listening socket is bound with ``SO_REUSEPORT`` so a successor can bind beside a
gateway that will not hand over; with that alone, a daemon of another state dir (or any
process of the same uid) given the same ``--listen`` joined the port silently and took
half the requests, answering 404 for models it does not route. Real daemons, gateway
processes, engines and sockets:

- two state dirs on one port: the second daemon is refused (exit 1, the port and the
  first state dir named) and 0 of 400 requests to the first are lost;
- a foreign listener bound with ``SO_REUSEPORT`` on the port refuses the start too;
- one that joins the port later (the kernel lets it) is named in the gateway's log,
  idle or while a request is forwarded (the guard looks on the loop, or off it).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clients import stream_begun

from controller.gateway.lifecycle import registry

WAIT = 40.0
REQUESTS = 400
ECHO = Path(__file__).with_name("echo_engine.py")
ECHO_ARGS = ["--port", "{port}", "--model", "{name}"]


def _serving_or_exited(state: Path, proc: subprocess.Popen[bytes]) -> bool:
    """The daemon's gateway serves (it joined the port) or the daemon ended."""
    return proc.poll() is not None or registry.current_live(state) is not None


def _lost(port: int, model: str, count: int) -> list[str]:
    """Send ``count`` requests (a connection each); what did not come back 200."""
    lost: list[str] = []
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]})
    for _ in range(count):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
        try:
            conn.request("POST", "/v1/chat/completions", body)
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 200:
                lost.append(f"{resp.status} {data[:120]!r}")
        except (OSError, http.client.HTTPException) as exc:
            lost.append(repr(exc))
        finally:
            conn.close()
    return lost


def test_a_daemon_of_another_state_dir_on_the_port_is_refused(
    reconcile: Any, gateway: Any, tmp_path: Path
) -> None:
    rc = reconcile
    rc.write("alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    other, empty = tmp_path / "state2", tmp_path / "manifests2"
    empty.mkdir()
    log = tmp_path / "second.log"
    argv = rc.argv(
        *("-v", "--resync", "1h", "--listen", f"127.0.0.1:{g.port}"),
        *("--state-dir", str(other), "--node", rc.node, "--devices", rc.devices),
        *("-f", str(empty)),
        common=False,
    )
    with open(log, "wb") as err:
        second = rc.spawn(argv, stderr=err)
    try:
        rc.wait_for(
            lambda: _serving_or_exited(other, second), timeout=WAIT, what="the second daemon"
        )
        lost = _lost(g.port, "alpha", REQUESTS)
        assert lost == [], f"{len(lost)} of {REQUESTS} lost: {lost[:5]}"
        code = second.wait(timeout=WAIT)
        text = log.read_text()
        assert code == 1, text[-3000:]
        assert f"--listen 127.0.0.1:{g.port}" in text, text[-3000:]
        assert f"state dir {rc.state}" in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        assert registry.live(other) == []
    finally:  # on a failed check, what the second daemon started goes first
        if second.poll() is None:
            second.kill()
            second.wait(timeout=WAIT)
        registry.stop_all(other, grace=1.0)
        g.finish()


@pytest.mark.parametrize("reuseport", [True, False], ids=["reuseport", "plain"])
def test_a_foreign_listener_refuses_the_start(
    reconcile: Any, gateway: Any, reuseport: bool
) -> None:
    """Bound with ``SO_REUSEPORT`` (the kernel would share the port) or without (the
    bind fails): either way the process is named."""
    rc = reconcile
    port = rc.port + 15
    with socket.socket() as foreign:
        foreign.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, int(reuseport))
        foreign.bind(("127.0.0.1", port))
        foreign.listen()
        g = gateway("--listen", f"127.0.0.1:{port}", port=port, wait=False)
        rc.wait_for(lambda: _serving_or_exited(rc.state, g.proc), timeout=WAIT, what="daemon")
        code = g.proc.wait(timeout=WAIT)
        text = g.text()
        assert code == 1, text[-3000:]
        assert f"--listen 127.0.0.1:{port}: the address is already in use" in text, text[-3000:]
        assert f"another process (pid {os.getpid()})" in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    assert registry.live(rc.state) == []


def test_a_port_a_connection_holds_is_told_from_a_listener(reconcile: Any, gateway: Any) -> None:
    """A port no process listens on, held as the local end of a connection (as a port of
    the ephemeral range is, now and then, on a busy host): the bind fails, and the error
    said "in use by another process (see `ss -ltnp`)", where ss showed nothing."""
    rc = reconcile
    with socket.socket() as server, socket.socket() as client:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client.bind(("127.0.0.1", 0))  # drawn from the ephemeral range, as a connect's is
        port = client.getsockname()[1]
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        with accepted:
            g = gateway("--listen", f"127.0.0.1:{port}", port=port, wait=False)
            assert g.proc.wait(timeout=WAIT) == 1, g.text()[-3000:]
            said = "the address is in use, though nothing listens there"
            text = g.text()
            assert f"--listen 127.0.0.1:{port}: {said}" in text, text[-3000:]
            assert f"ss -tanp 'sport = :{port}'" in text and "pick one below" in text
            assert "another process" not in text, text[-3000:]
            metrics = rc("--metrics-port", str(port), check=1)
            assert f"--metrics-port 127.0.0.1:{port}: {said}" in metrics.err, str(metrics)


def _join_and_be_named(rc: Any, g: Any) -> None:
    """A listener of ours joins the gateway's port (SO_REUSEPORT) and is named in its log."""
    with socket.socket() as joiner:
        joiner.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        joiner.bind(("127.0.0.1", g.port))
        joiner.listen()
        said = f"another process (pid {os.getpid()})"
        rc.wait_for(lambda: said in g.text(), timeout=WAIT, what="the joiner named")


def test_a_listener_that_joins_later_is_named_in_the_log(reconcile: Any, gateway: Any) -> None:
    """The kernel lets a process of our uid join the port after the gateway bound it (a
    root one beside a root gateway): the gateway cannot refuse it, so it says so."""
    rc = reconcile
    g = gateway()
    try:
        _join_and_be_named(rc, g)
    finally:
        g.finish()


def test_a_listener_that_joins_while_a_request_is_forwarded_is_named_too(
    reconcile: Any, gateway: Any
) -> None:
    """The guard looks on a worker thread while a request is forwarded (off the loop
    that serves it) and on the loop when none is: both paths name the joiner."""
    rc = reconcile
    hold = rc.tmp / "hold"
    hold.touch()
    rc.write("echo", command=[sys.executable, str(ECHO), *ECHO_ARGS, "--hold-while", str(hold)])
    g = gateway()
    conn = http.client.HTTPConnection("127.0.0.1", g.port, timeout=WAIT)
    try:
        g.wait_phase("echo", "Ready")
        stream = stream_begun(conn, "echo")  # in flight until the hold file goes
        _join_and_be_named(rc, g)
        hold.unlink()
        assert stream.read().endswith(b"data: [DONE]\n\n")
    finally:
        hold.unlink(missing_ok=True)
        conn.close()
        g.finish()
