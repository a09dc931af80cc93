"""Helpers of the Ray tests: our actors and our actors' engines, seen from outside."""

from __future__ import annotations

import os
import time
from pathlib import Path

import ray
from procs import cmdline

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


def engines_gone(timeout: float = 60.0) -> None:
    """Wait for every actor's engine to be gone; else fail naming each one left.

    An engine dies with its actor's process (``PR_SET_PDEATHSIG``), and Ray drops a
    killed actor's name before that process has exited: on a loaded box the wait is
    seconds. A generous cap, and what was left if it is ever reached.
    """
    deadline = time.monotonic() + timeout
    while left := ray_engines():
        if time.monotonic() > deadline:
            raise AssertionError(f"engines outlived their actors: {describe(left)}")
        time.sleep(0.05)


def describe(pids: set[int]) -> list[str]:
    """Each process as ``pid (parent PPID: its command line): its command line``."""
    out = []
    for pid in sorted(pids):
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            ppid = 0
        out.append(f"{pid} (parent {ppid}: {cmdline(ppid)}): {cmdline(pid)}")
    return out


def ours(namespace_prefix: str = "reconcile-") -> list[dict[str, str]]:
    """Named actors in our namespaces, across the cluster."""
    actors: list[dict[str, str]] = ray.util.list_named_actors(all_namespaces=True)
    return [a for a in actors if a["namespace"].startswith(namespace_prefix)]
