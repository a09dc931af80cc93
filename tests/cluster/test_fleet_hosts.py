"""A fleet across addresses: each host of the namespace cluster (its own network
namespace and address on one bridge; no Ray here) runs its own reconcile daemon as its
own node, with its own state dir and node.yaml labels, and all of them follow ONE bare
repository that ``git daemon`` serves on the bridge's address (``git://``, reached from
every host as from another machine). Each runs exactly its share, each engine runs inside
its own node's host, and a label change moves one deployment from one host to another.
The scenario is tests/git/fleet.py's, as tests/git/test_fleet.py runs it on one box."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import free_ports

from tests.conftest import Reconcile
from tests.git.conftest import Remote
from tests.git.fleet import (
    NODES,
    SHARE,
    Node,
    close_fleet,
    each_runs_its_share,
    make_fleet,
    manifests,
    mover_leaves_a,
    mover_reaches_b,
    stop_all,
)

from .netns import Net, Unavailable


@pytest.fixture
def net(tmp_path: Path) -> Iterator[Net]:
    """One host per fleet node (a, b, c); everything torn down after the test's fleet."""
    try:
        hosts = Net(list(NODES), tmp_path / "hosts")
    except Unavailable as exc:
        pytest.skip(f"no namespace hosts here: {exc}")
    try:
        yield hosts
    finally:
        left = hosts.close()
    assert not left, f"the namespace hosts left: {left}"


@pytest.fixture
def served(tmp_path: Path, reconcile: Reconcile, net: Net) -> tuple[Remote, str]:
    """The bare repository, and its git:// URL on the bridge's address (``git daemon``,
    a helper of the ``reconcile`` fixture: killed at its teardown)."""
    remote = Remote(tmp_path / "git", reconcile)
    port = free_ports(1)
    root = str(remote.bare.parent)
    argv = ["git", "daemon", "--reuseaddr", "--export-all", f"--base-path={root}"]
    reconcile.spawn([*argv, f"--listen={net.address}", f"--port={port}", root])
    reconcile.wait_for(lambda: _accepts(net.address, port), timeout=30, what="git daemon up")
    return remote, f"git://{net.address}:{port}/{remote.bare.name}"


@pytest.fixture
def fleet(tmp_path: Path, served: tuple[Remote, str], net: Net) -> Iterator[dict[str, Node]]:
    """Node ``x``'s daemon runs on host ``x`` (``ip netns exec``)."""
    url = served[1]
    wraps = {key: ["ip", "netns", "exec", net.hosts[key].name] for key in NODES}
    nodes = make_fleet(tmp_path, url, wraps)
    yield nodes
    close_fleet(nodes, url)


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def test_each_host_runs_its_share_and_a_label_change_moves_one_across_hosts(
    reconcile: Any, served: tuple[Remote, str], fleet: dict[str, Node], net: Net
) -> None:
    remote, url = served
    remote.commit(manifests(reconcile), "a fleet of four deployments")
    each_runs_its_share(fleet)
    for key, node in fleet.items():  # fetched over the bridge, and run on its own host
        source = node.rc("source", "-o", "json", check=0).json()
        assert source["url"] == url and source["state"] == "Synced", source
        engines = {pid for name in SHARE[key] for pid in node.engines(name)}
        assert engines and engines <= set(net.pids(key)), (key, engines, net.pids(key))

    mover_leaves_a(reconcile, fleet)
    mover_reaches_b(fleet, fleet["b"].engines("small"))
    (moved,) = fleet["b"].engines("mover")
    assert moved in net.pids("b") and moved not in net.pids("a")
    stop_all(fleet)
