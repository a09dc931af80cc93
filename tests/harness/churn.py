"""Churn between passes: deployments added, edited, rescaled, removed, engines crashed.

Some deployments run 2 or 3 replicas (one device each): every invariant is checked per
replica, and the churn keeps the declared replicas within the devices it is given.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time

import yaml

from controller.core.manifest.names import base_name, replica_name

from .cluster import Cluster, alive, marked

MAX_PRESENT = 4  # the cluster has 4 devices, one per replica


def pool(set_: str = "a") -> tuple[str, ...]:
    """The deployment names a manifest set draws from: ``a0`` ... ``a5``."""
    return tuple(f"{set_}{i}" for i in range(6))


def load(cluster: Cluster, set_: str, names: list[str]) -> int:
    """Devices ``names`` of one set take: one per replica."""
    return sum(cluster.replicas(n, set_) for n in names)


def _version(cluster: Cluster, name: str, set_: str) -> int:
    """The manifest's version (its engine's env): kept, a rescale changes no spec."""
    doc = yaml.safe_load((cluster.sets[set_] / f"{name}.yaml").read_text())
    return int(doc["spec"]["env"]["VERSION"])


def crash(cluster: Cluster, name: str) -> int | None:
    """SIGKILL one replica's engine (``web``, ``web@1``), as an OOM killer would; its
    pid, if it ran."""
    for proc in marked(cluster.node):
        if proc.name == name:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            while alive(proc.pid):
                time.sleep(0.005)
            return proc.pid
    return None


def _restarts(cluster: Cluster, name: str) -> int:
    try:
        data = json.loads((cluster.state / "instances" / f"{name}.json").read_text())
    except (OSError, ValueError):
        return 0
    return int(data.get("restarts", 0))


def full_churn(cluster: Cluster, rng: random.Random, set_: str = "a") -> dict[str, str]:
    """Exercise every path of a pass at once: stop, replace, crash-restart and start.

    Needs at least three deployments declared; keeps three declared afterwards.
    """
    present = sorted(cluster.declared()[set_])
    absent = [n for n in pool(set_) if n not in present]
    replicas = [replica_name(n, i) for n in present for i in range(cluster.replicas(n, set_))]
    fresh = [r for r in replicas if _restarts(cluster, r) == 0]
    victim = rng.choice(fresh or replicas)  # a first crash restarts at once: that path runs
    crashed = base_name(victim)
    gone, edited = rng.sample([n for n in present if n != crashed], 2)
    added = rng.choice(absent)
    room = MAX_PRESENT - load(cluster, set_, [n for n in present if n != gone])
    count = 2 if room >= 2 else 1  # a replicated deployment whenever it fits
    kept = cluster.replicas(edited, set_)
    cluster.remove(gone, set_)
    cluster.write(edited, set_, version=rng.randrange(1 << 30), replicas=kept)
    crash(cluster, victim)
    cluster.write(added, set_, replicas=count)
    return {"removed": gone, "edited": edited, "crashed": victim, "added": added}


def random_churn(
    cluster: Cluster,
    rng: random.Random,
    set_: str = "a",
    most: int = MAX_PRESENT,
    keep: frozenset[str] = frozenset(),
) -> list[str]:
    """A few random edits to one set's folder (and sometimes a crashed engine); the
    deployments in ``keep`` are never touched."""
    done = []
    for _ in range(rng.randint(1, 3)):
        present = sorted(cluster.declared()[set_] - keep)
        absent = [n for n in pool(set_) if n not in present]
        op = rng.choice(("add", "edit", "scale", "remove", "crash"))
        room = most - load(cluster, set_, present)
        if op == "add" and absent and room > 0:
            name = rng.choice(absent)
            cluster.write(name, set_, replicas=rng.randint(1, min(3, room)))
        elif op == "edit" and present:
            name = rng.choice(present)
            replicas = cluster.replicas(name, set_)
            cluster.write(name, set_, version=rng.randrange(1 << 30), replicas=replicas)
        elif op == "scale" and present:  # up within the devices, or down (highest go)
            name = rng.choice(present)
            now = cluster.replicas(name, set_)
            replicas = rng.randint(1, min(3, now + room))
            cluster.write(name, set_, version=_version(cluster, name, set_), replicas=replicas)
        elif op == "remove" and len(present) > 1:
            name = rng.choice(present)
            cluster.remove(name, set_)
        elif op == "crash" and present:
            name = rng.choice(present)
            replica = rng.randrange(cluster.replicas(name, set_))
            crash(cluster, replica_name(name, replica))
        else:
            continue
        done.append(f"{op} {name}")
    return done
