"""Manifests reconcile's user may not read, as a reconcile that is not root meets them.

`[Errno 13] Permission denied: '<the path again>'` said nothing of whose permission, and a
folder this user may not search ended a pass as a disk error ("I/O error: m/.git:
Permission denied. Fix the disk"): the git revision lookup's stat of `m/.git` raised. Each
now names the file or folder, the user, and the next move; the folder prunes nothing.
"""

from __future__ import annotations

from pathlib import Path

from procs import unprivileged

GOOD = """\
apiVersion: reconcile/v1
kind: Deployment
metadata:
  name: {name}
spec:
  engine: command
  command: [serve, "{{port}}"]
"""
DENIED = "permission denied to reconcile's user (uid "


def test_an_unreadable_file_and_folder_name_the_user_and_the_next_move(tmp_path: Path) -> None:
    folder, locked = tmp_path / "m", tmp_path / "locked"
    folder.mkdir()
    locked.mkdir()
    (folder / "good.yaml").write_text(GOOD.format(name="good"))
    secret = folder / "secret.yaml"
    secret.write_text(GOOD.format(name="secret"))
    secret.chmod(0)
    locked.chmod(0)
    try:
        checked = unprivileged("validate", "-f", str(folder), "-f", str(locked))
        assert checked.returncode == 1, checked
        said = checked.stderr
        assert f"error: {secret}: cannot read: {DENIED}" in said, said
        assert f"error: {locked}: cannot list: {DENIED}" in said, said
        assert "make it readable to that user, or run reconcile as its owner" in said, said
        assert "Errno" not in said and "Traceback" not in said, said
        state = str(tmp_path / "state")
        once = unprivileged("--once", "-f", str(locked), "--state-dir", state, "--devices", "")
        assert once.returncode == 1, once
        said = once.stderr  # once: it was said again as a folder that "cannot be listed"
        assert said.startswith(f"error: {locked}: cannot list: {DENIED}"), once
        assert said.count("\n") == 1 and "make it readable to that user" in said, once
        assert "I/O error" not in once.stderr and "Traceback" not in once.stderr, once
    finally:
        locked.chmod(0o700)
