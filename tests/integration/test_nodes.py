"""Two nodes on one state dir (a shared network folder): each judges only its own records.

DESIGN.md "Many nodes": a pass on node B never restarts, reaps, adopts, signals or drops
a local record of node A, A's devices do not count against B's inventory, `status` shows
A's records with their node, and `down` on B names the node that must act.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from procs import kill_marked, wait_gone

GPU = {"count": 1, "kind": "nvidia"}


@contextmanager
def as_node(reconcile: Any, node: str) -> Iterator[None]:
    """Run the fixture's CLI as another node; kill that node's engines afterwards."""
    mine = reconcile.node
    reconcile.node = node
    try:
        yield
    finally:
        reconcile.node = mine
        left = kill_marked(f"{node}/")
        assert not left, f"engines of node {node} were left running: {left}"


def test_node_b_leaves_node_a_records_alone(reconcile: Any) -> None:
    node_a = reconcile.node
    reconcile.write("web", devices=GPU)
    reconcile.converge()
    before = reconcile.record("web")
    assert before is not None and before["node"] == node_a
    os.kill(before["ref"]["pid"], signal.SIGKILL)  # A's engine dies; A is not looking
    wait_gone(before["ref"]["pid"])

    reconcile.write("big", devices={"count": 2, "kind": "nvidia"})
    with as_node(reconcile, f"{node_a}-b"):
        reconcile.once(check=None)
        # Not restarted, reaped, re-owned or dropped: the record is byte for byte A's.
        assert reconcile.record("web") == before
        assert not reconcile.pids("web")  # nothing started for it on B
        # A's GPU does not count against B's inventory: both of B's GPUs go to "big".
        big = reconcile.status("big", cli=True)["big"]
        assert big["node"] == f"{node_a}-b" and big["devices"] == ["nvidia:0", "nvidia:1"]
        web = reconcile.status("web", cli=True)["web"]
        assert web["node"] == node_a
        down = reconcile("down", check=1)
        # the node this run is, too: a shell without the daemon's --node is another node
        said = f"web runs on node {node_a}, and this run is node {node_a}-b (--node, "
        assert said in down.err and "run `reconcile down` there" in down.err, down
        assert "stopped big" in down.out
        assert reconcile.record("web") == before

    # Back on A, the dead engine is seen and restarted under A's name.
    (reconcile.manifests / "big.yaml").unlink()
    reconcile.converge()
    after = reconcile.record("web")
    assert after is not None and after["node"] == node_a and after["restarts"] == 1
    reconcile.down()
