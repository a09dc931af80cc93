"""The Ray head lost under a running daemon, then back: the daemon never goes with it.

A cluster of its own (the shared one of conftest.py is stopped first: one cluster at a
time on this box), whose GCS listens on a port held for this module, so that the head
brought back is at the same address. One for the module: a test starts it again only
where the one before left its GCS dead or stopped (the first test ends with its head
back, a new cluster, as the second starts from). The test process never joins it as a driver: a
driver's core worker ends its process when the GCS has been gone for a while, which is
the defect this file holds.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import alive, free_ports, release_ports, wait_for
from rayhelp import OwnCluster, engines_gone, ray_engines

from controller.backends.ray.proxy import LOOK

MB = 1 << 20
GPU = {"count": 1, "kind": "nvidia"}
ENGINE = [sys.executable, "-m", "controller.demo.engine", "--port", "{port}", "--host", "{host}"]
# Ray's driver gives up on a GCS gone this long and ends its process (60 s by default):
# short here, so the daemon of old code died within the test's wait.
RAY_GIVES_UP = "5"
UNKNOWN = "state unknown since"
Reconcile = Any  # the `reconcile` fixture of tests/conftest.py


class Head:
    """A one-GPU-worker cluster whose GCS is at ``port``; started again at the same one."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cluster: Any = None

    def start(self) -> Any:
        head = {
            "num_cpus": 1,
            "num_gpus": 0,
            "object_store_memory": 80 * MB,
            "include_dashboard": False,
            "gcs_server_port": self.port,
        }
        self.cluster = OwnCluster(initialize_head=True, head_node_args=head)
        self.cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=80 * MB)
        self.cluster.wait_for_nodes()
        return self.cluster

    def gcs(self) -> subprocess.Popen[bytes]:
        (gcs,) = self.cluster.head_node.all_processes["gcs_server"]
        proc: subprocess.Popen[bytes] = gcs.process
        return proc

    def whole(self) -> bool:
        """Its GCS running (alive, not stopped): a test may start from it."""
        if self.cluster is None:
            return False
        gcs = self.gcs()
        if gcs.poll() is not None:
            return False
        state = Path(f"/proc/{gcs.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state not in ("T", "t")

    def kill_gcs(self) -> None:
        self.gcs().kill()
        self.gcs().wait(30)

    def stop(self) -> None:
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            cluster.shutdown()
        engines_gone(kill=True)  # each dies with its actor's process, which shutdown ended


@pytest.fixture(scope="module")
def own_head(held_cluster: Any) -> Iterator[Head]:
    held_cluster.stop()  # the module clusters' one: the next module that asks starts it
    port = free_ports(1)
    own = Head(port)
    try:
        yield own
    finally:
        own.stop()
        release_ports([port])


@pytest.fixture
def head(own_head: Head, monkeypatch: pytest.MonkeyPatch) -> Head:
    """The module's cluster, started (again) where it is not whole."""
    # Its raylets (which inherit this) wait for a silent GCS longer than Ray's 60 s: a
    # loaded box's passes must not decide whether the worker's actors live on.
    monkeypatch.setenv("RAY_gcs_rpc_server_reconnect_timeout_s", "300")
    if not own_head.whole():
        own_head.stop()
        own_head.start()
    return own_head


def test_the_daemon_outlives_the_head_and_runs_on_when_it_is_back(
    head: Head, reconcile: Reconcile
) -> None:
    rc = reconcile
    address = head.cluster.address
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=address)
    rc.write("w", command=ENGINE, devices=GPU)
    env = {**rc.env, "RAY_gcs_rpc_server_reconnect_timeout_s": RAY_GIVES_UP}
    log = rc.tmp / "daemon.log"
    with log.open("wb") as out:
        daemon = rc.popen("--resync", "1s", env=env, stderr=out)
    try:
        before = wait_for(
            lambda: (rc.status().get("w") or {}).get("phase") == "Ready" and rc.status()["w"],
            timeout=120,
            what="w Ready under the daemon",
        )
        head.kill_gcs()

        # The daemon serves on; w's record keeps what it holds and says its state is
        # unknown, why, and what to do; nothing is started in its place.
        marked = wait_for(
            lambda: UNKNOWN in rc.status()["w"]["message"] and rc.status()["w"],
            timeout=60,
            what="w marked unknown",
        )
        assert f"Ray cluster at {address}" in marked["message"], marked  # where, and
        assert "ray start --head" in marked["message"], marked  # the next move
        assert (marked["phase"], marked["pid"]) == ("Ready", before["pid"]), marked
        assert marked["devices"] == before["devices"], marked
        shown = rc("status", check=0).out  # the CLI reads records: no cluster needed
        assert UNKNOWN in shown, shown
        # Ray's driver, which ends its process once the GCS is gone a while, was never in
        # the daemon's (its child's: ended at the first pass that found the head gone).
        assert "_raylet" not in Path(f"/proc/{daemon.pid}/maps").read_text()
        wait_for(lambda: not _drivers(daemon.pid), timeout=60, what="the daemon's driver gone")
        assert daemon.poll() is None, log.read_text()
        assert UNKNOWN in rc.status()["w"]["message"]

        # The head back (a new Ray session: the old one's actors went with its raylets).
        head.stop()
        assert not alive(before["pid"])
        worker = next(iter(head.start().worker_nodes)).node_id
        after = wait_for(
            lambda: (s := rc.status()["w"])["phase"] == "Ready" and s["node"] == worker and s,
            timeout=120,
            what="w Ready on the new cluster's node",
        )
        assert UNKNOWN not in after["message"], after
        events = "\n".join(f"{e['action']}: {e['reason']}" for e in rc.events("w"))
        assert after["pid"] != before["pid"], events
        fails = [e["reason"] for e in rc.events("w") if e.get("action") == "fail"]
        assert fails and "engine ended with its actor" in fails[-1], events  # said lost
        assert ray_engines() == {after["pid"]}, "one engine of w, no duplicate"
        assert daemon.poll() is None, log.read_text()
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    rc.down()
    engines_gone()


def test_a_head_that_answers_again_keeps_its_engines_adopted_not_started_twice(
    head: Head, reconcile: Reconcile
) -> None:
    """The GCS stopped (SIGSTOP: its port still accepts, its calls never answer), then
    going on: the daemon's driver is ended, its GCS asked directly (it does not answer),
    before a look's deadline (a Ray call waited out its 40 s first); the actors lived on,
    so the next pass's new driver adopts them as they are."""
    rc = reconcile
    rc.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=head.cluster.address)
    rc.write("w", command=ENGINE, devices=GPU)
    log = rc.tmp / "daemon.log"
    with log.open("wb") as out:
        daemon = rc.popen("--resync", "1s", stderr=out)
    try:
        before = wait_for(
            lambda: (rc.status().get("w") or {}).get("phase") == "Ready" and rc.status()["w"],
            timeout=120,
            what="w Ready under the daemon",
        )
        gcs = head.gcs()
        gcs.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            marked = wait_for(
                lambda: UNKNOWN in rc.status()["w"]["message"] and rc.status()["w"],
                timeout=120,
                what="w marked unknown",
            )
            took = time.monotonic() - stopped
            assert "its GCS took a connection and said nothing" in marked["message"], marked
            assert took < LOOK, (took, marked)  # known by asking the GCS, not at a deadline
            assert alive(before["pid"]) and daemon.poll() is None, log.read_text()
        finally:
            gcs.send_signal(signal.SIGCONT)
        after = wait_for(
            lambda: UNKNOWN not in (s := rc.status()["w"])["message"] and s,
            timeout=120,
            what="w judged again",
        )
        events = "\n".join(f"{e['action']}: {e['reason']}" for e in rc.events("w"))
        kept = ("phase", "pid", "node", "devices", "restarts")
        assert {k: after[k] for k in kept} == {k: before[k] for k in kept}, events
        assert ray_engines() == {before["pid"]}, "one engine of w, no duplicate"
        assert daemon.poll() is None and "Traceback" not in log.read_text(), log.read_text()
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    rc.down()
    engines_gone()


def _drivers(daemon: int) -> list[int]:
    """The daemon's Ray driver processes (its children running driverproc)."""
    children = subprocess.run(
        ["pgrep", "-P", str(daemon), "-f", "controller.backends.ray.driverproc"],
        capture_output=True,
        text=True,
        check=False,
    )
    return [int(pid) for pid in children.stdout.split()]
