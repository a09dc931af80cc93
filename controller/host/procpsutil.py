"""Process facts through psutil: for hosts without ``/proc`` (macOS, the BSDs).

Linux keeps the fast path (one read of ``/proc/<pid>/stat``, a scan of
``/proc/*/environ``): psutil opens more files per question. ``RECONCILE_PROCFS=psutil``
forces this path on Linux too, so CI keeps it correct where nobody runs macOS.
Environments come back in ``/proc/<pid>/environ``'s layout (``K=V\\0``...), so the
marker parsing above is the same on both paths.
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterator

from controller.errors import ConfigError

CHOICES = ("", "proc", "psutil")  # "": /proc where it exists, else psutil
_choice = os.environ.get("RECONCILE_PROCFS", "")
ACTIVE = _choice == "psutil" or (_choice == "" and not os.path.exists("/proc/self/stat"))

# psutil's status words -> the one letter /proc/<pid>/stat gives
_STATES = {"zombie": "Z", "running": "R", "stopped": "T"}
# psutil is imported inside the functions below: the /proc path never pays for it.


def check_supported() -> None:
    """Refuse, saying why, where neither path can tell one process from another."""
    if _choice not in CHOICES:
        raise ConfigError(f"RECONCILE_PROCFS={_choice!r}: expected 'proc', 'psutil' or unset")
    if not ACTIVE:
        return
    import psutil

    try:
        me = psutil.Process(os.getpid())
        me.create_time()
        me.environ()
    except (psutil.Error, NotImplementedError, OSError) as exc:
        raise ConfigError(
            f"reconcile cannot read process identities on this platform ({sys.platform}): "
            f"there is no /proc, and psutil cannot give start times and environments "
            f"here ({exc}). Supported: Linux, macOS"
        ) from exc


def stat(pid: int) -> tuple[float, int, str] | None:
    """(start time, parent pid, state letter); None when the process is gone."""
    import psutil

    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            status = proc.status()
            return proc.create_time(), proc.ppid(), _STATES.get(status, "S")
    except (psutil.Error, OSError):
        return None


def environ(pid: int) -> bytes | None:
    """The environment as ``/proc/<pid>/environ`` spells it; None if gone, PermissionError
    if this user may not read it (procscan.environ_of's contract)."""
    import psutil

    try:
        env = psutil.Process(pid).environ()
    except psutil.AccessDenied as exc:
        raise PermissionError(errno.EACCES, f"environment of pid {pid} not readable") from exc
    except (psutil.Error, OSError):
        return None
    return b"".join(f"{k}={v}".encode(errors="surrogateescape") + b"\0" for k, v in env.items())


def pids() -> list[int]:
    """Every process's pid."""
    import psutil

    return list(psutil.pids())


def scan(needle: bytes) -> Iterator[tuple[int, bytes]]:
    """``(pid, environ)`` of every other process whose environment holds ``needle``."""
    me = os.getpid()
    for pid in pids():
        if pid == me:
            continue
        try:
            data = environ(pid)
        except PermissionError:  # not ours to read: skipped, as one gone
            continue
        if data is not None and needle in data:
            yield pid, data
