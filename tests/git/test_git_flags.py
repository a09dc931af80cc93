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


def test_an_empty_git_url_in_node_yaml_is_refused_naming_its_line(
    reconcile: Any, remote: Remote
) -> None:
    """node.yaml's `git: {url: ${OPS_REPO}}` templated with the variable unset (`url: ""`,
    or `url:` alone) was read as no url: the run followed the source the state dir
    remembers, its branch and not the file's, or `./manifests` where it remembers none,
    with no word, where an empty `--git` is a usage error. It is refused, naming the
    file, line and key; the engines run on."""
    node = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    node += ("--devices", reconcile.devices)
    remote.deploy("alpha")
    reconcile.converge("--git", remote.url, "--git-path", "manifests")
    (pid,) = reconcile.pids("alpha")
    config = reconcile.state / "node.yaml"
    for text, line in (('git:\n  url: ""\n  branch: next\n', 2), ("git: {url: }\n", 1)):
        config.write_text(text)
        out = reconcile("--once", *node, common=False, check=1)
        said = f"node.yaml:{line}: git.url: the repository URL is empty"
        assert said in out.err and "give it, or drop the key" in out.err, out
        assert reconcile.pids("alpha") == {pid}
    config.unlink()
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)
