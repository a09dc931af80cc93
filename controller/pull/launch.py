"""Starting pull processes and finding the running ones by their marker.

A pull gets its own session (a pass ending, or the daemon stopping, leaves it
running), stdin from /dev/null and its output in the entry's ``pull.log``; its
environment carries ``RECONCILE_PULL=<entry folder>``, which is how a later pass (any
process) knows the pull is there, as engines are known by ``RECONCILE_INSTANCE``, and
the job itself (``RECONCILE_PULL_JOB``: never the argv, which `ps` shows to all).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from controller.host.procscan import EnvironScan
from controller.pull.job import JOB_ENV, Job
from controller.store.models.modelcache import CacheEntry

MARKER = "RECONCILE_PULL"
# Children this process started, by their entry folder: polled so none stays a zombie
# while the daemon runs, and counted as running while they live (see ``running``).
_children: list[tuple[Path, subprocess.Popen[bytes]]] = []


def spawn(job: Job, settings: Mapping[str, str] | None = None) -> int:
    """Start the pull of ``job``; its pid. ``settings``: the deployment's own hub
    variables (:func:`~controller.pull.job.hub_env`), over the daemon's."""
    _reap()
    entry = CacheEntry.of(job.cache, job.source.key)
    entry.ensure()
    env = {**os.environ, **(settings or {})}
    env |= {MARKER: str(entry.folder), "RECONCILE_STATE": str(job.state_dir)}
    # The job (its URL, a ?token= with it) in the environment, which only its owner may
    # read: an argv is shown to every local user by `ps`.
    env[JOB_ENV] = job.to_json()
    with (entry.folder / "pull.log").open("ab") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "controller.pull"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _children.append((entry.folder, child))
    return child.pid


def running(root: Path, scan: EnvironScan | None = None) -> dict[str, int]:
    """Cache key -> pid of each live pull process of the cache at ``root``."""
    _reap()
    prefix = f"{MARKER}=".encode()
    found: dict[str, int] = {}
    for pid, environ in (scan or EnvironScan())(prefix):
        for item in environ.split(b"\0"):
            if item.startswith(prefix):
                folder = Path(os.fsdecode(item[len(prefix) :]))
                if folder.parent == root:
                    found[folder.name] = pid
    # Popen returns once the exec has begun, and the kernel gives the new program its
    # environment a moment later: a pull just spawned can read as having none, so a
    # pass's next round would start a second pull of the same file. Ours count anyway.
    for folder, child in _children:
        if folder.parent == root and child.poll() is None:
            found.setdefault(folder.name, child.pid)
    return found


def _reap() -> None:
    _children[:] = [(folder, c) for folder, c in _children if c.poll() is None]
