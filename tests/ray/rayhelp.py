"""Helpers of the Ray tests: our actors and our actors' engines, seen from outside."""

from __future__ import annotations

import os
from pathlib import Path

import ray

ACTOR_STATE = "RECONCILE_STATE=/tmp/reconcile-ray/"  # the actors' engines carry this


def ray_engines() -> set[int]:
    """Live processes started by one of our actors (their marker state is the actor's)."""
    found = set()
    needle = ACTOR_STATE.encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            env = Path(entry.path, "environ").read_bytes()
            state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(i.startswith(needle) for i in env.split(b"\0")):
            found.add(int(entry.name))
    return found


def ours(namespace_prefix: str = "reconcile-") -> list[dict[str, str]]:
    """Named actors in our namespaces, across the cluster."""
    actors: list[dict[str, str]] = ray.util.list_named_actors(all_namespaces=True)
    return [a for a in actors if a["namespace"].startswith(namespace_prefix)]
