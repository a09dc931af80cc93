"""A manifest still being written is never read; one renamed in from elsewhere is whole.

A real daemon (``--resync 1h``: only folder events start its passes) and a writer that
pauses mid-file, as a slow copy or a script writing document by document does. Every
wait is on a condition the daemon shows (its log, the records), never on a sleep: the
writer's pause ends once the daemon has been due to pass.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from test_daemon_loop import ready_pid, sleeper, spawns, started

from controller.daemon.loop import TORN_READ, WRITE_HELD
from controller.daemon.timers import WRITE_QUIET
from controller.failpoints import ENV as FAILPOINTS


def test_a_file_written_in_place_with_a_pause_is_read_once_closed(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """Truncated, its first document written, then a pause: the debounce's pass read that
    prefix, valid YAML with one deployment fewer, and stopped the second one's healthy
    engine ("removed from two.yaml"), to start it again at the close. The pass waits for
    the close now."""
    rc = reconcile
    first = rc.deployment("first", basePort=rc.port, **sleeper())
    second = rc.deployment("second", basePort=rc.port + 10, **sleeper())
    path = rc.manifests / "two.yaml"
    path.write_text(rc.dump_yaml(first, second))
    d = daemon()
    pids = {n: d.wait(lambda n=n: ready_pid(rc, n), f"{n} Ready") for n in ("first", "second")}
    said = lambda: [e["action"] for e in rc.events("second")] == ["start", "ready"]  # noqa: E731
    d.wait(said, "second's start and ready journalled")
    told = rc.events("second")
    head, tail = rc.dump_yaml(first, second).split("\n---\n")
    with open(path, "w") as writer:  # truncates: the file is its prefix from here
        writer.write(head + "\n---\n")  # a prefix at a document boundary is valid YAML
        writer.flush()
        os.fsync(writer.fileno())
        # The pause lasts until the daemon was due to read: it says it waits (the fix),
        # or it ran its pass (the defect).
        d.wait(
            lambda: d.lines(WRITE_HELD) or d.passes("folder"),
            "the daemon due to read the file mid-write",
        )
        writer.write(tail)
    d.wait(lambda: d.passes("folder"), "the pass after the close")
    assert rc.events("second") == told, rc.events("second")
    assert {n: ready_pid(rc, n) for n in pids} == pids, d.tail()
    assert len(spawns(rc, "second")) == 1
    held = d.lines(WRITE_HELD)
    assert held and held[0]["file"] == str(path), d.tail()
    finish(d)


def frozen(pid: int) -> bool:
    """The process is stopped (SIGSTOP: a failpoint's ``stop``), ``T`` in /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] == "T"


def test_a_file_truncated_while_a_pass_reads_the_folder_is_not_applied(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """A writer that truncates a file after a pass began (no write seen, nothing held)
    and before that pass reads it: the pass read the prefix, valid YAML with a deployment
    fewer, and stopped its engine. The daemon is frozen inside its first pass (the pass
    lock held, nothing read yet) while the prefix is written; the pass then applies
    nothing, and the one after the close reads the file whole."""
    rc = reconcile
    first = rc.deployment("first", basePort=rc.port, **sleeper())
    second = rc.deployment("second", basePort=rc.port + 10, **sleeper())
    path = rc.manifests / "two.yaml"
    path.write_text(rc.dump_yaml(first, second))
    assert rc.converge().code == 0
    pids = {n: ready_pid(rc, n) for n in ("first", "second")}
    assert all(pids.values()), pids
    told = rc.events("second")
    d = daemon(env={FAILPOINTS: "reconciler.pass.locked=stop"})
    d.wait(lambda: frozen(d.pid), "the daemon frozen in its first pass")
    head, tail = rc.dump_yaml(first, second).split("\n---\n")
    with open(path, "w") as writer:  # truncates: the file is its prefix from here
        writer.write(head + "\n---\n")
        writer.flush()
        os.kill(d.pid, signal.SIGCONT)  # the pass reads the folder now
        d.wait(
            lambda: d.lines(TORN_READ) or d.passes(),
            "the daemon's pass over the prefix: applied (the defect) or not (the fix)",
        )
        writer.write(tail)
    d.wait(lambda: d.passes(), "the pass after the close")
    assert rc.events("second") == told, rc.events("second")
    assert {n: ready_pid(rc, n) for n in pids} == pids, d.tail()
    assert len(spawns(rc, "second")) == 1
    torn = d.lines(TORN_READ)
    assert len(torn) == 1 and torn[0]["file"] == str(path), d.tail()
    finish(d)


def test_a_file_renamed_in_from_elsewhere_starts_at_once(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """`mv /elsewhere/fresh.yaml manifests/` (the kernel says only "moved to" here): the
    file is whole, so its pass runs at once, as for a rename inside the folder; it waited
    the 100 ms debounce of a file still being written."""
    rc = reconcile
    elsewhere = rc.tmp / "elsewhere"  # the same file system: a rename, not a copy
    made = rc.write("fresh", folder=elsewhere, **sleeper())
    d = daemon("--allow-empty")  # no folder event before the rename: it comes after quiet
    d.wait_pass()
    os.rename(made, rc.manifests / "fresh.yaml")
    d.wait(lambda: ready_pid(rc, "fresh"), "fresh Ready")
    folder = d.wait(lambda: d.passes("folder"), "the folder's pass")
    assert folder[0]["trigger"] == "folder at once", d.tail()
    assert folder[0]["actions"] in (["start"], ["start", "ready"]), d.tail()
    assert not d.lines(WRITE_HELD), d.tail()
    assert len(spawns(rc, "fresh")) == 1
    finish(d)


def test_a_file_whose_close_never_comes_is_read_once_its_writes_stop(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """A writer that keeps the file open (or a close the kernel's queue lost) holds the
    passes only until no write came for WRITE_QUIET: then the file is read as it is."""
    rc = reconcile
    d = started(rc, daemon, "keeper")
    path = rc.manifests / "later.yaml"
    text = rc.dump_yaml(rc.deployment("later", basePort=rc.port + 10, **sleeper()))
    with open(path, "w") as writer:
        writer.write(text)
        writer.flush()
        wrote = time.monotonic()
        d.wait(lambda: ready_pid(rc, "later"), "later Ready, its file still open")
        waited = time.monotonic() - wrote
    held = d.lines(WRITE_HELD)
    assert held and held[0]["file"] == str(path), d.tail()
    assert waited >= WRITE_QUIET, (waited, d.tail())  # no pass read it before
    assert ready_pid(rc, "keeper"), d.tail()
    finish(d)
