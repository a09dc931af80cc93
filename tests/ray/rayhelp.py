"""Helpers of the Ray tests: our actors and our actors' engines, seen from outside."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import ray
from procs import cmdline
from ray.cluster_utils import Cluster

ACTOR_STATE = "RECONCILE_STATE=/tmp/reconcile-ray/"  # the actors' engines carry this
MARKS = (b"RECONCILE_STATE=", b"RECONCILE_INSTANCE=")  # whose engine it is
RAYLET = b"RAY_RAYLET_PID="  # an actor's engine inherits its raylet's pid
# The raylets of every cluster this test process started: another run's Ray cluster on
# the box (a second checkout's tests, `ray start` by hand) runs engines of the same form,
# which are not ours to wait for, name, or kill.
RAYLETS: set[int] = set()
HERE = Path(__file__).parent


class OwnCluster(Cluster):  # type: ignore[misc]
    """A ``Cluster`` that notes each node's raylet in ``RAYLETS`` (the head's too)."""

    def add_node(self, wait: bool = True, **node_args: Any) -> Any:
        node = super().add_node(wait=wait, **node_args)
        RAYLETS.update(info.process.pid for info in node.all_processes.get("raylet", []))
        return node


def ray_engines() -> set[int]:
    """Live processes started by one of our actors (their marker state is the actor's)
    on a node of one of our clusters."""
    found = set()
    needle = ACTOR_STATE.encode()
    raylets = {RAYLET + str(pid).encode() for pid in RAYLETS}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(entry.path, "environ").read_bytes()
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        items = env.split(b"\0")
        if state != "Z" and any(i.startswith(needle) for i in items) and raylets & set(items):
            found.add(int(entry.name))
    return found


def engines_gone(timeout: float = 60.0, *, kill: bool = False) -> None:
    """Wait for every actor's engine to be gone; else fail naming each one left (and
    SIGKILL them first with ``kill``: the cluster's teardown leaves nothing behind).

    An engine dies with its actor's process (``PR_SET_PDEATHSIG``), and Ray drops a
    killed actor's name, or returns from a cluster's shutdown, before that process has
    exited: on a loaded box the wait is seconds. A generous cap, and what was left if it
    is ever reached.
    """
    deadline = time.monotonic() + timeout
    while left := ray_engines():
        if time.monotonic() > deadline:
            shown = describe(left)
            for pid in left if kill else ():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise AssertionError(f"engines outlived their actors after {timeout:g}s: {shown}")
        time.sleep(0.05)


def describe(pids: set[int]) -> list[str]:
    """Each process: its pid, marker, age, command line, and its parent's."""
    out = []
    for pid in sorted(pids):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except (OSError, IndexError):
            out.append(f"{pid} (gone)")
            continue
        ppid, ticks = int(stat[1]), int(stat[19])
        age = _uptime() - ticks / os.sysconf("SC_CLK_TCK")
        marks = [i.decode(errors="replace") for i in env if i.startswith(MARKS)]
        out.append(f"{pid} {marks} {age:.0f}s old: {cmdline(pid)} (parent {ppid}: {cmdline(ppid)})")
    return out


def _uptime() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


def ours(namespace_prefix: str = "reconcile-") -> list[dict[str, str]]:
    """Named actors in our namespaces, across the cluster."""
    actors: list[dict[str, str]] = ray.util.list_named_actors(all_namespaces=True)
    return [a for a in actors if a["namespace"].startswith(namespace_prefix)]


STOP = 30.0  # s for an actor to kill its engine (a container: the runtime's stop and rm)


def end_ours() -> None:
    """What a test left on the cluster, ended from this process's driver as the backend's
    sweep ends an instance: each engine's actor asked to kill its engine now (a container's
    main process is the runtime's child, not the actor's, and would outlive it), then each
    actor of ours killed (the pull actors too). A `reconcile down` at each teardown did it
    through a driver of its own, started each time: 2-3 s a test, ~45 tests."""
    for found in ours():
        try:
            handle = ray.get_actor(found["name"], namespace=found["namespace"])
        except ValueError:
            continue  # gone meanwhile
        if not found["namespace"].endswith("-pulls"):  # an engine's actor: its stop first
            with contextlib.suppress(ray.exceptions.RayError):
                ray.get(handle.stop.remote(signal.SIGKILL, 0.0), timeout=STOP)
        ray.kill(handle, no_restart=True)


# The Ray modules' order (every other test keeps its place; the same on every worker, as
# xdist needs). test_ray_container.py first: its cluster starts with its runtimes'
# variables set (runtimes_env), and every later module's environment is a part of that,
# so they are handed the same cluster; in its alphabetical place, second, it stopped the
# first module's cluster and started another (~10 s of CPU, 15-25 s of the Ray unit's run).
# test_ray_head_loss.py last: it stops the shared cluster for one of its own, so in its
# alphabetical place the next module started the shared one again.
FIRST = HERE / "test_ray_container.py"
LAST = HERE / "test_ray_head_loss.py"


def order_modules(items: list[Any]) -> None:
    """The Ray modules' tests reordered in place (``pytest_collection_modifyitems``)."""
    ours = [i for i, item in enumerate(items) if item.path.is_relative_to(HERE)]
    rank = {FIRST: 0, LAST: 2}
    ordered = sorted((items[i] for i in ours), key=lambda item: rank.get(item.path, 1))
    for i, item in zip(ours, ordered, strict=True):
        items[i] = item
