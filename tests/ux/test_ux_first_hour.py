"""A newcomer's first hour (found in a trial): the quick start's `--once --wait` run from
the wrong folder, and the slips people make writing their first manifest."""

from __future__ import annotations

from typing import Any


def test_wait_exits_1_like_once_when_the_folder_is_missing_or_empty(reconcile: Any) -> None:
    """README's quick start chains `reconcile --once --wait && reconcile status`: from a
    folder without `manifests/` the wait said nothing and exited 0, where `--once` exits 1
    naming the folder, so the chain went on as if the demo were up."""
    rc = reconcile
    missing = rc.tmp / "no-such-folder"
    once = rc("--once", "-f", str(missing), check=1)
    wait = rc("--once", "--wait", "--timeout", "30s", "-f", str(missing), check=1)
    said = f"error: manifests folder {missing} does not exist"
    assert said in once.err and said in wait.err, wait

    empty = rc.tmp / "empty"
    empty.mkdir()
    wait = rc("--once", "--wait", "--timeout", "30s", "-f", str(empty), check=1)
    assert "the manifests folder holds no manifest: nothing pruned" in wait.err, wait

    # the folder emptied under a Ready engine: it runs on unpruned, and the wait says so
    rc.write("web")
    rc.converge()
    (rc.manifests / "web.yaml").unlink()
    wait = rc("--once", "--wait", "--timeout", "30s", check=1)
    assert "the manifests folder holds no manifest: nothing pruned" in wait.err, wait
    assert rc.record("web")["phase"] == "Ready"
    rc.down()
