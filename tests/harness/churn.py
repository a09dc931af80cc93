"""Churn between passes: deployments added, edited, removed, and engines crashed."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time

from .cluster import Cluster, alive, marked

MAX_PRESENT = 4  # the cluster has 4 devices, one per deployment


def pool(set_: str = "a") -> tuple[str, ...]:
    """The deployment names a manifest set draws from: ``a0`` ... ``a5``."""
    return tuple(f"{set_}{i}" for i in range(6))


def crash(cluster: Cluster, name: str) -> int | None:
    """SIGKILL one deployment's engine (as an OOM killer would); its pid, if it ran."""
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
    fresh = [n for n in present if _restarts(cluster, n) == 0]
    crashed = rng.choice(fresh or present)  # a first crash restarts at once: that path runs
    gone, edited = rng.sample([n for n in present if n != crashed], 2)
    added = rng.choice(absent)
    cluster.remove(gone, set_)
    cluster.write(edited, set_, version=rng.randrange(1 << 30))
    crash(cluster, crashed)
    cluster.write(added, set_)
    return {"removed": gone, "edited": edited, "crashed": crashed, "added": added}


def random_churn(
    cluster: Cluster, rng: random.Random, set_: str = "a", most: int = MAX_PRESENT
) -> list[str]:
    """A few random edits to one set's folder (and sometimes a crashed engine)."""
    done = []
    for _ in range(rng.randint(1, 3)):
        present = sorted(cluster.declared()[set_])
        absent = [n for n in pool(set_) if n not in present]
        op = rng.choice(("add", "edit", "remove", "crash"))
        if op == "add" and absent and len(present) < most:
            name = rng.choice(absent)
            cluster.write(name, set_)
        elif op == "edit" and present:
            name = rng.choice(present)
            cluster.write(name, set_, version=rng.randrange(1 << 30))
        elif op == "remove" and len(present) > 1:
            name = rng.choice(present)
            cluster.remove(name, set_)
        elif op == "crash" and present:
            name = rng.choice(present)
            crash(cluster, name)
        else:
            continue
        done.append(f"{op} {name}")
    return done
