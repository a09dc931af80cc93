"""Starting pull processes and finding the running ones by their marker.

A pull gets its own session (a pass ending, or the daemon stopping, leaves it
running), stdin from /dev/null and its output in the entry's ``pull.log``; its
environment carries ``RECONCILE_PULL=<entry folder>``, which is how a later pass (any
process) knows the pull is there, as engines are known by ``RECONCILE_INSTANCE``, and
the job itself (``RECONCILE_PULL_JOB``: never the argv, which `ps` shows to all). It
carries its state dir's path and id (``RECONCILE_STATE``, ``RECONCILE_STATE_ID``) as an
engine does: a pull of another state dir at this path (its disk not mounted, the folder
replaced) writes into this folder's cache and journal, and a pass refuses to act beside it
as beside such an engine (``of_state_dir``; ``reconciler/replaced.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from controller.host.procscan import EnvironScan
from controller.pull.job import JOB_ENV, Job
from controller.store.config import stateid
from controller.store.models.modelcache import CacheEntry

MARKER = "RECONCILE_PULL"
STATE = "RECONCILE_STATE"
STATE_ID = "RECONCILE_STATE_ID"  # as an engine's (backends/local/runtime.py)
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
    env |= {MARKER: str(entry.folder), STATE: str(job.state_dir.resolve())}  # as engines'
    env.pop(STATE_ID, None)  # a fact of ours, never the environment's word
    known = stateid.peek(job.state_dir)  # made by the pass before it starts anything
    if known is not None:
        env[STATE_ID] = known
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


@dataclass(frozen=True, slots=True)
class PullProcess:
    """A live pull process, as its environment says: its cache entry, and the state dir
    whose pass started it (its id: None from a reconcile that did not say)."""

    pid: int
    key: str
    state_id: str | None
    deployments: tuple[str, ...]


def of_state_dir(state_dir: Path, scan: EnvironScan | None = None) -> list[PullProcess]:
    """Each live pull process started by a pass on the state dir at ``state_dir``'s path:
    this one's, or another's at the same path (told apart by ``state_id``)."""
    prefix = f"{MARKER}=".encode()
    here = f"{STATE}={state_dir}".encode()
    found = []
    for pid, environ in (scan or EnvironScan())(prefix):
        items = environ.split(b"\0")
        folder = _value(items, MARKER)
        if here in items and folder is not None:  # the whole variable: /a is not /a/b
            found.append(
                PullProcess(pid, Path(folder).name, _value(items, STATE_ID), _waiting(items))
            )
    return found


def _waiting(items: Sequence[bytes]) -> tuple[str, ...]:
    """The deployments its job names (none from a job that cannot be read)."""
    try:
        names = json.loads(_value(items, JOB_ENV) or "{}").get("deployments", [])
    except (ValueError, AttributeError):
        return ()
    return tuple(str(n) for n in names) if isinstance(names, list) else ()


def _value(items: Sequence[bytes], variable: str) -> str | None:
    prefix = f"{variable}=".encode()
    found = next((i for i in items if i.startswith(prefix)), None)
    return None if found is None else os.fsdecode(found[len(prefix) :])


def _reap() -> None:
    _children[:] = [(folder, c) for folder, c in _children if c.poll() is None]
