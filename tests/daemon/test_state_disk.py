"""The state dir's disk: filled by an engine's own log, mounted read-only.

The state dir is a real 12 MB tmpfs: an engine that writes ~10 MB/s to stdout (as a
debug-level server does) takes it to the last byte before its log reaches the bound a
backup could be copied into. The rotation's copy then meets a full disk: it must still
cut the log (its lines lost, said in it), or the disk stays full for good, every pass
failing at its first write, and a killed engine is never started again. A pass that
fails on that disk must still rotate: the rotation after it was all that could make room.
A disk the kernel remounted read-only is said so, with what mends it (not free space).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from disks import fill, read_only, tmpfs

from tests.daemon.test_daemon_loop import ready_pid

# The demo engine serving /health, and a thread writing 256 KiB every 20 ms to stdout
# (its log); a write the full disk refuses is dropped, as a logger drops it, and it goes on.
CHATTY = """
import os, sys, threading, time
def chatter():
    lines = (b"y" * 1023 + b"\\n") * 256
    while True:
        try:
            os.write(1, lines)
        except OSError:
            pass
        time.sleep(0.02)
threading.Thread(target=chatter, daemon=True).start()
from controller.demo.engine import main
sys.exit(main(sys.argv[1:]))
"""


def dropped_note(log: Path) -> bool:
    try:
        with log.open("rb") as f:
            return b"lines since its last rotation were dropped" in f.read(1 << 20)
    except FileNotFoundError:
        return False


def test_a_log_that_filled_the_disk_is_cut_and_a_killed_engine_starts_again(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    with tmpfs(rc.state, "12m"):
        rc.write("chatty", command=[sys.executable, "-c", CHATTY, "--port", "{port}"])
        rc.write("web", basePort=rc.port + 5)
        d = daemon(resync="0.5s")
        pid = d.wait(lambda: ready_pid(rc, "web"), "web Ready")
        log = rc.state / "instances" / "logs" / "chatty.log"
        # A full disk met by the rotation: the log cut all the same, the loss said in it.
        d.wait(lambda: dropped_note(log), "chatty's log cut on the full disk")
        os.kill(pid, signal.SIGKILL)
        again = d.wait(lambda: (p := ready_pid(rc, "web")) != pid and p, "web started again")
        assert rc.pids("web") == {again}
        assert rc.status()["web"]["restarts"] == 1
        finish(d)
        # No partial backup left holding the room the disk lacked.
        assert not list(log.parent.glob(".*.tmp")), sorted(p.name for p in log.parent.iterdir())


def test_a_pass_that_fails_on_a_disk_its_log_filled_still_cuts_the_log(reconcile: Any) -> None:
    rc = reconcile
    with tmpfs(rc.state, "12m"):
        rc.write("web")
        rc.converge()
        (pid,) = rc.pids("web")
        os.kill(pid, signal.SIGKILL)
        rc.wait_gone(pid)
        (rc.state / "instances" / ".reserve").unlink()  # the ballast, spent on an earlier fill
        log = fill(rc.state / "instances" / "logs", "web.log")  # its log, to the last byte
        failed = rc.once(check=1)  # its first write meets the full disk ...
        assert "No space left on device" in failed.err, failed
        assert dropped_note(log) and log.stat().st_size < 4096, failed  # ... it cut the log
        rc.converge()  # so the next pass restarts web
        assert rc.status()["web"]["phase"] == "Ready"
        assert rc.pids("web") - {pid}
        rc.down()


def test_a_read_only_state_dir_is_said_so_and_passes_resume_once_writable(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """The `pass failed` line said to free space or fix permissions: neither mends it."""
    rc = reconcile
    rc.write("web")
    d = daemon()
    pid = d.wait(lambda: ready_pid(rc, "web"), "web Ready")
    with read_only(rc.state):
        os.kill(pid, signal.SIGKILL)  # its exit's pass writes its record: refused
        failed = d.wait(lambda: d.lines("pass failed"), "the pass that failed")[0]
        assert "Read-only file system" in failed["error"], failed
        assert failed["next"].startswith("the disk it names is mounted read-only"), failed
    os.kill(d.pid, signal.SIGUSR1)  # writable again: the next pass restarts it
    again = d.wait(lambda: (p := ready_pid(rc, "web")) != pid and p, "web started again")
    assert rc.pids("web") == {again}
    d.wait(lambda: d.lines("passes go through again"), "the failure's end said")
    finish(d)


def test_a_once_on_a_read_only_state_dir_says_the_disk_is_mounted_read_only(
    reconcile: Any,
) -> None:
    rc = reconcile
    rc.write("web")
    rc.once()  # the state dir made
    with read_only(rc.state):
        failed = rc.once(check=1)
    assert f"reconcile: I/O error: {rc.state}/" in failed.err, failed
    assert "Read-only file system. Its disk is mounted read-only" in failed.err, failed
    assert "mount it read-write again and run again" in failed.err, failed
    rc.down()
