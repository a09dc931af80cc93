"""A user who is not root, refused its state dir: the error names the state dir and the move.

It said `I/O error: /nonexistent: Permission denied. Fix the disk or permissions`: a
folder on the way (a system user's missing home) rather than the state dir, and no word
of `--state-dir` or XDG_STATE_HOME; on a state dir another user keeps (a lab's shared
folder), `I/O error: .../node.yaml: Permission denied`, as if a chmod would do.
``unprivileged`` runs the CLI in a user namespace (a folder's mode bits bind there); the
other user is played, as in tests/gateway/test_long_state_dir.py, by a root child that
setuid()s to nobody.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import missing
import pytest
from procs import unprivileged


def _shut(tmp_path: Path) -> Path:
    """A folder this user may read but not write into (root's, 0555)."""
    shut = tmp_path / "shut"
    shut.mkdir(mode=0o555)
    (tmp_path / "m").mkdir()
    return shut


def test_a_state_dir_this_user_may_not_create_is_named_with_the_next_move(
    tmp_path: Path,
) -> None:
    state = _shut(tmp_path) / "state"
    once = unprivileged("--once", "--allow-empty", "-f", str(tmp_path / "m"),
                        "--state-dir", str(state), "--devices", "")  # fmt: skip
    assert once.returncode == 1, once
    assert once.stderr.strip() == (
        f"reconcile: this user (uid {_inside_uid()}) may not create or reach the state dir {state}:"
        " name one it may write with --state-dir DIR (RECONCILE_STATE_DIR)"
    ), once.stderr
    assert not state.exists()


def test_the_default_state_dir_under_a_home_not_writable_says_xdg_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = _shut(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.delenv("RECONCILE_STATE_DIR", raising=False)
    once = unprivileged("--once", "--allow-empty", "-f", str(tmp_path / "m"), "--devices", "")
    assert once.returncode == 1, once
    said = once.stderr.strip()
    assert said.startswith(
        f"reconcile: this user (uid {_inside_uid()}) may not create or reach the state dir"
        f" {home}/.local/state/reconcile: name one it may write with --state-dir DIR"
    ), said
    assert "XDG_STATE_HOME" in said and "Traceback" not in said, said


# As nobody: what the CLI says of a PermissionError on a state dir root keeps.
AS_NOBODY = """
import os, sys
from controller.store.config.node import state_dir_denied
os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[3]))
print(state_dir_denied(sys.argv[1], sys.argv[1] + "/node.yaml"))
"""


def test_another_users_state_dir_names_its_owner_and_a_shared_box_s_way() -> None:
    if os.geteuid() != 0:
        missing.skip("root (to play another user by setuid)", "run the tests as root")
    who = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="reconcile-denied-"))  # tmp_path's parents: root's
    try:
        os.chmod(top, 0o755)
        state = top / "state"
        state.mkdir(mode=0o700)
        done = subprocess.run(
            [sys.executable, "-c", AS_NOBODY, str(state), str(who.pw_gid), str(who.pw_uid)],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    finally:
        shutil.rmtree(top)
    assert done.stdout.strip() == (
        f"the state dir {state} belongs to root (uid 0), and a state dir is one user's alone"
        " (0700): run reconcile as that user (users who share GPUs share one reconcile:"
        ' README, "A shared GPU box"), or give this one its own with --state-dir DIR (two'
        " state dirs on one box do not see each other's engines and hand out the same GPUs)"
    ), done


def _inside_uid() -> int:
    """This user's uid as a user namespace's process sees itself (the overflow uid)."""
    if os.geteuid() != 0:
        return os.geteuid()
    return int(Path("/proc/sys/kernel/overflowuid").read_text())
