"""Replicas through the real CLI: real engines, ports, signals and records.

Three replicas on ``nvidia:0,nvidia:1,nvidia:2`` land on three devices and ports, each
its own record, marker and log; a SIGKILLed replica is restarted while the others keep
their pids; scaling 3 -> 1 keeps replica 0's engine and stops replicas 1 and 2.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from procs import wait_gone

from controller.core.manifest.names import replica_name

GPU1 = {"devices": {"count": 1, "kind": "nvidia"}}
NAMES = ["web", "web@1", "web@2"]


def _three(reconcile: Any) -> dict[str, dict[str, Any]]:
    reconcile.devices = "nvidia:0,nvidia:1,nvidia:2"
    reconcile.write("web", replicas=3, **GPU1)
    reconcile.converge()
    return reconcile.status()


def test_three_replicas_on_three_devices_and_ports(reconcile: Any) -> None:
    items = _three(reconcile)
    assert sorted(items) == NAMES
    assert all(items[n]["phase"] == "Ready" for n in NAMES), items
    devices = sorted(d for n in NAMES for d in items[n]["devices"])
    assert devices == ["nvidia:0", "nvidia:1", "nvidia:2"]
    assert len({items[n]["port"] for n in NAMES}) == 3
    for i, name in enumerate(NAMES):
        assert replica_name("web", i) == name
        env = reconcile.environ(items[name]["pid"])
        assert env["RECONCILE_NAME"] == "web"  # the deployment's name
        assert env["RECONCILE_INSTANCE"].startswith(f"{reconcile.node}/{name}/")
        log = reconcile.state / "instances" / "logs" / f"{name}.log"
        assert f"start {name} instance" in log.read_text()  # each replica its own log
        assert reconcile.pids(name) == {items[name]["pid"]}
    assert {e.get("instance") for e in reconcile.events("web")} >= {"web@1", "web@2"}
    reconcile.down()


def test_a_killed_replica_restarts_and_the_others_keep_their_pids(reconcile: Any) -> None:
    before = _three(reconcile)
    os.kill(before["web@1"]["pid"], signal.SIGKILL)
    wait_gone(before["web@1"]["pid"])
    reconcile.converge()
    after = reconcile.status()
    assert after["web@1"]["phase"] == "Ready" and after["web@1"]["restarts"] == 1
    assert after["web@1"]["pid"] != before["web@1"]["pid"]
    for name in ("web", "web@2"):
        assert after[name]["pid"] == before[name]["pid"]
        assert after[name]["restarts"] == 0
    reconcile.down()


def test_scale_three_to_one_keeps_replica_zero(reconcile: Any) -> None:
    before = _three(reconcile)
    reconcile.write("web", replicas=1, **GPU1)
    reconcile.converge()
    after = reconcile.status()
    assert sorted(after) == ["web"]
    assert after["web"]["pid"] == before["web"]["pid"] and after["web"]["phase"] == "Ready"
    for name in ("web@1", "web@2"):
        wait_gone(before[name]["pid"])
        assert not reconcile.pids(name)
    stops = [e for e in reconcile.events("web") if e.get("reason") == "scaled down to 1"]
    assert {e.get("instance") for e in stops} == {"web@1", "web@2"}
    reconcile.down()
