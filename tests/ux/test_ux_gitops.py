"""GitOps: the revision read from .git directly (every layout git makes), records and status
carrying it (``+dirty`` for an uncommitted edit), the shipped post-merge hook applying a
pull, and the shipped CI job's steps.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from controller.core.state import Phase
from controller.store.sources.git.rev import revision, revision_of

REPO = Path(__file__).resolve().parents[2]
GITOPS = REPO / "examples" / "gitops"
VENV_BIN = Path(sys.executable).parent
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **GIT_ENV, **(env or {})},
    )
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


# -- the revision, read without git -------------------------------------------------------------


def test_revision_in_every_layout(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "manifests").mkdir(parents=True)
    assert revision(repo / "manifests") is None  # not a work tree
    git(repo, "init", "-q", "-b", "main")
    assert revision(repo / "manifests") is None  # an unborn branch has no commit
    (repo / "manifests" / "a.yaml").write_text("x: 1\n")
    first = commit_all(repo, "one")
    assert revision(repo / "manifests") == first  # loose ref

    git(repo, "pack-refs", "--all")
    assert not (repo / ".git" / "refs" / "heads" / "main").exists()
    assert revision(repo / "manifests") == first  # packed-refs

    (repo / "manifests" / "b.yaml").write_text("x: 2\n")
    second = commit_all(repo, "two")
    git(repo, "checkout", "-q", "--detach", first)
    assert revision(repo / "manifests") == first  # detached HEAD
    git(repo, "checkout", "-q", "main")

    git(repo, "worktree", "add", "-q", str(tmp_path / "wt"), first)
    assert revision(tmp_path / "wt" / "manifests") == first  # a worktree: .git is a file
    assert revision(repo / "manifests") == second
    assert revision_of([repo / "manifests", tmp_path / "wt" / "manifests"]) == f"{second},{first}"
    assert revision_of([tmp_path]) is None


def test_a_submodule_checkout(tmp_path: Path) -> None:
    inner = tmp_path / "inner"
    (inner / "manifests").mkdir(parents=True)
    git(inner, "init", "-q", "-b", "main")
    (inner / "manifests" / "a.yaml").write_text("x: 1\n")
    sha = commit_all(inner, "inner")
    outer = tmp_path / "outer"
    outer.mkdir()
    git(outer, "init", "-q", "-b", "main")
    git(outer, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(inner), "sub")
    assert (outer / "sub" / ".git").is_file()
    assert revision(outer / "sub" / "manifests") == sha


# -- the deploy hook, end to end -----------------------------------------------------------------


def test_post_merge_hook_applies_a_pull_and_records_the_commit(reconcile: Any) -> None:
    rc = reconcile
    origin, author, node = rc.tmp / "origin.git", rc.tmp / "author", rc.tmp / "node"
    git(rc.tmp, "init", "-q", "--bare", "-b", "main", str(origin))
    git(rc.tmp, "clone", "-q", str(origin), str(author))
    rc.write("app", folder=author / "manifests")
    first = commit_all(author, "app")
    git(author, "push", "-q", "origin", "main")
    git(rc.tmp, "clone", "-q", str(origin), str(node))
    hook = node / ".git" / "hooks" / "post-merge"
    shutil.copy(GITOPS / "post-merge", hook)

    # What the node runs: `git pull`; the hook applies with the node's environment.
    node_env = {
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
        "RECONCILE_STATE_DIR": str(rc.state),
        "RECONCILE_NODE": rc.node,
        "RECONCILE_DEVICES": rc.devices,
    }
    rc.write("app", folder=author / "manifests", args=["--load-seconds", "0"])
    second = commit_all(author, "app: args")
    git(author, "push", "-q", "origin", "main")
    git(node, "pull", "-q", "--ff-only", env=node_env)  # runs the hook: reconcile --once

    record = rc.record("app")
    assert record is not None and record["revision"] == second != first
    assert record["source"] == str(node / "manifests" / "app.yaml")
    rc("--once", "--wait", "--timeout", "30s", "-f", str(node / "manifests"), check=0)
    assert rc.status()["app"]["revision"] == second
    wide = rc("status", "-o", "wide", check=0).out
    assert second[:12] in wide and "REVISION" in wide.splitlines()[0]
    assert second[:12] in rc("status", check=0).out  # shown once any record has one
    assert f"Revision:     {second}" in rc("describe", "app", check=0).out
    rc("down", "-f", str(node / "manifests"), check=0)


def test_an_uncommitted_edit_is_applied_as_dirty_not_as_the_commit(reconcile: Any) -> None:
    """-f on a checkout the user manages: an edit is deployed as ``<sha>+dirty``."""
    rc = reconcile
    repo = rc.tmp / "checkout"
    rc.write("app", folder=repo / "manifests")
    git(repo, "init", "-q", "-b", "main")
    sha = commit_all(repo, "app")
    rc.once("-f", str(repo / "manifests"))
    assert rc.record("app")["revision"] == sha
    rc.write("app", folder=repo / "manifests", args=["--load-seconds", "0"])  # not committed
    rc.once("-f", str(repo / "manifests"))
    assert rc.record("app")["revision"] == f"{sha}+dirty"
    assert f"{sha}+dirty" in rc("describe", "app", check=0).out
    assert f"{sha[:12]}+dirty" in rc("status", check=0).out  # not the clean commit's 12
    again = commit_all(repo, "app: args")
    rc.once("-f", str(repo / "manifests"))
    assert rc.record("app")["revision"] == again
    rc("down", "-f", str(repo / "manifests"), check=0)


def test_an_uncommitted_edit_of_a_manifest_file_given_alone_is_dirty(reconcile: Any) -> None:
    """`-f repo/manifests/app.yaml` (a file, not its folder) recorded the clean commit for
    an edit of that file: only folders were checked for one."""
    rc = reconcile
    repo = rc.tmp / "checkout"
    path = rc.write("app", folder=repo / "manifests")
    git(repo, "init", "-q", "-b", "main")
    sha = commit_all(repo, "app")
    rc.write("app", folder=repo / "manifests", args=["--load-seconds", "0"])  # not committed
    rc.once("-f", str(path))
    assert rc.record("app")["revision"] == f"{sha}+dirty"
    rc("down", "-f", str(path), check=0)


def test_plan_lists_a_deployment_once_when_its_commit_moved_and_it_got_ready(
    reconcile: Any,
) -> None:
    """A commit that changes no manifest (the record's revision moves in place) and an
    engine a pass will find Ready: `plan` listed the deployment twice ("unchanged
    Starting", "unchanged Ready") and counted 2 unchanged. Once, with its phase after."""
    rc = reconcile
    repo = rc.tmp / "checkout"
    rc.write("app", folder=repo / "manifests")
    git(repo, "init", "-q", "-b", "main")
    commit_all(repo, "app")
    rc("--once", "--wait", "--timeout", "30s", "-f", str(repo / "manifests"), check=0)
    (repo / "NOTES.md").write_text("no manifest changed\n")
    commit_all(repo, "notes")
    store = rc.store()
    record = store.read("app")
    assert record is not None and record.phase is Phase.READY, record
    store.write(dataclasses.replace(record, phase=Phase.STARTING))  # answering, not seen yet
    planned = rc("plan", "-f", str(repo / "manifests"), check=0)
    lines = [ln.split() for ln in planned.out.splitlines() if " app " in ln]
    assert lines == [["app", "unchanged", "Ready"]], planned
    assert "; 1 unchanged." in planned.out, planned
    rc("down", "-f", str(repo / "manifests"), check=0)


# -- the CI job ------------------------------------------------------------------------------------


def test_the_ci_job_validates_and_plans_a_pull_request(tmp_path: Path) -> None:
    workflow = yaml.safe_load((GITOPS / "github-actions.yml").read_text())
    assert "pull_request" in workflow[True]  # YAML 1.1 reads the key `on` as True
    steps = workflow["jobs"]["validate-and-plan"]["steps"]
    runs = {s["name"]: s["run"] for s in steps if "run" in s}
    assert "reconcile validate" in runs["validate"] and "reconcile plan" in runs["plan"]

    checkout = tmp_path / "pr"
    shutil.copytree(GITOPS / "manifests", checkout / "manifests")
    summary = tmp_path / "summary.md"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECONCILE_")}
    env.update({k: str(v) for k, v in workflow["env"].items()})
    env.update(PATH=f"{VENV_BIN}:{env['PATH']}", GITHUB_STEP_SUMMARY=str(summary))
    for name in ("validate", "plan"):  # what the runner does: bash -eo pipefail
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", runs[name]],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
    assert "+ gitops-demo" in summary.read_text() and "1 to create" in summary.read_text()

    (checkout / "manifests" / "demo.yaml").write_text("apiVersion: reconcile/v1\nkind: Deploy\n")
    failed = subprocess.run(
        ["bash", "-eo", "pipefail", "-c", runs["validate"]], cwd=checkout, env=env, timeout=60
    )
    assert failed.returncode == 1  # a broken manifest fails the pull request's check


def test_a_ci_checkout_plans_against_the_node_with_the_nodes_owner(
    reconcile: Any, tmp_path: Path
) -> None:
    """The documented recipe: the node applies with `--owner gitops`; a CI checkout of the
    same manifests elsewhere plans with the same `--owner` and sees the real diff (none)."""
    import shutil

    rc = reconcile
    rc.write("chat")
    rc("--once", "--wait", "--timeout", "60s", "--owner", "gitops", check=0)
    checkout = tmp_path / "ci-checkout" / "manifests"
    shutil.copytree(rc.manifests, checkout)
    in_sync = rc("plan", "-f", str(checkout), "--owner", "gitops", check=0)
    assert "In sync" in in_sync.out, in_sync.out
    blind = rc("plan", "-f", str(checkout), check=1)  # without it: another set's name
    assert "owned by another manifest set" in blind.out, blind.out
    rc("down", "--owner", "gitops", check=0)
