"""An empty `--git`, `--branch` or `--tag` (`--git "$OPS_REPO"` in a unit file or a
crontab, the variable unset) was taken as no flag at all: the run went on with the source
the state dir remembers, or with `./manifests` where it remembers none, and said only that
folder's problem. It is a usage error (64) that names the flag."""

from __future__ import annotations

from typing import Any

from tests.git.conftest import Remote


def test_an_empty_git_flag_is_a_usage_error_naming_it(reconcile: Any, remote: Remote) -> None:
    node = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    node += ("--devices", reconcile.devices)
    fresh = reconcile("--once", *node, "--git", "", common=False, check=64)
    assert "--git is empty" in fresh.err and "manifests" not in fresh.err, fresh
    remote.deploy("alpha")
    reconcile.converge("--git", remote.url, "--git-path", "manifests")
    (pid,) = reconcile.pids("alpha")
    for flag in ("--git", "--branch", "--tag"):
        out = reconcile("--once", *node, flag, "", common=False, check=64)
        assert f"{flag} is empty" in out.err, out
    assert reconcile.pids("alpha") == {pid}
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)
