"""`reconcile export --git URL` exports URL's manifests at the commit a pass applied, or
says why it cannot: never another source's, never a missing folder for a missing pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.git.conftest import Remote

# More GPUs than the node has: Pending, so the pass starts nothing.
PENDING = """apiVersion: reconcile/v1
kind: Deployment
metadata: {name: NAME}
spec:
  engine: command
  image: registry.example/engine:1
  command: [python3, -c, pass]
  devices: {count: 64, kind: nvidia}
"""
PATH = ("--git-path", "manifests")


def test_export_reads_only_the_source_it_is_given(
    reconcile: Any, remote: Remote, tmp_path: Path
) -> None:
    """A state dir following one repository exported it under another's URL (exit 0, its
    objects on stdout, ready for `kubectl apply`); before any pass it said the repository
    had no manifests folder."""
    other = Remote(tmp_path / "other", reconcile)
    other.commit({"manifests/theirs.yaml": PENDING.replace("NAME", "theirs")}, "theirs")
    remote.commit({"manifests/mine.yaml": PENDING.replace("NAME", "mine")}, "mine")
    before = reconcile("export", "--git", remote.url, *PATH, check=1)
    assert before.out == "", before
    assert f"nothing applied yet from {remote.url}" in before.err, before
    assert "reconcile --once" in before.err and "no such folder" not in before.err, before
    reconcile("--once", "--git", remote.url, *PATH)  # exit 1: Pending, as meant
    mine = reconcile("export", "--git", remote.url, *PATH, check=0)
    assert "name: mine" in mine.out, mine
    wrong = reconcile("export", "--git", other.url, *PATH, check=1)
    assert wrong.out == "", wrong
    assert f"follows {remote.url}" in wrong.err and f"not {other.url}" in wrong.err, wrong
