"""The ``reconcile`` fixture's helpers leave nothing behind, even those that fork.

``git daemon`` (the fleet tests' git:// server) runs ``git-daemon`` as its child: killing
the ``git`` process alone left a ``git-daemon`` listening after every run of
tests/cluster/test_fleet_hosts.py (found after a ``scripts/flakes`` round, two of them
still serving a test's repository). Helpers now run in a process group of their own,
killed whole at teardown.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import missing
from procs import MARKER, execed, free_ports, marked_pids, wait_for

from tests.conftest import Reconcile


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in found]


def test_a_forking_helper_is_killed_with_what_it_forked(tmp_path: Path) -> None:
    rc = Reconcile(tmp_path)
    shell = rc.spawn(["/bin/sh", "-c", "sleep 300 & wait"])
    wait_for(lambda: _children(shell.pid), timeout=10, what="the shell's child")
    (child,) = _children(shell.pid)
    rc._teardown()
    assert shell.returncode is not None
    wait_for(lambda: not _alive(child), timeout=10, what="the forked child gone")


def test_git_daemon_leaves_no_git_daemon(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        missing.skip("git", "apt-get install git")
    rc = Reconcile(tmp_path)
    port = free_ports(1)
    argv = ["git", "daemon", "--reuseaddr", "--export-all", f"--base-path={tmp_path}"]
    wrapper = rc.spawn([*argv, "--listen=127.0.0.1", f"--port={port}", str(tmp_path)])
    wait_for(lambda: _accepts(port), timeout=30, what="git daemon up")
    serving = _serving(tmp_path)  # git, and the git-daemon it runs as its child
    assert wrapper.pid in serving and len(serving) == 2, serving
    rc._teardown()
    wait_for(lambda: not _serving(tmp_path), timeout=10, what="every git daemon gone")
    assert not _accepts(port)


def _serving(root: Path) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"base-path={root}"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split() if _alive(int(pid))]


def test_a_marker_is_found_first_or_later_in_the_environment_never_inside_a_value() -> None:
    """``marked_pids`` (teardown's sweep, the tests' waits) matches a variable that starts
    with ``MARKER=<prefix>``, wherever it stands, and never the same text in a value."""
    node = f"t-{uuid.uuid4().hex[:12]}"
    envs = {
        "first": {MARKER: f"{node}/a/1", "PATH": os.environ["PATH"]},
        "later": {"PATH": os.environ["PATH"], MARKER: f"{node}/b/1"},
        "inside": {"PATH": os.environ["PATH"], "X": f"{MARKER}={node}/c/1"},
    }
    procs = {name: subprocess.Popen(["sleep", "300"], env=env) for name, env in envs.items()}
    try:
        for proc in procs.values():
            execed(proc.pid)
        assert marked_pids(f"{node}/") == {procs["first"].pid, procs["later"].pid}
        assert marked_pids(f"{node}/b/") == {procs["later"].pid}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(timeout=10)
