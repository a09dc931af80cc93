"""A spec.container engine on the ray backend: the actor runs the container on its node.

Real Ray (the local cluster of conftest.py) and real podman (the image and configuration
of tests/containers/conftest.py). The podman configuration this sandbox needs reaches
the actors through the environment their raylets inherit, so it is set before the
module's cluster starts (a normal host needs none).
"""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from containers.conftest import STANDIN, Engine, podman  # noqa: F401 (the fixture)
from procs import wait_for
from rayhelp import engines_gone, ours

from controller.host.containers import INSTANCE_LABEL, STATE_LABEL

Reconcile = Any  # the `reconcile` fixture of tests/conftest.py


@pytest.fixture(scope="module", autouse=True)
def podman_env(podman: Engine) -> Iterator[None]:  # noqa: F811 (the imported fixture)
    """Before ``cluster`` (an autouse fixture of its scope comes first): Ray's workers
    get the environment the cluster's processes start with."""
    saved = {k: os.environ.get(k) for k in podman.env}
    os.environ.update(podman.env)
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def rc(cluster: Any, reconcile: Reconcile, podman: Engine) -> Iterator[Reconcile]:  # noqa: F811
    r = reconcile
    r.env.update(RECONCILE_BACKEND="ray", RECONCILE_RAY_ADDRESS=cluster.address, **podman.env)
    yield r
    r("down", check=None)
    wait_for(lambda: not ours(), timeout=30, what="our actors gone")
    engines_gone()


def labelled(engine: Engine, label: str) -> list[str]:
    """Every container (any state) carrying ``label`` (``key=value``)."""
    return engine.cli("ps", "-a", "-q", "--no-trunc", "--filter", f"label={label}").split()


def health(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=5) as answer:
        body: str = answer.read().decode()
        return body


def test_the_actor_runs_the_container_on_its_node_and_down_removes_it(
    rc: Reconcile,
    podman: Engine,  # noqa: F811
) -> None:
    container = {"image": podman.image, "runtime": "podman"}
    rc.write("rbox", command=STANDIN, container=container, stopGracePeriodSeconds=2)
    rc.converge(timeout="120s")
    item = rc.status()["rbox"]
    assert item["backend"] == "ray" and item["phase"] == "Ready", item
    assert health(item["host"], item["port"]) == "ok\n"
    record = rc.record("rbox")
    assert record is not None
    kept = record["container"]
    assert kept is not None and kept["runtime"] == "podman" and kept["image"] == podman.image
    assert kept["digest"].startswith("sha256:")
    # The record's pid is the container's main process as the node sees it, with the
    # actor's marker and the labels that make the container ours.
    seen = podman.inspect(kept["id"])
    assert seen["State"]["Pid"] == record["ref"]["pid"]
    labels = seen["Config"]["Labels"]
    marker = labels[INSTANCE_LABEL]
    assert marker == f"{item['node']}/rbox/{record['nonce']}"
    state = labels[STATE_LABEL]
    assert state.startswith("/tmp/reconcile-ray/"), state
    env = rc.environ(record["ref"]["pid"])
    assert env["RECONCILE_INSTANCE"] == marker and env["PORT"] == str(item["port"])
    # The engine's output reaches its log on the node, read through the actor.
    logs = rc("logs", "rbox", check=0)
    assert f"engine rbox on port {item['port']}" in logs.out, str(logs)

    # The container's main process killed by hand: the actor runs a new container.
    os.kill(record["ref"]["pid"], signal.SIGKILL)

    def replaced() -> bool:
        rc("--once", check=None)
        now = rc.record("rbox")
        return bool(now and now["container"] and now["container"]["id"] != kept["id"])

    wait_for(replaced, timeout=90, what="a new container for rbox")
    again = rc.record("rbox")
    assert again is not None
    wait_for(lambda: len(labelled(podman, f"{STATE_LABEL}={state}")) == 1, timeout=30,
             what="the killed container removed")  # fmt: skip

    # down: the actor stops its container, which is then gone (no leak).
    rc("down", check=0)
    wait_for(lambda: not ours(), timeout=30, what="our actors gone")
    assert labelled(podman, f"{STATE_LABEL}={state}") == []
