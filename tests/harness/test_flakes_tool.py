"""``scripts/flakes`` (issue 40): a round that leaves a process running fails, naming it,
and the process is killed; a round that cleans up after itself does not. Real rounds, on
small generated test files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Starts a process in a session of its own (pytest's teardown of its group misses it)
# and passes; the process would sleep for a day.
LEAKS = """
import subprocess, sys
from pathlib import Path

def test_leaks():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(86400)"],
                            start_new_session=True)
    Path(__file__).with_suffix(".pid").write_text(str(proc.pid))
"""

# The same process, waited for: nothing is left.
CLEAN = """
import subprocess, sys

def test_clean():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    assert proc.wait(30) == 0
"""


# No llama.cpp build, and no busy loops: they would load the suite this test runs in. No
# plugin of the environment's either (the round's own -p failedlist still loads): the small
# files need none, and loading them all was most of each round's pytest start.
ENV = {
    "LLAMA_SERVER": "unused",
    "RECONCILE_FLAKES_BUSY": "0",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
}


def _flakes(test_file: Path, **more: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **ENV, **more)
    return subprocess.run(
        [sys.executable, str(REPO / "scripts/flakes"), "1", str(test_file)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_round_that_leaves_a_process_running_fails_and_the_process_is_killed(
    tmp_path: Path,
) -> None:
    test_file = tmp_path / "test_leaks.py"
    test_file.write_text(LEAKS)
    # The process sleeps a day: the 10 s a slow teardown gets would all be waited out.
    done = _flakes(test_file, RECONCILE_FLAKES_LEFT_WAIT="1")
    pid = int(test_file.with_suffix(".pid").read_text())
    try:
        assert done.returncode == 1, done.stdout + done.stderr
        assert "| (left running) " in done.stdout and "time.sleep(86400)" in done.stdout
        assert f"pid {pid} still running" in done.stdout, done.stdout
        assert "1 failed at least once" in done.stdout, done.stdout
        assert not _alive(pid)
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def test_a_round_that_cleans_up_passes(tmp_path: Path) -> None:
    test_file = tmp_path / "test_clean.py"
    test_file.write_text(CLEAN)
    done = _flakes(test_file)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left running" not in done.stdout
    assert "1 tests, 0 failed at least once" in done.stdout, done.stdout


def test_a_round_whose_pytest_cannot_run_is_no_clean_bill(tmp_path: Path) -> None:
    """pytest refusing its arguments (an interpreter without pytest-xdist took `-n`)
    ran nothing: that is said and exits 2, never "0 tests, 0 failed" and 0."""
    test_file = tmp_path / "test_clean.py"
    test_file.write_text(CLEAN)
    env = dict(os.environ, **ENV)
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts/flakes"), "1", "--no-such-option", str(test_file)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "round 1 ran no tests (pytest exit 4)" in done.stdout, done.stdout
    assert "1 of 1 rounds ran no tests" in done.stdout, done.stdout
