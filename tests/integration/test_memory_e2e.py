"""Memory requests and priorities through the real CLI, with real engine processes.

A static inventory declares the memory (``--devices nvidia:0=80Gi,...``), so this runs on
any machine: the engines are the demo engine (or a fake ``vllm`` that records its argv)
and see ``CUDA_VISIBLE_DEVICES`` as they would on a GPU box.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from controller.store.side import daemonset
from controller.store.side.daemonset import DaemonDevices

GI = 1 << 30

# A stand-in `vllm serve MODEL --port P ...`: records its argv, serves /health and /v1/models.
FAKE_VLLM = """#!{python}
import http.server, json, os, sys
with open(os.environ["ARGV_FILE"], "w") as f:
    json.dump(sys.argv, f)
model = sys.argv[2]
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"data": [{{"id": model}}]}}).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def mem(size: str, priority: int = 0) -> dict[str, Any]:
    return {"devices": {"count": 1, "kind": "nvidia", "memory": size}, "priority": priority}


def devices_of(reconcile: Any) -> dict[str, list[str]]:
    held: dict[str, list[str]] = {}
    for name, item in reconcile.status().items():
        for key in item["devices"]:
            held.setdefault(key, []).append(name)
    return {k: sorted(v) for k, v in sorted(held.items())}


def test_four_40Gi_pack_two_per_80Gi_device_and_never_mix_with_a_whole_lease(
    reconcile: Any,
) -> None:
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=80Gi"
    for name in ("a", "b", "c", "d"):
        reconcile.write(name, **mem("40Gi"))
    reconcile.converge()
    assert devices_of(reconcile) == {"nvidia:0": ["a", "b"], "nvidia:1": ["c", "d"]}
    for name in ("a", "b"):  # the engine sees the device it was given
        pid = reconcile.status()[name]["pid"]
        assert reconcile.environ(pid)["CUDA_VISIBLE_DEVICES"] == "0"

    reconcile.write("e", **mem("40Gi"))
    reconcile.write("w", devices={"count": 1, "kind": "nvidia"})  # a whole lease
    reconcile.once(check=1)  # Pending is a failure for cron
    status = reconcile.status()
    assert status["e"]["phase"] == "Pending" and "no capacity" in status["e"]["message"]
    assert status["w"]["phase"] == "Pending" and "no capacity" in status["w"]["message"]

    shown = reconcile("devices", "-o", "json", check=0).json()["devices"]
    assert [(d["device"], d["memory"], d["memory_allocated"]) for d in shown] == [
        ("nvidia:0", 80 * GI, 80 * GI),
        ("nvidia:1", 80 * GI, 80 * GI),
    ]
    table = reconcile("devices", check=0).out
    assert "a (40Gi), b (40Gi)" in table

    # Room returns on nvidia:1: the whole lease takes it, never beside e on a shared card.
    (reconcile.manifests / "e.yaml").unlink()
    (reconcile.manifests / "c.yaml").unlink()
    (reconcile.manifests / "d.yaml").unlink()
    reconcile.converge()
    assert devices_of(reconcile) == {"nvidia:0": ["a", "b"], "nvidia:1": ["w"]}
    reconcile.down()


def test_priority_preempts_one_of_two_and_it_returns_when_the_winner_goes(
    reconcile: Any,
) -> None:
    reconcile.devices = "nvidia:0=80Gi"
    reconcile.write("low-a", **mem("40Gi"))
    reconcile.converge()
    reconcile.write("low-b", **mem("40Gi"))  # started last: the one to go
    reconcile.converge()

    reconcile.write("high", **mem("40Gi", priority=10))
    plan = reconcile("plan", check=1).out  # low-b will be Pending: `--once` exits 1 too
    assert "- low-b" in plan and "preempted by high (priority 10)" in plan, plan
    assert "+ high" in plan and "preempting low-b" in plan, plan

    reconcile.once(check=1)  # low-b is Pending now
    status = reconcile.status()
    assert status["high"]["phase"] in ("Starting", "Ready")
    assert status["low-a"]["phase"] == "Ready"
    assert status["low-b"]["phase"] == "Pending"
    assert status["low-b"]["message"].startswith("preempted by high (priority 10)")
    assert not reconcile.pids("low-b")

    reconcile.once(check=1)  # no flap: low-b waits, high and low-a keep running
    again = reconcile.status()
    assert again["low-b"]["phase"] == "Pending" and again["high"]["pid"] == status["high"]["pid"]

    (reconcile.manifests / "high.yaml").unlink()
    reconcile.converge()
    back = reconcile.status()
    assert set(back) == {"low-a", "low-b"}
    assert back["low-b"]["phase"] == "Ready" and back["low-a"]["pid"] == status["low-a"]["pid"]
    reconcile.down()


def test_vllm_gets_its_share_as_gpu_memory_utilization(reconcile: Any, tmp_path: Path) -> None:
    reconcile.devices = "nvidia:0=80Gi"
    fake = tmp_path / "vllm"
    fake.write_text(FAKE_VLLM.format(python=sys.executable))
    fake.chmod(0o755)
    argv_file = tmp_path / "argv.json"
    spec = {
        "engine": "vllm",
        "model": "tiny",
        "executable": str(fake),
        "command": None,
        "env": {"ARGV_FILE": str(argv_file)},
        **mem("20Gi"),
    }
    reconcile.write("v", **spec)
    reconcile.converge()
    argv = json.loads(argv_file.read_text())
    at = argv.index("--gpu-memory-utilization")
    assert argv[at + 1] == "0.25", argv

    # The user's own flag wins, and `plan` says so before anything restarts.
    reconcile.write("v", **{**spec, "args": ["--gpu-memory-utilization", "0.5"]})
    plan = reconcile("plan", check=2).out
    assert "replace" in plan
    reconcile.converge()
    argv = json.loads(argv_file.read_text())
    assert argv.count("--gpu-memory-utilization") == 1
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.5"
    reconcile.down()
    plan = reconcile("plan", check=2).out  # from scratch: a create, with the note
    assert (
        "spec.args sets --gpu-memory-utilization: the user's value wins over the computed 0.25"
        in plan
    ), plan


def test_devices_says_what_the_inventory_no_longer_covers(reconcile: Any) -> None:
    """The inventory changed under running engines (a device dropped from --devices, a
    size lowered): the engines run on, as they should, but `devices` hid the one holding
    a device gone from the inventory and showed 80Gi allocated of a 40Gi card without a
    word. Each is said now, in the table and in JSON."""
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=80Gi"
    reconcile.write("big", **mem("50Gi"))
    reconcile.write("whole", devices={"count": 1, "kind": "nvidia"}, basePort=reconcile.port + 2)
    reconcile.converge()
    reconcile.devices = "nvidia:0=40Gi"  # nvidia:1 dropped, nvidia:0 smaller
    held = reconcile.status()
    assert held["big"]["devices"] == ["nvidia:0"] and held["whole"]["devices"] == ["nvidia:1"]
    doc = reconcile("devices", "-o", "json", check=0).json()
    assert doc["outside_inventory"] == [{"device": "nvidia:1", "held_by": ["whole"]}], doc
    (card,) = doc["devices"]
    assert card["memory"] == 40 * GI and card["memory_allocated"] == 50 * GI
    table = reconcile("devices", check=0).out
    assert "nvidia:1 is not in the inventory but held by whole" in table, table
    assert "nvidia:0: 50Gi allocated of 40Gi" in table, table
    reconcile.down()


def test_a_crash_on_a_device_gone_from_the_inventory_is_placed_afresh(reconcile: Any) -> None:
    """A device taken out of --devices (sent for repair) keeps the engine running on it;
    once that engine crashed, its restart went back onto the card the inventory no
    longer has. The restart is placed afresh, within the inventory: here nowhere, so
    the deployment waits Pending, saying so, and nothing runs on the card. Its event
    said "Pending for another port", as a port move's does."""
    reconcile.devices = "nvidia:0,nvidia:1"
    reconcile.write("web", devices={"count": 1, "kind": "nvidia", "candidates": ["1"]})
    reconcile.converge()
    (pid,) = reconcile.pids("web")
    reconcile.devices = "nvidia:0"  # nvidia:1 dropped
    os.kill(pid, signal.SIGKILL)
    reconcile.wait_gone(pid)
    reconcile.once(check=None)  # sees the exit: BackOff, the first restart due at once
    reconcile.once(check=1)  # the restart: nowhere to place it
    record = reconcile.record("web")
    assert record is not None and record["phase"] == "Pending", record
    assert record["devices"] == [] and reconcile.pids("web") == set(), record
    assert "among candidates [1]" in record["message"], record
    gone = "nvidia:1 is no longer in the node's inventory"
    (moved,) = [e for e in reconcile.events("web") if gone in e.get("reason", "")]
    assert moved["outcome"] == "Pending for other devices", moved  # not "another port"
    reconcile.down()


def test_status_warns_of_an_engine_on_a_device_gone_from_the_inventory(reconcile: Any) -> None:
    """The inventory changed under a running engine (its device dropped from --devices):
    `devices` said so, `status` nothing. It warns on stderr, naming the engine, the
    device and the next move, which works: a restart moves it onto a listed device."""
    reconcile.devices = "nvidia:0,nvidia:1"
    try:
        reconcile.write("web", devices={"count": 1, "kind": "nvidia"})
        reconcile.converge()
        assert reconcile.record("web")["devices"] == ["nvidia:0"]
        assert reconcile("status", check=0).err == ""  # nothing amiss: nothing said
        reconcile.devices = "nvidia:1"  # nvidia:0 dropped while web runs on it
        shown = reconcile("status", check=0)
        assert shown.out.splitlines()[1].split()[0] == "web", shown.out  # the table as it was
        assert shown.err == (
            "warning: web holds nvidia:0, which this node's inventory no longer lists "
            "(--devices / RECONCILE_DEVICES changed while it ran): it runs on, and nothing new "
            "is placed there; put nvidia:0 back in the daemon's --devices, or `reconcile "
            "restart web` to move it onto a listed device\n"
        ), shown.err
        reconcile("restart", "web", "--timeout", "60s", check=0)
        assert reconcile.record("web")["devices"] == ["nvidia:1"]
        assert reconcile("status", check=0).err == ""
    finally:
        reconcile.down()


def _status_beside_a_daemon(rc: Any, daemon_has: str, shell_has: str) -> str:
    """`status`'s stderr from a shell whose inventory is ``shell_has``, beside a daemon
    started with ``daemon_has``."""
    said: str = _beside_a_daemon(rc, daemon_has, shell_has, "status").err
    return said


def _beside_a_daemon(rc: Any, daemon_has: str, shell_has: str, *argv: str) -> Any:
    """``reconcile ARGV`` from a shell whose inventory is ``shell_has``, beside a daemon
    started with ``daemon_has`` (once its note says so), stopped before this returns: a
    daemon left running past a failure would start engines the teardown just stopped."""
    rc.devices = daemon_has
    daemon = rc.daemon("--resync", "1h")
    try:
        noted = DaemonDevices(static=daemon_has)
        rc.wait_for(lambda: daemonset.devices_of(rc.state, daemon.pid) == noted, 30, "its note")
        rc.devices = shell_has
        return rc(*argv, check=0)
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)


def test_status_judges_devices_by_the_daemon_s_inventory_not_its_shell_s(reconcile: Any) -> None:
    """`status` compared the devices engines hold with its own shell's inventory: one run
    with another RECONCILE_DEVICES than the daemon's warned of a device the daemon lists,
    and said nothing of one it had dropped. It judges by the running daemon's now."""
    rc = reconcile
    rc.write("web", devices={"count": 1, "kind": "nvidia"})
    rc.devices = "nvidia:0,nvidia:1"
    try:
        rc.converge()
        assert rc.record("web")["devices"] == ["nvidia:0"]
        # A shell whose inventory lacks web's device, the daemon's has it: nothing amiss.
        assert _status_beside_a_daemon(rc, "nvidia:0,nvidia:1", "nvidia:1") == ""
        # nvidia:0 dropped from the daemon's while web runs on it; the shell still lists it.
        said = _status_beside_a_daemon(rc, "nvidia:1", "nvidia:0,nvidia:1")
        assert said.startswith("warning: web holds nvidia:0, which this node's inventory"), said
    finally:
        rc.down()


def test_devices_lists_the_daemon_s_inventory_not_its_shell_s(reconcile: Any) -> None:
    """`devices` listed its own shell's inventory (RECONCILE_DEVICES there) beside a
    daemon that places by another: a device the daemon hands out was missing, and one it
    does not was listed free. It lists the running daemon's, as `status` judges by, and
    says so where the shell's differs; with no daemon, the shell's."""
    rc = reconcile
    rc.write("web", devices={"count": 1, "kind": "nvidia"})
    rc.devices = "nvidia:0,nvidia:1"
    try:
        rc.converge()
        assert rc.record("web")["devices"] == ["nvidia:0"]
        shown = _beside_a_daemon(rc, "nvidia:0,nvidia:1", "nvidia:1", "devices", "-o", "json")
        doc = shown.json()
        assert {d["device"]: d["held_by"] for d in doc["devices"]} == {
            "nvidia:0": ["web"],
            "nvidia:1": [],
        }, doc
        assert doc["inventory_from"] == "daemon" and doc["outside_inventory"] == [], doc
        text = _beside_a_daemon(rc, "nvidia:0,nvidia:1", "nvidia:1", "devices").out
        assert "Inventory: the running daemon's (pid " in text, text
        assert "RECONCILE_DEVICES nvidia:0,nvidia:1), not this shell's (" in text, text
        rc.devices = "nvidia:1"  # no daemon: the shell's, web's device outside it
        alone = rc("devices", "-o", "json", check=0).json()
        assert [d["device"] for d in alone["devices"]] == ["nvidia:1"], alone
        assert alone["inventory_from"] == "shell", alone
        assert [o["device"] for o in alone["outside_inventory"]] == ["nvidia:0"], alone
    finally:
        rc.down()


def test_a_whole_lease_allocates_all_of_a_cards_memory(reconcile: Any) -> None:
    """`devices` showed ALLOCATED 0 beside a deployment holding a whole 80Gi card (no
    `memory` in its spec), and `-o json` had no free figure: both now say what the ledger
    does (all of it allocated, nothing free), and the table's columns are the JSON's."""
    reconcile.devices = "nvidia:0=80Gi,nvidia:1=80Gi,nvidia:2"
    reconcile.write("whole", devices={"count": 1, "kind": "nvidia", "candidates": ["0"]})
    half = {"count": 1, "kind": "nvidia", "memory": "40Gi", "candidates": ["1"]}
    reconcile.write("half", basePort=reconcile.port + 5, devices=half)
    reconcile.converge()
    assert devices_of(reconcile) == {"nvidia:0": ["whole"], "nvidia:1": ["half"]}
    shown = reconcile("devices", "-o", "json", check=0).json()["devices"]
    figures = [(d["memory"], d["memory_allocated"], d["memory_free"]) for d in shown]
    assert figures == [(80 * GI, 80 * GI, 0), (80 * GI, 40 * GI, 40 * GI), (None, 0, None)]
    rows = {
        line.split()[0]: line.split()
        for line in reconcile("devices", check=0).out.splitlines()
        if line.startswith("nvidia:")
    }
    # DEVICE KIND ID UUID NAME | MEMORY ALLOCATED FREE | HEALTH HELD BY
    assert rows["nvidia:0"][5:9] == ["80Gi", "80Gi", "0", "(whole"], rows
    assert rows["nvidia:1"][5:8] == ["80Gi", "40Gi", "40Gi"], rows
    reconcile.down()
