"""A torn ``<state>/gateway/current.json`` (a disk error, a hand edit; writes are atomic):
real daemons, gateway processes and files.

- `gateway status` showed the live gateway as "draining" and `gateway restart` said "no
  gateway runs"; both now take the live member that holds the port as serving, and say
  the file was unreadable; the restart takes the port over from it and writes the file
  again.
- a gateway answered before `current.json` named it: a client that heard `/healthz`
  and ran `reconcile ui` was told no gateway ran; it accepts once it is current.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from procs import free_ports

from controller.store.statedir import StateDir

# A gateway process's start, in process, with a client at its port at the moment it is
# made current: the client must not be answered before.
_ANSWERED_BEFORE_CURRENT = """
import json, select, socket, sys
from pathlib import Path
from controller.gateway.lifecycle import process, registry
from controller.gateway.settings import Settings
state, port = Path(sys.argv[1]), int(sys.argv[2])
state.mkdir()
made_current, heard = registry.make_current, []

def probed(state_dir, info):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        client.sendall(b"GET /healthz HTTP/1.1\\r\\nHost: t\\r\\n\\r\\n")
        heard.append(bool(select.select([client], [], [], 1.0)[0]))
    made_current(state_dir, info)

registry.make_current = probed
gateway = process.GatewayProcess(Settings(host="127.0.0.1", port=port, state_dir=state), "t1")
gateway.open()
print(json.dumps({"answered": heard}))
gateway.gateway.stop()
"""


def test_a_gateway_answers_only_once_it_is_current(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", _ANSWERED_BEFORE_CURRENT, str(tmp_path / "state")]
    done = subprocess.run([*argv, str(free_ports(1))], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stdout.splitlines() if line.startswith('{"answered"')]
    assert said and json.loads(said[0]) == {"answered": [False]}, done.stdout


def test_a_torn_current_file_falls_back_to_the_member_holding_the_port(
    reconcile: Any, gateway: Any
) -> None:
    reconcile.write("alpha")
    g = gateway()
    try:
        g.wait_phase("alpha", "Ready")
        first = g.serving()
        current = StateDir(reconcile.state).current_gateway
        whole = current.read_bytes()
        current.write_bytes(whole[: len(whole) // 2])  # torn by hand

        shown = reconcile("gateway", "status", check=0)
        row = next(line for line in shown.out.splitlines() if line.startswith(str(first.ref.pid)))
        assert row.endswith("serving"), shown
        said = f"{current} is torn or not a gateway file: pid {first.ref.pid}, which holds the port"
        assert said in shown.err, shown

        took = reconcile("gateway", "restart", check=0)
        assert f"took it over from pid {first.ref.pid}" in took.out, took
        assert said in took.err, took
        second = g.serving()  # current.json written again, by the new gateway
        assert second.ref != first.ref and second.port == g.port
        assert g.request("GET", "/healthz").status == 200
        assert g.post("alpha").status == 200
    finally:
        g.finish()
