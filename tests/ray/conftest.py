"""A real Ray cluster on this box: a head with no GPU and three one-GPU nodes (fake GPUs).

Module-scoped: starting it takes ~20 s on 2 cores. Teardown shuts Ray down and FAILS if
any engine started through an actor is still alive a minute later (an engine never
outlives its actor).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

if importlib.util.find_spec("ray") is None:  # not installed: `pip install -e '.[test,ray]'`
    collect_ignore_glob = ["test_*.py"]
else:
    import ray
    from ray.cluster_utils import Cluster
    from rayhelp import engines_gone

MB = 1 << 20


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    head = {
        "num_cpus": 1,
        "num_gpus": 0,
        "object_store_memory": 80 * MB,
        "include_dashboard": False,
        # a lost node is noticed in ~3 s instead of ~30 s
        "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3},
    }
    c = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(3):
            c.add_node(num_cpus=1, num_gpus=1, object_store_memory=80 * MB)
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False, configure_logging=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
    engines_gone(kill=True)  # each dies with its actor's process, which shutdown ended
