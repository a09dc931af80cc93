"""A fleet from one repository: three daemons (three state dirs, node names, label sets,
device inventories) follow ONE bare repository over file://; each runs exactly the
deployments whose spec.nodeSelector its node.yaml labels match, and a label change moves
a deployment from one node to another, never twice on one node. DESIGN.md "A fleet from
one repository"."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from procs import free_ports

from tests.conftest import Reconcile, _nothing_left
from tests.git.conftest import GitDaemon, Remote

# node -> (its labels, its devices): the inventories are disjoint, as on three boxes.
NODES = {
    "a": ({"gpu": "h100", "site": "lab", "pool": "batch"}, "nvidia:0,nvidia:1"),
    "b": ({"gpu": "a10", "site": "lab"}, "nvidia:2,nvidia:3"),
    "c": ({"site": "edge"}, "nvidia:4"),
}
# deployment -> its nodeSelector (each has a port of its own: the three "boxes" share
# this machine's ports, which a real fleet would not).
SELECTORS = {
    "big": {"gpu": "h100"},
    "mover": {"pool": "batch"},
    "small": {"gpu": "a10"},
    "edge": {"site": "edge"},
}
SHARE = {"a": {"big", "mover"}, "b": {"small"}, "c": {"edge"}}
GIT = ("--git-path", "manifests")


class Node:
    """One box of the fleet: the real CLI on its own state dir, and its daemon."""

    def __init__(self, rc: Reconcile, url: str) -> None:
        self.rc, self.url = rc, url
        self.daemon: GitDaemon | None = None

    def label(self, labels: dict[str, str]) -> None:
        """Write the node's node.yaml (in its state dir, where the daemon reads it)."""
        self.rc.state.mkdir(mode=0o700, exist_ok=True)
        (self.rc.state / "node.yaml").write_text(yaml.safe_dump({"labels": labels}))

    def start(self) -> None:
        log = self.rc.tmp / "daemon.log"
        with open(log, "wb") as err:
            proc = self.rc.popen("-v", "--resync", "1h", "--git", self.url, *GIT, stderr=err)
        self.daemon = GitDaemon(proc, log, self.rc)

    def reload(self) -> None:
        assert self.daemon is not None
        self.daemon.proc.send_signal(signal.SIGHUP)

    def running(self) -> dict[str, str]:
        """Deployment -> phase, from the node's records."""
        return {name: item["phase"] for name, item in self.rc.status().items()}

    def engines(self, name: str) -> set[int]:
        return self.rc.pids(name)

    def wait(self, predicate: Any, what: str) -> Any:
        assert self.daemon is not None
        return self.daemon.wait(predicate, f"node {self.rc.node}: {what}", timeout=90)


@pytest.fixture
def fleet(tmp_path: Path, remote: Remote) -> Iterator[dict[str, Node]]:
    nodes: dict[str, Node] = {}
    for key, (labels, devices) in NODES.items():
        (tmp_path / key).mkdir()
        rc = Reconcile(tmp_path / key)
        rc.devices = devices
        nodes[key] = Node(rc, remote.url)
        nodes[key].label(labels)
    yield nodes
    for node in nodes.values():  # the daemons first: a pass must not start what down stops
        if node.daemon is not None and node.daemon.proc.poll() is None:
            node.daemon.stop()
    for node in nodes.values():
        node.rc("--git", remote.url, *GIT, "down", check=None)
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


def test_three_nodes_each_run_their_share_and_a_label_change_moves_one(
    reconcile: Any, remote: Remote, fleet: dict[str, Node]
) -> None:
    remote.commit(manifests(reconcile), "a fleet of four deployments")
    for node in fleet.values():
        node.start()
    for key, node in fleet.items():
        want = {name: "Ready" for name in SHARE[key]}
        node.wait(lambda n=node, w=want: n.running() == w, f"exactly {sorted(want)} Ready")
    for key, node in fleet.items():  # the engines are real, and only the node's own
        for name in SELECTORS:
            assert bool(node.engines(name)) is (name in SHARE[key]), (key, name)
        assert set(node.running()) == SHARE[key]  # no record (no row) of the others
    # `plan` on a node says what it left to the others, and why.
    c = fleet["c"].rc  # no -f: the state dir remembers the repository it follows
    mine = ("--state-dir", str(c.state), "--node", c.node, "--devices", c.devices)
    said = c("plan", *mine, common=False, check=0).out
    assert "3 deployments skipped: nodeSelector gpu=a10; gpu=h100; pool=batch" in said, said
    table = c("status", check=0).out  # and so does `status`, above its table
    assert "3 deployments skipped: nodeSelector gpu=a10; gpu=h100; pool=batch" in table, table
    assert "do not match this node's labels" in said, said

    # `mover` goes from a to b: a loses pool=batch (it stops mover, as if its manifest
    # were removed, and keeps big untouched) ...
    a, b = fleet["a"], fleet["b"]
    (moved,) = a.engines("mover")
    kept = a.engines("big")
    a.label({"gpu": "h100", "site": "lab"})
    a.reload()
    a.wait(lambda: a.running() == {"big": "Ready"} and not a.engines("mover"), "mover stopped")
    assert not reconcile.alive(moved) and a.engines("big") == kept
    # ... a node.yaml that cannot be read stops nothing: the daemon keeps the last good
    # labels and says so ...
    small = b.engines("small")
    (b.rc.state / "node.yaml").write_text("labels: {pool: [batch]}\n")
    b.reload()
    failed = b.wait(
        lambda: [x for x in b.daemon.lines() if x.get("event", "").startswith("reload failed")],
        "the reload refused",
    )
    assert "node.yaml:1: labels" in failed[0]["error"], failed
    assert b.running() == {"small": "Ready"} and b.engines("small") == small
    # ... and b gains pool=batch: it starts mover once, beside small; a runs it no more.
    b.label({"gpu": "a10", "site": "lab", "pool": "batch"})
    b.reload()
    b.wait(lambda: b.running() == {"small": "Ready", "mover": "Ready"}, "mover Ready on b")
    assert len(b.engines("mover")) == 1 and b.engines("small") == small
    assert not a.engines("mover") and a.rc.record("mover") is None
    assert [e["action"] for e in a.rc.events("mover")].count("start") == 1, a.rc.events("mover")
    assert [e["action"] for e in b.rc.events("mover")].count("start") == 1, b.rc.events("mover")
    for node in fleet.values():
        assert node.daemon is not None and node.daemon.stop() == 0


def test_with_folders_a_label_change_prunes_and_an_unreadable_node_yaml_stops_nothing(
    reconcile: Any,
) -> None:
    node_yaml = reconcile.state / "node.yaml"
    reconcile.state.mkdir(mode=0o700)
    node_yaml.write_text("labels: {gpu: h100}\n")
    reconcile.write("big", nodeSelector={"gpu": "h100"})
    reconcile.write("other", nodeSelector={"gpu": "a10"})
    out = reconcile.once()
    note = "1 deployment skipped: nodeSelector gpu=a10 does not match this node's labels"
    assert note in out.out, out
    assert set(reconcile.status(cli=True)) == {"big"}  # no row for the other node's
    assert note in reconcile("status", check=0).out
    planned = reconcile("plan", "-o", "json", check=0).json()
    assert planned["skipped"] == {"other": "gpu=a10"} and planned["changes"] == [], planned
    (pid,) = reconcile.pids("big")

    node_yaml.write_text("labels: {gpu: h100\n")  # half-written: the pass is refused
    out = reconcile.once(check=1)
    assert f"{node_yaml}:" in out.err and "Traceback" not in out.err, out
    plan = reconcile("plan")  # a read verb goes on, warns, and would stop nothing
    assert "the node config's settings are ignored here" in plan.err, plan
    assert "skipped: this node's labels could not be read" in plan.out, plan
    assert "destroy" not in plan.out.replace("0 to destroy", ""), plan
    assert reconcile.pids("big") == {pid} and reconcile.record("big") is not None

    node_yaml.write_text("labels: {gpu: a10}\n")  # relabelled: big goes, other comes
    out = reconcile.once()
    assert "nodeSelector gpu=h100 does not match" in out.out, out
    assert not reconcile.alive(pid) and reconcile.record("big") is None
    assert set(reconcile.status()) == {"other"} and reconcile.pids("other")
    reconcile.down()


def test_a_broken_manifest_for_other_nodes_is_an_error_but_no_record_here(
    reconcile: Any,
) -> None:
    reconcile.state.mkdir(mode=0o700)
    (reconcile.state / "node.yaml").write_text("labels: {gpu: h100}\n")
    reconcile.write("mine", nodeSelector={"gpu": "h100"}, bogus=1)
    reconcile.write("theirs", nodeSelector={"gpu": "a10"}, bogus=1)
    out = reconcile.once(check=1)  # the repository holds errors: each is said
    assert "mine.yaml" in out.err and "theirs.yaml" in out.err, out
    assert "1 deployment skipped: nodeSelector gpu=a10" in out.out, out
    assert set(reconcile.status()) == {"mine"}  # invalid here: Pending, named
    assert reconcile.record("theirs") is None  # another node's to refuse
