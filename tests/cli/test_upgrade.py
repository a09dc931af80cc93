"""Upgrading reconcile in place: the package upgraded, the service restarted later.

Until the restart, the daemon that runs is the older reconcile's. Its records are of the
version it writes, kept here as a file an older version wrote (today's record, less the
fields version 3 added, saying version 2), beside a stand-in for that daemon: a process
that holds ``daemon.lock`` and writes no ``daemon.json`` note, as daemons before the note
did, or one saying the record version it reads.
"""

from __future__ import annotations

import json
import select
import signal
import subprocess
from typing import Any

import pytest

from controller.core.state import NEWEST_VERSION, VERSION
from tests.conftest import PYTHON
from tests.procs import wait_for

# A daemon as the state dir sees it: the lock held, its pid in the lock file and, given a
# record version, a daemon.json note saying it reads up to that one.
_HOLD_THE_LOCK = """
import fcntl, json, os, sys
fd = os.open(sys.argv[1] + "/daemon.lock", os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
os.pwrite(fd, f"{os.getpid()}\\n".ljust(12).encode(), 0)
if sys.argv[2] != "none":
    note = {"pid": os.getpid(), "owner": "", "labels": None, "records": int(sys.argv[2])}
    with open(sys.argv[1] + "/daemon.json", "w") as f:
        json.dump(note, f)
print("held", flush=True)
sys.stdin.read()
"""


def _daemon(reconcile: Any, reads: int | None = None) -> subprocess.Popen[bytes]:
    """The stand-in, once it holds the lock; it lets go when its stdin closes."""
    argv = [PYTHON, "-c", _HOLD_THE_LOCK, str(reconcile.state), str(reads).lower()]
    proc: subprocess.Popen[bytes] = reconcile.spawn(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    said = proc.stdout.readline() if ready else b""
    proc.stdout.close()  # it says nothing more
    assert said == b"held\n", "the stand-in never took the lock"
    return proc


def _as_version_2(reconcile: Any, name: str) -> bytes:
    """``name``'s record rewritten as version 2 wrote it; its bytes."""
    path = reconcile.record_path(name)
    written = json.loads(path.read_text())
    as_v2 = {k: v for k, v in written.items() if k not in ("ready_boot", "idle_boot")}
    path.write_text(json.dumps({**as_v2, "version": 2}))
    return bytes(path.read_bytes())


@pytest.mark.parametrize("reads", [None, 2], ids=["daemon-before-the-note", "note-says-version-2"])
def test_a_once_of_an_upgraded_package_leaves_an_older_daemons_records_alone(
    reconcile: Any, reads: int | None
) -> None:
    """The new CLI's `--once` on a box whose daemon was not restarted yet (a manifest
    edited meanwhile) rewrote that daemon's version-2 record as version 3: the daemon,
    reading no version 3, said "has version 3" at every pass and stopped managing the
    engine (its gateway answered 404 for it once it re-read the records) until it was
    restarted. The run is refused now, naming the record and the restart, and changes
    nothing; once no older daemon holds the state dir, the same run applies the edit."""
    reconcile.write("chat")
    reconcile.converge()
    (pid,) = reconcile.pids("chat")
    path = reconcile.record_path("chat")
    before = _as_version_2(reconcile, "chat")

    older = _daemon(reconcile, reads)
    reconcile.write("chat", env={"EDITED": "1"})
    out = reconcile.once(check=1)
    assert "is of an older reconcile" in out.err, out
    assert "chat" in out.err and "systemctl restart reconcile" in out.err, out
    assert path.read_bytes() == before, out
    assert reconcile.pids("chat") == {pid}, out

    assert older.stdin is not None
    older.stdin.close()  # the service restarted: no older daemon holds the state dir
    assert older.wait(timeout=30) == 0
    reconcile.converge()
    record = json.loads(path.read_text())
    assert record["version"] == VERSION and record["stored_spec"]["env"] == {"EDITED": "1"}
    reconcile.down()


def test_a_once_beside_a_daemon_of_this_version_runs(reconcile: Any) -> None:
    """The daemon notes the newest record version it reads in daemon.json; beside one of
    this reconcile, a record of an older version is no reason to refuse a `--once`: the
    edit is applied and the record written as this version."""
    reconcile.write("chat")
    reconcile.converge()
    _as_version_2(reconcile, "chat")
    daemon = reconcile.daemon()
    note = reconcile.state / "daemon.json"
    wait_for(
        lambda: note.exists() and json.loads(note.read_text()).get("records") == NEWEST_VERSION,
        what="the daemon's note of the record version it reads",
    )
    reconcile.write("chat", env={"EDITED": "1"})
    reconcile.converge()  # exit 0: not refused (the daemon may have applied it first)
    record = json.loads(reconcile.record_path("chat").read_text())
    assert record["version"] == VERSION and record["stored_spec"]["env"] == {"EDITED": "1"}
    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=30) == 0
    reconcile.down()


def test_a_restart_asked_of_a_daemon_that_does_not_catch_sigusr1_leaves_it_running(
    reconcile: Any,
) -> None:
    """The new CLI's `restart` (as `drain` and `rollback`) asks the daemon for a pass with
    SIGUSR1 where no gateway serves; a daemon of a reconcile from before it caught that
    signal died of it (the engines ran on unmanaged, the restart waited 10 minutes for
    nothing). A daemon that does not catch it is not signalled and lives on; the restart
    says at once that the service's restart carries the request out."""
    reconcile.write("chat")
    reconcile.converge()
    older = _daemon(reconcile)  # a bare process: SIGUSR1 ends it, as it ended such a daemon
    out = reconcile("restart", "chat", check=1)  # at once: no 10 minutes' wait for nothing
    assert "is of an older reconcile" in out.err, out
    assert "systemctl restart reconcile" in out.err, out
    assert older.stdin is not None
    older.stdin.close()
    assert older.wait(timeout=30) == 0, f"the daemon ended by signal {-older.returncode}"
    reconcile.down()
