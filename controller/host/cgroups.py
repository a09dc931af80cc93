"""A cgroup (v2) per engine: what reaches every process of an engine, whatever it did.

An engine's child that leaves its session (setsid, a double fork) and drops its
environment carries neither the engine's group nor its marker; the kernel still keeps
it in the cgroup it was born in. So a local process engine is spawned into a cgroup of
its own, ``reconcile-<state id>-<instance>-<nonce>``, a child of the spawning process's
own cgroup (the daemon's, or a `--once`'s), and its teardown kills every member of it
(``cgroup.kill``, else SIGKILL to each pid it lists until none is left), then removes it:
systemd's ``KillMode=control-group`` for one engine.

A child of our own cgroup, never a folder elsewhere: whatever kills the daemon's cgroup
(a container's end, a unit stopped with ``KillMode=control-group``) killed its engines
before and still does, and nothing that spared them (``KillMode=process``: engines
outlive the daemon, which adopts them) reaches them now. Used only where that cgroup is
ours to write:

- cgroup v2 mounted (pure, or hybrid's ``unified``) and the cgroup writable by us;
- on a host that systemd runs (``/run/systemd/system``), only a cgroup it delegated
  (the unit's ``Delegate=yes``: systemd marks it with the ``trusted.delegate`` or
  ``user.delegate`` xattr): writing into systemd's own tree is against its rules. A
  `--once` from cron there (cron.service's cgroup) or a login shell's scope is not
  delegated: the engine runs as before, found by its group and marker alone.

Anything else (cgroup v1 only, not root, macOS, a container whose cgroupfs is read-only)
is no error: ``parent()`` is None and every engine runs as it always did.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from pathlib import Path

PREFIX = "reconcile-"
POLL = 0.01
_DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")


def name(state_id: str, instance: str, nonce: str) -> str:
    """The cgroup of one run of an instance of one state dir (a restart's is another)."""
    return f"{PREFIX}{state_id}-{instance}-{nonce}"


def ours(path: str | None, state_id: str | None, nonce: str | None) -> Path | None:
    """``path`` if it is a cgroup this state dir made for run ``nonce``: a cgroup v2
    folder named as ``name`` names it. A spawn note read from disk is no proof alone:
    the name is what only our spawn gives, so a forged path reaches no other cgroup."""
    mount = _mount()
    if path is None or state_id is None or nonce is None or mount is None:
        return None
    cg = Path(path)
    if ".." in cg.parts or not cg.is_relative_to(mount) or cg == mount:
        return None
    base = cg.name
    if not (base.startswith(f"{PREFIX}{state_id}-") and base.endswith(f"-{nonce}")):
        return None
    return cg if (cg / "cgroup.procs").exists() else None


def of_pid(pid: int) -> Path | None:
    """The cgroup v2 folder ``pid`` is in (None: gone, or no v2 hierarchy)."""
    mount = _mount()
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::") and mount is not None:
            return mount / line[3:].lstrip("/")
    return None


def parent() -> Path | None:
    """Where this process may make engine cgroups: its own v2 cgroup, where ours to write."""
    own = of_pid(os.getpid())
    if own is None or not os.access(own, os.W_OK):
        return None
    if Path("/run/systemd/system").is_dir() and not _delegated(own):
        return None
    return own


def create(at: Path, cgroup_name: str) -> Path | None:
    """Make the cgroup (None where it cannot be: the engine runs without one)."""
    cg = at / cgroup_name
    try:
        cg.mkdir()
    except FileExistsError:
        pass
    except OSError:
        return None
    return cg


def join(cg: Path, pid: int) -> bool:
    """Move ``pid`` (the exec gate, before its exec) into ``cg``."""
    try:
        (cg / "cgroup.procs").write_text(f"{pid}\n")
    except OSError:
        return False
    return True


def members(cg: Path) -> list[int]:
    """The pids in ``cg`` now (none once it is gone)."""
    try:
        text = (cg / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def signal_all(cg: Path, sig: int, *, but_group: int | None = None) -> None:
    """``sig`` to each member: the kernel lists only processes inside our cgroup.
    ``but_group``: a process group that has just had ``sig`` (its leader and members
    are skipped): a stop signal is sent once to each process, as a second SIGTERM or
    SIGINT is a forced exit to many servers (uvicorn's, Python's own at shutdown)."""
    for pid in members(cg):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if but_group is None or (pid != but_group and os.getpgid(pid) != but_group):
                os.kill(pid, sig)


def kill(cg: Path, deadline: float) -> bool:
    """SIGKILL every member until none is left or ``deadline``; True once empty."""
    if not members(cg):
        return True
    with contextlib.suppress(OSError):  # 5.14+: atomic, forks in flight included
        (cg / "cgroup.kill").write_text("1\n")
    while time.monotonic() < deadline:
        if not members(cg):
            return True
        signal_all(cg, signal.SIGKILL)  # a kernel before cgroup.kill; or a late fork
        time.sleep(POLL)
    return not members(cg)


def clear(state_id: str, timeout: float) -> None:
    """Kill and remove every engine cgroup of the state dir ``state_id`` under
    ``parent()``: the cleanup of a harness that killed its engines by their marker, so
    no teardown removed their cgroups (a teardown clears its own run's)."""
    at = parent()
    if at is None:
        return
    deadline = time.monotonic() + timeout
    for cg in at.glob(f"{PREFIX}{state_id}-*"):
        kill(cg, deadline)
        remove(cg)


def named(at: Path, state_id: str, nonce: str) -> Path | None:
    """The cgroup under ``at`` of run ``nonce`` of the state dir ``state_id``, by its name
    alone: where no spawn note names it (its write failed), a teardown of that run still
    finds what the engine left there. A nonce is one run's; a state id is a fixed-length
    hex, so another state dir's cgroups never match."""
    head, tail = f"{PREFIX}{state_id}-", f"-{nonce}"
    try:  # names compared, not globbed: a nonce edited into a record is no pattern
        found = sorted(p for p in at.iterdir() if p.name.startswith(head) and p.name.endswith(tail))
    except OSError:
        return None
    return ours(str(found[0]), state_id, nonce) if found else None


def leftovers(at: Path, state_id: str, noted: set[str], settle: float) -> list[Path]:
    """This state dir's engine cgroups under ``at`` that no note names, hold no process
    and were made ``settle`` seconds ago or more (a spawn beside us may be about to
    move its engine into a newer one)."""
    head, now = f"{PREFIX}{state_id}-", time.time()
    try:
        found = [p for p in at.iterdir() if p.name.startswith(head)]
    except OSError:
        return []
    return [
        cg for cg in found
        if not any(cg.name.endswith(f"-{nonce}") for nonce in noted)
        and not members(cg) and _made_before(cg, now - settle)
    ]  # fmt: skip


def _made_before(cg: Path, when: float) -> bool:
    try:
        return cg.stat().st_mtime <= when
    except OSError:
        return False


def remove(cg: Path) -> None:
    """Remove an empty cgroup; one still populated, or gone, stays as it is."""
    with contextlib.suppress(OSError):
        cg.rmdir()


@functools.cache
def _mount() -> Path | None:
    """Where cgroup v2 is mounted with its root at our namespace's root: /sys/fs/cgroup,
    or /sys/fs/cgroup/unified on a hybrid host (cgroup v1 with the v2 tree beside)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if rest.split()[:1] == ["cgroup2"] and len(parts) > 4 and parts[3] == "/":
            return Path(parts[4])
    return None


def _delegated(cg: Path) -> bool:
    for attr in _DELEGATE_XATTRS:
        try:
            if os.getxattr(cg, attr) == b"1":
                return True
        except (OSError, AttributeError):  # AttributeError: no xattrs on this platform
            continue
    return False
