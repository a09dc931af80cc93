"""A real Ray cluster on this box: a head with no GPU and three one-GPU nodes (fake GPUs).

Module-scoped: starting it takes ~12-20 s on 2 cores. A module's cluster is handed to the
next module that asks for one when it is as it started (its three nodes alive) and it was
started with every variable of the environment the next module runs in (the raylets pass
theirs to the actors: test_ray_container.py sets its runtimes' first); else it is shut
down and another one started. The last one is shut down after the last module that uses
one. Teardown shuts Ray down and FAILS if any engine started through an actor of these
clusters is still alive a minute later (an engine never outlives its actor); another
run's cluster on the box, and its engines, are left alone.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("ray") is None:  # not installed: `pip install -e '.[test,ray]'`
    collect_ignore_glob = ["test_*.py"]
else:
    import ray
    from rayhelp import OwnCluster, engines_gone, order_modules

MB = 1 << 20
WORKERS = 3
HERE = Path(__file__).parent


class Held:
    """The cluster a module started, with the environment it was started in."""

    def __init__(self) -> None:
        self.cluster: Any = None
        self.env: dict[str, str] = {}

    def fits(self, env: dict[str, str]) -> bool:
        if self.cluster is None or not env.items() <= self.env.items():
            return False
        alive = [n for n in ray.nodes() if n["Alive"]]
        return len(self.cluster.worker_nodes) == WORKERS and len(alive) == WORKERS + 1

    def start(self, env: dict[str, str]) -> Any:
        head = {
            "num_cpus": 1,
            "num_gpus": 0,
            "object_store_memory": 80 * MB,
            "include_dashboard": False,
            # a lost node is noticed in ~3 s instead of ~30 s
            "_system_config": {
                "health_check_period_ms": 1000,
                "health_check_failure_threshold": 3,
            },
        }
        self.cluster, self.env = OwnCluster(initialize_head=True, head_node_args=head), env
        for _ in range(WORKERS):
            self.cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=80 * MB)
        self.cluster.wait_for_nodes()
        ray.init(address=self.cluster.address, log_to_driver=False, configure_logging=False)
        return self.cluster

    def stop(self) -> None:
        if self.cluster is None:
            return
        try:
            ray.shutdown()
            self.cluster.shutdown()
        finally:
            self.cluster = None
        engines_gone(kill=True)  # each dies with its actor's process, which shutdown ended


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if importlib.util.find_spec("ray") is not None:  # else no test here is collected
        order_modules(items)


# Not compared: pytest's, and the one `ray.init` sets in this process once the nodes run
# (no node has it): counted, it made the module after the first start a cluster again.
NOT_COMPARED = ("PYTEST_CURRENT_TEST", "PYTHONBREAKPOINT")


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in NOT_COMPARED}


@pytest.fixture(scope="session")
def held_cluster() -> Iterator[Held]:
    held = Held()
    try:
        yield held
    finally:
        held.stop()


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, held_cluster: Held) -> Iterator[Any]:
    env = _environment()
    if not held_cluster.fits(env):
        held_cluster.stop()
        try:
            held_cluster.start(env)
        except BaseException:
            held_cluster.stop()
            raise
    yield held_cluster.cluster
    if not _used_later(request):
        held_cluster.stop()


def _used_later(request: pytest.FixtureRequest) -> bool:
    """Whether a test of this folder after this module's (in the run's order) asks for
    ``cluster`` (tests/harness has a fixture of that name too)."""
    mine = f"{request.node.nodeid}::"
    items = request.session.items
    last = max((i for i, item in enumerate(items) if item.nodeid.startswith(mine)), default=-1)
    return any(
        item.path.is_relative_to(HERE) and "cluster" in getattr(item, "fixturenames", ())
        for item in items[last + 1 :]
    )
