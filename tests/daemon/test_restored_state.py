"""A state dir restored from a backup under running engines (copied back in place; a daemon again).

Its records are older than what runs: an engine started after the backup has no record,
one the backup names has exited since (a crash restarted it as another engine), one it
names ended and its pid is now another process's, and the gateway it names was replaced
since. The next daemon must start no deployment twice, signal nothing that is not its own,
and say what it found. The gateway started after the backup, which no file of the
restored state dir names, served on beside the new one, forever: the kernel gave it half
the connections, routed by a watch of the folders the restore had removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from procs import GATEWAY_MARKER, marked_pids

from tests.daemon.test_daemon_loop import ready_pid

NAMES = ("kept", "crashed", "gone")
STRAY = "gateway of this state dir that no file names asked to stop"


def back_up(state: Path, backup: Path) -> None:
    """A backup of a live state dir, as tar or rsync take one: a file that vanishes
    between the folder's listing and its copy (the heartbeat's temp file, renamed over
    its target each beat) is skipped, where `cp -a` failed the copy (a flake under load),
    and so is a socket (the gateway's; tar says "socket ignored")."""

    def copy(src: str, dst: str) -> None:
        with contextlib.suppress(FileNotFoundError):  # gone since the listing: not backed up
            if not stat.S_ISSOCK(os.lstat(src).st_mode):
                shutil.copy2(src, dst, follow_symlinks=False)

    shutil.copytree(state, backup, symlinks=True, copy_function=copy)


def gateways(rc: Any) -> set[int]:
    return marked_pids(f"{rc.node}/", GATEWAY_MARKER)


def test_a_state_dir_restored_from_a_backup_starts_nothing_twice_and_kills_nothing_foreign(
    reconcile: Any, daemon: Any, finish: Any, tmp_path: Path
) -> None:
    rc = reconcile
    rc.devices = "nvidia:0,nvidia:1,nvidia:2,nvidia:3"
    for i, name in enumerate(NAMES):
        rc.write(name, devices={"count": 1}, basePort=rc.port + 3 * i)
    listen = ["--listen", str(rc.port + 15)]  # all within the test's 16 ports
    d = daemon(*listen, resync="0.3s")
    first = {n: d.wait(lambda n=n: ready_pid(rc, n), f"{n} Ready") for n in NAMES}
    before = d.wait(lambda: gateways(rc), "the gateway")
    backup = tmp_path / "backup"
    back_up(rc.state, backup)

    # After the backup: the gateway replaced, a new deployment, a crash restarted, a
    # deployment removed.
    rc("gateway", "restart", check=0)
    (stray,) = d.wait(lambda: (g := gateways(rc)) != before and len(g) == 1 and g, "gateway 2")
    rc.write("late", devices={"count": 1}, basePort=rc.port + 9)
    late = d.wait(lambda: ready_pid(rc, "late"), "late Ready")
    os.kill(first["crashed"], signal.SIGKILL)
    d.wait(lambda: ready_pid(rc, "crashed") not in (None, first["crashed"]), "crashed restarted")
    (rc.manifests / "gone.yaml").unlink()
    d.wait(lambda: rc.record("gone") is None and not rc.pids("gone"), "gone stopped")
    assert d.stop() == 0

    # The restore, engines and the gateway running; gone's pid now another process's.
    foreign = rc.spawn([sys.executable, "-c", "import time; time.sleep(600)"])
    # In place, as `rsync -a --delete backup/ state/` restores: the folder itself never
    # missing (a gateway that finds its state dir gone stops by itself, which a restore by
    # `rm -rf` and `cp -a` let the stray gateway do, under load, before the new one came).
    for child in rc.state.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    subprocess.run(["cp", "-a", f"{backup}/.", str(rc.state)], check=True)
    path = rc.record_path("gone")
    rec = json.loads(path.read_text())
    rec["ref"]["pid"] = foreign.pid  # its start time the engine's: a pid reused
    path.write_text(json.dumps(rec))

    again = daemon(*listen, resync="0.3s")
    again.wait(
        lambda: (
            all(ready_pid(rc, n) for n in ("kept", "crashed", "late")) and rc.record("gone") is None
        ),
        "kept, crashed and late Ready, gone's record dropped",
    )
    rc.wait_gone(stray, timeout=30)  # asked to stop, it drained and ended
    (said,) = again.lines(STRAY)
    assert said["pid"] == stray and said["level"] == "warning", said
    (serving,) = gateways(rc)
    with urllib.request.urlopen(f"http://127.0.0.1:{rc.port + 15}/healthz", timeout=10) as r:
        assert r.status == 200

    # One engine each; the one the backup named kept; the unrecorded ones reaped (said,
    # with their pids) before their names started again; the foreign process untouched.
    engines = {n: rc.pids(n) for n in (*NAMES, "late")}
    assert engines == {"kept": {first["kept"]}, "crashed": {ready_pid(rc, "crashed")},
                       "gone": set(), "late": {ready_pid(rc, "late")}}, engines  # fmt: skip
    reaped = [e for e in rc.events("late") if e["action"] == "reap"]
    assert reaped and str(late) in reaped[-1]["outcome"], rc.events("late")
    assert foreign.poll() is None, "a foreign process was signalled"
    assert serving not in before and serving != stray
    finish(again)
