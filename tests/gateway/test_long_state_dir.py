"""A state dir whose path is too long for ``sun_path`` (issue 34, item 10).

The daemon's wake-up socket and each gateway's control socket then live in Linux's
abstract namespace, where file permissions do not reach. Real daemons, gateways and
sockets, another user played by a child that ``setuid()``s to nobody (we run as root):

- names derived from the path alone are squatted before the daemon starts: it starts
  anyway, and its gateway serves;
- nobody floods the wake-up socket: no pass comes of it (a warning names the uid), while
  one datagram of ours brings exactly one pass;
- a control socket served by another user is not believed (a stale name taken over).
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from controller.gateway.lifecycle import handover, registry

WAIT = 30.0
FLOOD = 200

# Run as nobody: send FLOOD datagrams to the address (hex), or serve one fake answer on it.
AS_NOBODY = """
import os, socket, sys
os.setgid(int(sys.argv[1])); os.setuid(int(sys.argv[2]))
address = bytes.fromhex(sys.argv[4]).decode()
if sys.argv[3] == "flood":
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        for _ in range(int(sys.argv[5])):
            s.sendto(b"!", address)
else:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(address); s.listen()
        print("ready", flush=True)
        conn, _ = s.accept()
        conn.recv(64); conn.sendall(b"fake_metric 1\\n"); conn.close()
"""

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not sys.platform.startswith("linux"),
    reason="another uid is played by a root child that setuid()s (Linux)",
)


def _nobody(rc: Any, what: str, address: str, *extra: str) -> subprocess.Popen[bytes]:
    who = pwd.getpwnam("nobody")
    argv = [sys.executable, "-c", AS_NOBODY, str(who.pw_gid), str(who.pw_uid), what]
    out = subprocess.PIPE if what == "serve" else subprocess.DEVNULL
    return rc.spawn([*argv, address.encode().hex(), *extra], stdout=out)


def _derived(state: Path, name: str) -> str:
    """An abstract name anyone can compute from the state dir's path (as they once were)."""
    digest = hashlib.sha256(os.fsencode(state.absolute())).hexdigest()[:24]
    return f"\0reconcile-{digest}-{name}"


def _passes(g: Any, trigger: str) -> int:
    found = 0
    for line in g.text().splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and item.get("event") == "pass":
            found += trigger in str(item.get("trigger"))
    return found


@needs_root
def test_a_long_state_dir_starts_beside_squatters_and_wakes_for_its_owner_only(
    reconcile: Any, gateway: Any
) -> None:
    rc = reconcile
    rc.state = rc.tmp / ("a-rather-long-folder-name-" * 4) / "state"
    assert len(os.fsencode(rc.state / "gateway" / "daemon.sock")) > registry.SUN_PATH_MAX
    squatters = []
    for name in ("daemon.sock", "ctl-0.sock"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(_derived(rc.state, name))
        squatters.append(sock)
    try:
        rc.write("alpha")
        g = gateway()  # it serves: the squatted names did not stop the daemon
        try:
            g.wait_phase("alpha", "Ready")
            address = registry.wake_address(rc.state)
            assert address is not None and address.startswith("\0"), address
            flood = _nobody(rc, "flood", address, str(FLOOD))
            assert flood.wait(timeout=WAIT) == 0
            rc.wait_for(
                lambda: "wake-up from another user ignored" in g.text(),
                timeout=WAIT,
                what="the flood heard and refused",
            )
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as ours:
                ours.sendto(b"!", address)
            rc.wait_for(lambda: _passes(g, "gateway"), timeout=WAIT, what="our wake-up's pass")
            assert _passes(g, "gateway") == 1, g.text()[-3000:]
        finally:
            g.finish()
    finally:
        for sock in squatters:
            sock.close()


@needs_root
def test_a_control_socket_of_another_user_is_not_believed(reconcile: Any) -> None:
    address = f"\0reconcile-test-{uuid.uuid4().hex}"
    server = _nobody(reconcile, "serve", address)
    assert server.stdout is not None
    with server.stdout:
        assert server.stdout.readline() == b"ready\n"
        assert handover.ask_metrics(address) is None
    server.wait(timeout=WAIT)
