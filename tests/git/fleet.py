"""A fleet from one repository, the scenario both fleet tests run: three nodes (state
dirs, node names, label sets, device inventories) whose daemons follow ONE repository,
each running exactly the deployments its labels select, then a label change that moves
one deployment from one node to another, never twice on one node. DESIGN.md "A fleet
from one repository".

``tests/git/test_fleet.py`` runs the three daemons side by side on this machine over
``file://``; ``tests/cluster/test_fleet_hosts.py`` runs each in a network-namespace host
of its own (its own address) over ``git://`` (a ``Node`` with a ``wrap`` prefix).
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from procs import free_ports

from tests.conftest import Reconcile, _nothing_left
from tests.git.conftest import GitDaemon

# node -> (its labels, its devices): the inventories are disjoint, as on three boxes.
NODES = {
    "a": ({"gpu": "h100", "site": "lab", "pool": "batch"}, "nvidia:0,nvidia:1"),
    "b": ({"gpu": "a10", "site": "lab"}, "nvidia:2,nvidia:3"),
    "c": ({"site": "edge"}, "nvidia:4"),
}
# deployment -> its nodeSelector (each has a port of its own: the three "boxes" of
# test_fleet.py share this machine's ports, which a real fleet would not).
SELECTORS = {
    "big": {"gpu": "h100"},
    "mover": {"pool": "batch"},
    "small": {"gpu": "a10"},
    "edge": {"site": "edge"},
}
SHARE = {"a": {"big", "mover"}, "b": {"small"}, "c": {"edge"}}
GIT = ("--git-path", "manifests")


class Node:
    """One box of the fleet: the real CLI on its own state dir, and its daemon (run
    through ``wrap``, e.g. ``ip netns exec NS``, where the box is a namespace host)."""

    def __init__(self, rc: Reconcile, url: str, wrap: Sequence[str] = ()) -> None:
        self.rc, self.url, self.wrap = rc, url, list(wrap)
        self.daemon: GitDaemon | None = None

    def label(self, labels: dict[str, str]) -> None:
        """Write the node's node.yaml (in its state dir, where the daemon reads it)."""
        self.rc.state.mkdir(mode=0o700, exist_ok=True)
        (self.rc.state / "node.yaml").write_text(yaml.safe_dump({"labels": labels}))

    def start(self) -> None:
        log = self.rc.tmp / "daemon.log"
        args = ("-v", "--resync", "1h", "--git", self.url, *GIT)
        with open(log, "wb") as err:
            if self.wrap:  # `ip netns exec` execs the CLI: a cold start
                proc = self.rc.spawn([*self.wrap, *self.rc.argv(*args)], stderr=err)
            else:  # forked warm, as the git_daemon fixture's (tests/warmcli.py)
                proc = self.rc.daemon(*args, stderr=err)
        self.daemon = GitDaemon(proc, log, self.rc)

    def reload(self) -> None:
        assert self.daemon is not None  # `ip netns exec` execs: the pid is the daemon's
        self.daemon.proc.send_signal(signal.SIGHUP)

    def running(self) -> dict[str, str]:
        """Deployment -> phase, from the node's records."""
        return {name: item["phase"] for name, item in self.rc.status().items()}

    def engines(self, name: str) -> set[int]:
        return self.rc.pids(name)

    def wait(self, predicate: Any, what: str) -> Any:
        assert self.daemon is not None
        return self.daemon.wait(predicate, f"node {self.rc.node}: {what}", timeout=90)


def make_fleet(
    tmp: Path, url: str, wraps: dict[str, Sequence[str]] | None = None
) -> dict[str, Node]:
    """The three nodes, labelled, their daemons not started."""
    nodes: dict[str, Node] = {}
    for key, (labels, devices) in NODES.items():
        (tmp / key).mkdir()
        rc = Reconcile(tmp / key)
        rc.devices = devices
        nodes[key] = Node(rc, url, (wraps or {}).get(key, ()))
        nodes[key].label(labels)
    return nodes


def close_fleet(nodes: dict[str, Node], url: str) -> None:
    """The daemons first (a pass must not start what down stops), then each node's down;
    fails naming any engine left."""
    for node in nodes.values():
        if node.daemon is not None and node.daemon.proc.poll() is None:
            node.daemon.stop()
    for node in nodes.values():
        node.rc("--git", url, *GIT, "down", check=None)
        _nothing_left(node.rc)


def manifests(reconcile: Any) -> dict[str, str | None]:
    port = free_ports(len(SELECTORS))
    out: dict[str, str | None] = {}
    for i, (name, selector) in enumerate(sorted(SELECTORS.items())):
        spec = {
            "port": port + i,
            "devices": {"count": 1, "kind": "nvidia"},
            "nodeSelector": selector,
        }
        out[f"manifests/{name}.yaml"] = reconcile.dump_yaml(reconcile.deployment(name, **spec))
    return out


def each_runs_its_share(fleet: dict[str, Node]) -> None:
    """Every node's daemon started; each runs exactly its share, Ready, and keeps no
    record (no row) of the others'."""
    for node in fleet.values():
        node.start()
    for key, node in fleet.items():
        want = {name: "Ready" for name in SHARE[key]}
        node.wait(lambda n=node, w=want: n.running() == w, f"exactly {sorted(want)} Ready")
    for key, node in fleet.items():  # the engines are real, and only the node's own
        for name in SELECTORS:
            assert bool(node.engines(name)) is (name in SHARE[key]), (key, name)
        assert set(node.running()) == SHARE[key]


def mover_leaves_a(reconcile: Any, fleet: dict[str, Node]) -> None:
    """``a`` loses pool=batch: it stops mover, as if its manifest were removed, and keeps
    big untouched."""
    a = fleet["a"]
    (moved,) = a.engines("mover")
    kept = a.engines("big")
    a.label({"gpu": "h100", "site": "lab"})
    a.reload()
    a.wait(lambda: a.running() == {"big": "Ready"} and not a.engines("mover"), "mover stopped")
    assert not reconcile.alive(moved) and a.engines("big") == kept


def mover_reaches_b(fleet: dict[str, Node], small: set[int]) -> None:
    """``b`` gains pool=batch: it starts mover once, beside small (``small``: its engine,
    untouched); ``a`` runs it no more and keeps no record of it."""
    a, b = fleet["a"], fleet["b"]
    b.label({"gpu": "a10", "site": "lab", "pool": "batch"})
    b.reload()
    b.wait(lambda: b.running() == {"small": "Ready", "mover": "Ready"}, "mover Ready on b")
    assert len(b.engines("mover")) == 1 and b.engines("small") == small
    assert not a.engines("mover") and a.rc.record("mover") is None
    assert [e["action"] for e in a.rc.events("mover")].count("start") == 1, a.rc.events("mover")
    assert [e["action"] for e in b.rc.events("mover")].count("start") == 1, b.rc.events("mover")


def stop_all(fleet: dict[str, Node]) -> None:
    for node in fleet.values():
        assert node.daemon is not None and node.daemon.stop() == 0
