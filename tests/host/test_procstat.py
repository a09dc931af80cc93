"""procstat reads what psutil reads: the same start time to the bit, the parent, the state."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import psutil

from controller.host import procstat


def test_start_time_and_parent_match_psutil() -> None:
    child = subprocess.Popen(["sleep", "600"])
    try:
        for pid in (1, os.getpid(), child.pid):
            st = procstat.stat(pid)
            assert st is not None
            assert st.start_time == psutil.Process(pid).create_time()
            assert st.ppid == psutil.Process(pid).ppid()
    finally:
        child.kill()
        child.wait()


def test_a_zombie_is_state_z_and_a_reaped_process_is_gone() -> None:
    child = subprocess.Popen(["sleep", "600"])
    child.kill()
    deadline = time.monotonic() + 30
    while (st := procstat.stat(child.pid)) is not None and st.state != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert st is not None and st.state == "Z"
    child.wait()
    assert procstat.stat(child.pid) is None


def test_a_name_with_spaces_and_parentheses_parses(tmp_path: Path) -> None:
    link = tmp_path / "odd ) ( name"  # the process name is the file name: "odd ) ( name"
    link.symlink_to("/bin/sleep")
    odd = subprocess.Popen([str(link), "600"])
    try:
        st = procstat.stat(odd.pid)
        assert st is not None and st.ppid == os.getpid()
        assert st.start_time == psutil.Process(odd.pid).create_time()
    finally:
        odd.kill()
        odd.wait()
