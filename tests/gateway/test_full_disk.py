"""A full state-dir disk must not stop the node (issue 34, item 3).

The state dir is a real 20 MB tmpfs; the daemon runs with its gateway and real engines.
A pull of a stream with no length stops at the disk reserve (its partial dropped);
then the disk is filled to the last byte by another hand. A kill -9 of an engine is
still seen and acted on (the records' ballast gives them room), and ``down --gateway``
still stops the engines and the gateway.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from disks import fill, tmpfs
from modelservers import HostileServer
from procs import GATEWAY_MARKER, kill_marked, marked_pids

from controller.pull import launch
from controller.store.models.modelcache import CacheEntry

KEY = f"sha256-{'0' * 64}"


def test_a_full_state_disk_still_restarts_a_killed_engine_and_down_stops_all(
    reconcile: Any, gateway: Any
) -> None:
    cache = reconcile.state / "models"
    with tmpfs(reconcile.state, "20m"), HostileServer("endless") as server:
        try:
            reconcile.env["RECONCILE_DISK_RESERVE"] = "4M"
            reconcile.write("web")
            source = {"url": server.url(), "sha256": "0" * 64}
            reconcile.write("big", source=source, basePort=reconcile.port + 5)
            g = gateway()
            g.wait_phase("web", "Ready")
            entry = CacheEntry.of(cache, KEY)
            failed = reconcile.wait_for(
                lambda: (r := entry.result()) and r.get("kind") == "disk" and r, what="the pull"
            )
            assert server.url() in failed["message"] and "filled up after" in failed["message"]
            assert not list(entry.folder.glob("*.partial"))
            fill(reconcile.state)  # the disk to its last byte, by another hand
            (pid,) = reconcile.pids("web")
            os.kill(pid, signal.SIGKILL)
            reconcile.wait_for(lambda: reconcile.pids("web") - {pid}, what="web restarted")
            g.wait_phase("web", "Ready")
            assert reconcile.status()["web"]["restarts"] == 1
            assert "disk full" in g.text()
            g.finish()  # the daemon exits 0; `down --gateway` exits 0 and leaves no gateway
            assert not reconcile.pids()
        finally:
            kill_marked(str(cache), marker=launch.MARKER)


def test_down_stops_all_on_a_full_disk_whose_ballast_is_spent(reconcile: Any, gateway: Any) -> None:
    with tmpfs(reconcile.state, "20m"):
        reconcile.write("web")
        reconcile.write("api", basePort=reconcile.port + 5)
        g = gateway()
        g.wait_phase("web", "Ready")
        g.wait_phase("api", "Ready")
        assert g.stop() == 0  # the daemon; its engines and its gateway stay up
        (reconcile.state / "instances" / ".reserve").unlink()  # spent on an earlier fill
        fill(reconcile.state)
        reconcile.down("--gateway")  # exit 0: the Terminating notes are skipped, not the stops
        assert not reconcile.pids()
        assert not marked_pids(f"{reconcile.node}/", GATEWAY_MARKER)  # the gateway too
        assert reconcile.status() == {}
