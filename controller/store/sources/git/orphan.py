"""The git a reconcile leaves running when it dies mid-fetch (SIGKILL, the OOM killer).

git inherits git.lock's descriptor (``gitsource.git``'s ``hold``), so no second git ever
runs beside it in the checkout. But a git whose reconcile was killed has nobody left to
stop it at its limit: a fetch from a remote that never answers would hold the checkout,
and so every later fetch and move, for good. So each git started under the lock is
written down as it starts (``<state>/git/running.json``: its identity and its
reconcile's, pid and start time). A wait for git.lock (``GitSource.hold``: a fetch, a
`--once`'s move, a rollback's pin; a daemon's pass only tries it, and runs on the commit
applied) that finds it held (at once, or at a look every few seconds while it waits: its
holder may be killed meanwhile), the reconcile named there gone and the git
named there still the same process, stops that git's process group (its helpers with it: git
runs in a session of its own, so the group's id is its pid) and takes the lock. The
orphan's work is discarded: a git cut short leaves what a SIGKILL does, which the next
sync handles (stale ``*.lock`` files, the ``moving`` marker).

Nothing else is ever signalled: a pid alone proves nothing (pids are reused), a pid with
its start time does (``ProcessRef.same_process``, as for engines: invariant 6). Process
identities are the host's to read (``host.procs.identity``): the caller hands that in.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from controller.core.state import ProcessRef
from controller.logsetup import get_logger
from controller.store.documents import Document, check_version
from controller.store.statedir import StateDir

log = get_logger("reconcile")

VERSION = 1
Identify = Callable[[int], ProcessRef | None]  # a pid's identity now; None: no such process
HOUSEKEEPING = "gc"  # the git command a rollback waiting for git.lock stops, whoever runs it


@dataclass(frozen=True, kw_only=True, slots=True)
class Running:
    git: ProcessRef  # the git started under git.lock (its process group's id is its pid)
    by: ProcessRef  # the reconcile that started it, and stops it at its limit
    verb: str = ""  # git's command (``gc``: housekeeping); "" in a file written before it


def _decode(data: Any) -> Running:
    check_version(data, VERSION)
    verb = data.get("verb", "")
    return Running(
        git=ProcessRef(**data["git"]),
        by=ProcessRef(**data["by"]),
        verb=verb if isinstance(verb, str) else "",
    )


def _encode(value: Running) -> dict[str, Any]:
    git, by = asdict(value.git), asdict(value.by)
    return {"version": VERSION, "git": git, "by": by, "verb": value.verb}


def _document(state_dir: Path) -> Document[Running]:
    state = StateDir(state_dir)
    return Document(state, state.git_running, _decode, _encode)


def note(state_dir: Path, pid: int, identify: Identify, *, verb: str = "") -> None:
    """``pid``, a git just started under git.lock by this process (running ``verb``),
    written down. A git that cannot be written down (a full disk, or it ended already) is
    only left to wait on, as before, should we die: never a reason to fail the fetch."""
    git, by = identify(pid), identify(os.getpid())
    if git is None or by is None:
        return
    try:
        _document(state_dir).write(Running(git=git, by=by, verb=verb))
    except OSError as exc:
        log.warning("cannot write down the git started", path=str(state_dir), error=str(exc))


def orphan(state_dir: Path, identify: Identify) -> ProcessRef | None:
    """The git written down, when it still runs and the reconcile that started it does not."""
    found = _document(state_dir).read()
    if found is None or _same(found.by, identify) or not _same(found.git, identify):
        return None
    return found.git


def housekeeping(state_dir: Path, identify: Identify) -> ProcessRef | None:
    """The git written down when it is a collection (``gc``) still running, whoever's: a
    rollback's move does not wait on housekeeping (the next fetch collects again)."""
    found = _document(state_dir).read()
    if found is None or found.verb != HOUSEKEEPING or not _same(found.git, identify):
        return None
    return found.git


def stop_housekeeping(git: ProcessRef) -> None:
    """SIGKILL to a collection's process group: git's gc is safe to cut short (what it
    leaves, ``GitSource._unlock`` removes before the next fetch or move)."""
    _kill(
        git,
        "git gc stopped: a rollback's move goes first",
        "housekeeping under the checkout's lock; the next fetch collects again",
    )


def stop(git: ProcessRef) -> None:
    """SIGKILL to the orphan's process group (the fetch's ssh or remote-https too)."""
    _kill(
        git,
        "git left running by a reconcile that died; stopped",
        "its reconcile was killed mid-fetch: nothing would stop it at its limit",
    )


def _kill(git: ProcessRef, said: str, why: str) -> None:
    log.warning(said, pid=git.pid, detail=why)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(git.pid, signal.SIGKILL)


def _same(ref: ProcessRef, identify: Identify) -> bool:
    now = identify(ref.pid)
    return now is not None and ref.same_process(now)
