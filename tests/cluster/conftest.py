"""The namespace cluster: a head and three worker hosts, each a network namespace with
its own address and a Ray node (workers: one fake GPU each). Module-scoped (~25 s to
start); torn down (every process of every host, the namespaces, the bridge) however
the tests end. Skipped, saying why, where namespaces or Ray are not to be had."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import missing
import pytest

from .netns import Net, Unavailable
from .rayhosts import RayHosts
from .reconcile import Head

WORKERS = ("w1", "w2", "w3")


@pytest.fixture(scope="module")
def hosts() -> Iterator[RayHosts]:
    if importlib.util.find_spec("ray") is None:
        missing.skip("ray", "pip install -e '.[test,ray]'")
    # short: Ray's socket paths under it must fit AF_UNIX's 107 bytes
    tmp = Path(tempfile.mkdtemp(prefix="nsc-", dir="/tmp"))
    try:
        net = Net(["head", *WORKERS], tmp)
    except Unavailable as exc:
        pytest.skip(f"no namespace cluster here: {exc}")
    left: list[str] = []
    try:
        ray = RayHosts(net, "head", WORKERS, tmp)
        ray.start()
        yield ray
    finally:
        left = net.close()
        shutil.rmtree(tmp, ignore_errors=True)
    assert not left, f"the namespace cluster left: {left}"


@pytest.fixture
def head(hosts: RayHosts, tmp_path: Path) -> Iterator[Head]:
    """reconcile (the daemon, with its gateway) on the head's host, for one test, every
    worker an earlier test lost revived first."""
    hosts.whole()
    node = Head(hosts, tmp_path)
    try:
        yield node
    finally:
        node.close()
