"""A torn ``<state>/gateway/current.json`` (a disk error, a hand edit; writes are atomic):
real daemons, gateway processes and files.

- `gateway status` showed the live gateway as "draining" and `gateway restart` said "no
  gateway runs"; both now take the live member that holds the port as serving, and say
  the file was unreadable; the restart takes the port over from it and writes the file
  again.
"""

from __future__ import annotations

from typing import Any

from controller.store.statedir import StateDir


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
