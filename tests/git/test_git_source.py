"""The git source with --once: a bare repository over file:// as the remote, the real CLI,
real engines (the demo engine). DESIGN.md "Following git"."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from controller.gateway.ui.snapshot import NodeReader
from controller.store.sources.git import source as gitsource
from controller.store.statedir import StateDir
from tests.git.conftest import Remote, run_git, source


def git_args(remote: Remote, *more: str) -> tuple[str, ...]:
    return ("--git", remote.url, "--git-path", "manifests", *more)


def test_a_pushed_commit_is_applied_owned_by_the_source_and_stamped_with_it(
    reconcile: Any, remote: Remote
) -> None:
    first = remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    rec = reconcile.record("alpha")
    assert rec is not None
    assert rec["owner"] == remote.owner() and rec["revision"] == first
    assert all(e.get("revision") == first for e in reconcile.events("alpha")), reconcile.events(
        "alpha"
    )
    seen = source(reconcile)
    assert seen["state"] == "Synced" and seen["applied"] == seen["fetched"] == first, seen
    assert seen["branch"] == "main" and seen["path"] == "manifests" and seen["pinned"] is None
    assert remote.url in reconcile("status", check=0).out.splitlines()[0]

    second = remote.deploy("alpha", command=reconcile.demo_command(load_seconds="0.1"))
    # `plan` fetches nothing: it says which commit it planned against (not the one pushed).
    planned = reconcile(*git_args(remote, "plan"), check=0).out
    assert f"Against commit {first[:12]}, the one the node applied" in planned, planned
    assert reconcile(*git_args(remote, "plan", "-o", "json"), check=0).json()["revision"] == first
    # export's own refusals name the file as the repository does, as load's errors do
    exported = reconcile(*git_args(remote, "export"), check=1).err
    assert "error: manifests/alpha.yaml:" in exported and "no default image" in exported
    assert str(reconcile.state) not in exported, exported
    reconcile.converge(*git_args(remote))
    rec = reconcile.record("alpha")
    assert rec is not None and rec["revision"] == second
    assert source(reconcile)["applied"] == second

    remote.deploy("beta", basePort=reconcile.port + 20)
    reconcile.converge(*git_args(remote))
    remote.commit({"manifests/beta.yaml": None}, "drop beta")  # its event names the file
    reconcile.converge(*git_args(remote))  # as the repository did
    (gone,) = [e for e in reconcile.events("beta") if e.get("action") == "stop"]
    assert gone["reason"] == "manifest removed (was manifests/beta.yaml)", gone
    # A run of the node's own folder declaring the same name: the git set's record is
    # named as the repository names its file, in the plan's conflict and restart's refusal.
    reconcile.write("alpha")
    conflict = reconcile("plan", check=1).out
    restarted = reconcile("restart", "alpha", "--no-wait", check=0).err
    for said in (conflict, restarted):
        assert f"({remote.owner()}, from manifests/alpha.yaml)" in said, said
        assert str(reconcile.state) not in said, said
    (reconcile.manifests / "alpha.yaml").unlink()
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)
    assert reconcile.record("alpha") is None


def test_a_fetch_that_fails_keeps_the_engine_prunes_nothing_and_exits_1(
    reconcile: Any, remote: Remote
) -> None:
    applied = remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    pid = reconcile.record("alpha")["ref"]["pid"]
    shutil.move(remote.bare, remote.bare.with_name("moved.git"))  # the remote is gone
    out = reconcile("--once", *git_args(remote), check=1)
    assert "git:" in out.err and "still running" in out.err and applied[:12] in out.err, out
    assert reconcile.record("alpha")["ref"]["pid"] == pid and reconcile.alive(pid)
    seen = source(reconcile)
    assert seen["state"] == "PullFailed" and seen["applied"] == applied, seen
    assert "does not appear to be a git repository" in seen["message"], seen
    assert seen["last_fetch_at"] in seen["message"], seen  # when it last worked
    shutil.move(remote.bare.with_name("moved.git"), remote.bare)
    reconcile.converge(*git_args(remote))
    assert source(reconcile)["state"] == "Synced"
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_a_branch_gone_is_pull_failed_not_a_prune(reconcile: Any, remote: Remote) -> None:
    remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    out = reconcile("--once", *git_args(remote, "--branch", "gone"), check=1)
    assert "couldn't find remote ref" in out.err, out
    # git's words say what is missing, not what to do: the error says that too
    said = "the branch gone is not on the remote (deleted, renamed, or a typo): push it again"
    assert said in out.err and "follow another (--branch, git.branch in node.yaml)" in out.err
    assert reconcile.record("alpha") is not None
    assert source(reconcile)["state"] == "PullFailed"
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_a_commit_given_as_the_branch_says_how_to_run_one_commit(
    reconcile: Any, remote: Remote
) -> None:
    """Argo CD's targetRevision may be a commit: `--branch SHA` was told the branch was
    deleted or renamed and to push it again. A node follows a branch or a tag; a commit is
    held by a rollback's pin, which the error names."""
    sha = remote.deploy("alpha")
    out = reconcile("--once", *git_args(remote, "--branch", sha), check=1)
    said = f"{sha} looks like a commit, and a node follows a branch or a tag"
    assert said in out.err and f"`reconcile rollback {sha}`" in out.err, out
    assert "push it again" not in out.err and reconcile.record("alpha") is None, out


def test_a_tag_given_as_the_branch_or_a_whole_ref_is_taken_or_said_so(
    reconcile: Any, remote: Remote
) -> None:
    """`--branch v1` where v1 is a tag (`--tag main` where main is a branch) was told it
    was "deleted, renamed, or a typo: push it again", though the remote has it; and a
    whole ref (`--branch refs/heads/main`, as Flux's ref.name takes it) was fetched as
    refs/heads/refs/heads/main. The error names the other flag; a whole ref is its name."""
    sha = remote.deploy("alpha")
    run_git(remote.work, "tag", "v1")
    run_git(remote.work, "push", "-q", "origin", "v1")
    for flag, name, flip in (("--branch", "v1", "tag"), ("--tag", "main", "branch")):
        out = reconcile("--once", *git_args(remote, flag, name), check=1)
        said = f"{name} is a {flip} of the remote, not a {flag[2:]}: follow it with --{flip}"
        assert said in out.err and "push it again" not in out.err, out
        assert reconcile.record("alpha") is None
    for flag, ref, key in (
        ("--branch", "refs/heads/main", "branch"),
        ("--tag", "refs/tags/v1", "tag"),
    ):
        reconcile("--once", *git_args(remote, flag, ref), check=0)
        seen = source(reconcile)
        assert seen[key] == ref.rpartition("/")[2] and seen["applied"] == sha, seen
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def frozen(pid: int) -> bool:
    """The process is stopped (a failpoint's ``stop``): ``T`` in /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] == "T"


def test_a_source_is_not_synced_before_the_pass_that_moved_it_has_ended(
    reconcile: Any, remote: Remote
) -> None:
    """Between the pass's move and its records, `source` said Synced, "0 deployment(s)
    Ready" at a commit whose deployment was not yet started (a script waiting for Synced
    after a push went on too early; a test read no record). It is Progressing until that
    pass ends. The pass is frozen there by a failpoint; real git, a real engine."""
    sha = remote.deploy("alpha")
    env = {**reconcile.env, "RECONCILE_FAILPOINTS": "git.pass.moved=stop"}
    once = reconcile.spawn(reconcile.argv("--once", *git_args(remote)), env=env)
    reconcile.wait_for(lambda: frozen(once.pid), timeout=60, what="the pass frozen after its move")
    seen = source(reconcile)
    assert seen["applied"] == sha and reconcile.record("alpha") is None, seen
    assert seen["state"] == "Progressing" and seen["message"] == f"applying {sha[:12]}", seen
    once.send_signal(signal.SIGCONT)
    assert once.wait(timeout=60) == 0
    assert reconcile.record("alpha")["revision"] == sha
    reconcile.converge(*git_args(remote))
    assert source(reconcile)["state"] == "Synced"
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_a_name_another_set_owns_is_said_by_a_quiet_once_and_degrades_the_source(
    reconcile: Any, remote: Remote
) -> None:
    """The manifests' folder renamed, and the node pointed at the new path: the new set
    (`git:URL#deploy`) found `alpha` owned by the old one. `--once -q` (cron) exited 1 and
    said nothing (the conflict was a log line alone), and `source` said Synced, "0
    deployment(s) Ready". The conflict is said, with its next move, and the source is
    Degraded by it; the old set's engine runs on."""
    remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    pid = reconcile.record("alpha")["ref"]["pid"]
    run_git(remote.work, "mv", "manifests", "deploy")
    moved = remote.commit({}, "manifests/ is deploy/ now")
    out = reconcile("--once", "-q", "--git", remote.url, "--git-path", "deploy", check=1)
    owned = "name 'alpha' is owned by another manifest set"
    assert f"alpha: {owned}" in out.err and f"--owner '{remote.owner()}'" in out.err, out
    seen = source(reconcile)
    assert seen["state"] == "Degraded" and seen["applied"] == moved, seen
    assert owned in seen["message"], seen
    assert reconcile.record("alpha")["ref"]["pid"] == pid and reconcile.alive(pid)
    # `down` of the new set names the old one's way: no folder to run it from
    out = reconcile("--git", remote.url, "--git-path", "deploy", "down", check=None)
    said = f"run `reconcile down --git {remote.url} --git-path manifests`, or add --owner"
    assert said in out.err and "from that folder" not in out.err, out
    reconcile(*git_args(remote), "down", check=0)


def test_a_first_fetch_that_fails_says_git_s_words_alone(reconcile: Any, remote: Remote) -> None:
    """Nothing was ever checked out: no word of an empty manifests folder besides git's."""
    out = reconcile("--once", "--git", f"{remote.url}-gone", "--git-path", "manifests", check=1)
    assert "does not appear to be a git repository" in out.err, out
    assert "nothing applied yet; nothing pruned" in out.err, out
    assert "holds no manifest" not in out.err and "no manifests found" not in out.err, out
    assert "no such folder" not in out.err, out  # there is no checkout to lack one
    planned = reconcile("--git", f"{remote.url}-gone", "--git-path", "manifests", "plan", check=1)
    assert "error: nothing applied yet: the fetch of" in planned.out, planned
    assert "does not appear to be a git repository" in planned.out, planned


def test_plan_before_the_first_pass_says_nothing_is_applied_yet(
    reconcile: Any, remote: Remote
) -> None:
    """`plan` fetches nothing: before a first pass there is no checkout to plan against.
    It said "error: manifests: no such folder at the applied commit" and exited 1."""
    remote.deploy("alpha")
    planned = reconcile(*git_args(remote), "plan", check=2)
    assert planned.out.startswith(f"nothing applied yet from {remote.url}"), planned
    assert "no such folder" not in planned.out + planned.err, planned
    doc = reconcile(*git_args(remote), "plan", "-o", "json", check=2).json()
    assert doc["in_sync"] is False and doc["errors"] == [] and doc["revision"] is None, doc
    reconcile.converge(*git_args(remote))
    assert "In sync" in reconcile(*git_args(remote), "plan", check=0).out
    # after the verb too, as -f is (it was "unrecognized arguments: --git ...", exit 64)
    assert "In sync" in reconcile("plan", *git_args(remote), check=0).out
    assert reconcile("validate", *git_args(remote), check=0).code == 0
    reconcile("down", *git_args(remote), check=0)
    assert reconcile.record("alpha") is None


def test_a_path_missing_at_a_commit_prunes_nothing(reconcile: Any, remote: Remote) -> None:
    remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    pid = reconcile.record("alpha")["ref"]["pid"]
    gone = remote.commit({"manifests/alpha.yaml": None, "README": "moved away\n"}, "remove all")
    out = reconcile("--once", *git_args(remote), check=1)
    assert "nothing pruned" in out.err or "pruning nothing" in out.err, out
    assert reconcile.alive(pid) and reconcile.record("alpha") is not None
    seen = source(reconcile)  # not Synced: what runs is the commit before's
    assert seen["fetched"] == seen["applied"] == gone and seen["state"] == "Degraded", seen
    assert "manifests: no such folder at this commit; nothing pruned" in seen["message"], seen
    # the record's condition, `--once` and the daemon's log name the path as the repository
    # does, never the node's checkout under the state dir
    wide = reconcile("status", "-o", "wide", check=0).out  # once, in the source's line
    assert "manifests: no such folder at the applied commit" in out.err, out
    assert wide.count("manifests: no such folder at this commit") == 1, wide
    for said in (out.err, wide):
        assert str(reconcile.state) not in said, said
    history = reconcile("history", "-o", "json", check=0).json()
    assert history[-1]["revision"] == gone and history[-1]["outcome"] == "Degraded", history
    empty = remote.commit({"manifests/notes.txt": "no manifest here\n"}, "a folder, empty")
    reconcile("--once", *git_args(remote), check=1)
    seen = source(reconcile)
    assert seen["applied"] == empty and seen["state"] == "Degraded", seen
    assert "manifests: no manifest in it; nothing pruned" in seen["message"], seen
    assert reconcile.alive(pid)
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_a_path_made_a_symlink_out_of_the_repository_is_refused_and_prunes_nothing(
    reconcile: Any, remote: Remote, tmp_path: Path
) -> None:
    """A commit that makes the git path a symlink out of the checkout (`manifests ->
    /srv/other`): a manifest's own symlink may not leave its folder, but the folder itself
    was followed, so the node read a folder of its own disk as the commit's manifests: it
    started what that folder held and pruned what the repository declares. The folder is
    refused unread, as a missing one: nothing is pruned, nothing of it starts."""
    remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    pid = reconcile.record("alpha")["ref"]["pid"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    outsider = reconcile.deployment("outsider", basePort=reconcile.port + 10)
    (elsewhere / "outsider.yaml").write_text(reconcile.dump_yaml(outsider))
    shutil.rmtree(remote.work / "manifests")
    (remote.work / "manifests").symlink_to(elsewhere)
    leads_out = remote.commit({}, "manifests: a symlink out of the repository")
    out = reconcile("--once", *git_args(remote), check=1)
    said = "manifests: is a symlink out of the repository (to '"  # the target cut at 80
    assert said in out.err and "): refused unread, nothing pruned" in out.err, out
    assert reconcile.record("outsider") is None, out
    assert reconcile.alive(pid) and reconcile.record("alpha")["ref"]["pid"] == pid, out
    seen = source(reconcile)
    assert seen["applied"] == leads_out and seen["state"] == "Degraded", seen
    assert said in seen["message"] and ") at this commit; nothing pruned" in seen["message"], seen
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_a_path_gone_at_a_commit_is_said_once_and_no_earlier_error_with_it(
    reconcile: Any, remote: Remote
) -> None:
    """A commit that deletes the manifests folder: every row repeated the folder's
    condition, and a record marked "spec invalid" by an earlier commit's file still said
    so, naming a file the applied commit does not have. As Argo CD says "path does not
    exist" of the app and keeps the last synced state, the source's line says the folder
    is gone at that commit, once, and the engines run on as they were, unmarked: `--once`
    too, which named the earlier file's error as if it were the commit's."""
    remote.deploy("alpha")
    remote.deploy("beta", basePort=reconcile.port + 10)
    reconcile.converge(*git_args(remote))
    pids = {n: reconcile.record(n)["ref"]["pid"] for n in ("alpha", "beta")}
    remote.deploy("alpha", basePort="notaport")
    reconcile("--once", *git_args(remote), check=1)
    assert "spec invalid" in reconcile("status", check=0).out  # that commit's file: true
    gone = remote.commit(
        {"manifests/alpha.yaml": None, "manifests/beta.yaml": None, "README": "moved\n"},
        "the manifests folder removed",
    )
    for wait in ((), ("--wait", "--timeout", "30s")):  # as a cron pass says it
        said = reconcile("--once", *wait, *git_args(remote), check=1)
        assert "no such folder" in said.err, said
        assert "spec invalid" not in said.err and "alpha.yaml:" not in said.err, said
    for verb in (("status",), ("status", "-o", "wide")):
        out = reconcile(*verb, check=0).out
        source_line, *rows = out.splitlines()
        assert f"Degraded at {gone[:12]}" in source_line, out
        assert out.count("no such folder") == 1, out
        assert "manifests: no such folder at this commit; nothing pruned" in source_line, out
        assert "spec invalid" not in out and "alpha.yaml:" not in out, out
        assert [r.split()[0] for r in rows[1:]] == ["alpha", "beta"], out
    items = {i["name"]: i for i in reconcile("status", "-o", "json", check=0).json()}
    assert items["alpha"]["spec_valid"] and "spec invalid" not in items["alpha"]["message"]
    assert all("no such folder" in i["conditions"][0] for i in items.values()), items
    described = reconcile("describe", "alpha", check=0).out
    assert "Spec valid:   true\n" in described and "no such folder" in described, described
    # describe -o json and the web page's JSON (what it renders) say what the text says
    (doc,) = reconcile("describe", "alpha", "-o", "json", check=0).json()
    page = NodeReader(reconcile.state, reconcile.node, reconcile.devices).state(events_of=None)
    (item,) = [d for d in page["deployments"] if d["name"] == "alpha"]
    for shown in (doc, item):
        messages = [shown["message"], *(i["message"] for i in shown["instances"])]
        assert shown["spec_valid"] and not any("spec invalid" in m for m in messages), shown
        assert any("no such folder" in c for c in shown["conditions"]), shown
    assert all(reconcile.alive(pid) for pid in pids.values())
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def _rows_under(said: Path, line: str) -> list[str] | None:
    """The last row of alpha and of beta that `status -w` printed, when both come after
    its last line holding ``line``; None before."""
    lines = said.read_text().splitlines()
    at = [i for i, text in enumerate(lines) if line in text]
    last = {text.split()[0]: text for text in lines[at[-1] + 1 :] if text.strip()} if at else {}
    return [last[n] for n in ("alpha", "beta")] if {"alpha", "beta"} <= set(last) else None


def test_watch_prints_the_source_line_and_its_rows_under_it(reconcile: Any, remote: Remote) -> None:
    """`status -w` printed no source line, so each of its rows carried the folder's
    condition that `status` says once, in the line above its table. It prints that line
    first, as `status` does, and again (every row under it) whenever it changes."""
    remote.deploy("alpha")
    remote.deploy("beta", basePort=reconcile.port + 10)
    reconcile.converge(*git_args(remote))
    gone = remote.commit(
        {"manifests/alpha.yaml": None, "manifests/beta.yaml": None, "README": "moved\n"},
        "the manifests folder removed",
    )
    reconcile("--once", *git_args(remote), check=1)
    said = reconcile.tmp / "watch.out"
    with said.open("wb") as out:
        watcher = reconcile.spawn(reconcile.argv("status", "-w"), stdout=out)
    degraded = f"Degraded at {gone[:12]}"
    reconcile.wait_for(lambda: _rows_under(said, degraded), 30, "the rows under the line")
    first, header, *_ = said.read_text().splitlines()
    assert first.startswith(f"source: {remote.url} main path manifests: {degraded}"), first
    assert header.split()[0] == "NAME" and said.read_text().count("no such folder") == 1
    remote.deploy("alpha")
    fixed = remote.deploy("beta", basePort=reconcile.port + 10)
    reconcile.converge(*git_args(remote))

    def synced() -> list[str] | None:
        rows = _rows_under(said, f"Synced at {fixed[:12]}")
        return rows if rows and not any("no such folder" in r for r in rows) else None

    reconcile.wait_for(synced, 30, "the rows under the Synced line")
    watcher.send_signal(signal.SIGINT)  # Ctrl-C
    assert watcher.wait(timeout=30) == 130
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_a_path_one_slip_from_a_folder_of_the_repository_names_it(
    reconcile: Any, remote: Remote
) -> None:
    """`--git-path manifest` (for manifests/) said "no such folder at this commit ... fix
    it and push", as if the repository were wrong: the folder it is one slip from is
    named, and where the path is set."""
    remote.deploy("alpha")
    typo = ("--git", remote.url, "--git-path", "manifest")
    out = reconcile("--once", *typo, check=1)
    hint = "(did you mean manifests? --git-path, or git.path in node.yaml)"
    assert f"manifest: no such folder at the applied commit {hint}" in out.err, out
    seen = source(reconcile)
    assert f"manifest: no such folder at this commit {hint}; nothing pruned" in seen["message"]
    far = reconcile("--once", "--git", remote.url, "--git-path", "deploy/prod", check=1)
    assert "deploy/prod: no such folder at the applied commit: nothing" in far.err, far
    assert "did you mean" not in far.err, far  # no guess


def test_an_edit_in_the_checkout_is_undone_by_the_next_move(reconcile: Any, remote: Remote) -> None:
    """The checkout is reconcile's: a stray file in it never reaches the next commit."""
    remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    stray = reconcile.state / "git" / "checkout" / "manifests" / "stray.yaml"
    stray.write_text(reconcile.dump_yaml(reconcile.deployment("stray")))
    remote.commit({"README": "next\n"}, "next")
    reconcile.converge(*git_args(remote))
    assert not stray.exists() and reconcile.record("stray") is None
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_git_never_acts_on_the_repository_around_the_checkout(tmp_path: Path) -> None:
    """A checkout whose .git is gone, in a state dir inside a clone (a dotfiles home, the
    manifests' own repository): git looked upwards and ran the move there."""
    outer = tmp_path / "home"
    outer.mkdir()
    run_git(outer, "init", "-q")
    (outer / "notes.txt").write_text("mine\n")
    run_git(outer, "add", "notes.txt")
    checkout = outer / "state" / "git" / "checkout"
    checkout.mkdir(parents=True)
    with pytest.raises(gitsource.GitFailed, match="not a git repository"):
        gitsource.git(checkout, "rm", "-q", "--cached", "notes.txt")
    assert run_git(outer, "diff", "--cached", "--name-only").split() == ["notes.txt"]


def test_a_manifest_that_does_not_load_is_degraded_named_and_never_a_good_commit(
    reconcile: Any, remote: Remote
) -> None:
    """A typo pushed: the source is Degraded, not Synced, and names the file and line as
    the repository has them; the engine the file declared runs on (invariant 4); the commit
    is no commit to roll back to; the fix makes the source Synced again."""
    good = remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    pid = reconcile.record("alpha")["ref"]["pid"]
    typo = "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: alpha\n"
    broken = remote.commit({"manifests/alpha.yaml": typo}, "a typo")
    once = reconcile("--once", *git_args(remote), check=1)
    seen = source(reconcile)
    assert seen["state"] == "Degraded" and seen["applied"] == broken, seen
    # The repository's names for the file, wherever a person reads them: the checkout's
    # place under the state dir is reconcile's, not theirs.
    checked = reconcile(*git_args(remote, "validate"), check=1)
    planned = reconcile(*git_args(remote, "plan"), check=1)
    for said in (seen["message"], once.err, checked.err, planned.out + planned.err):
        assert "manifests/alpha.yaml:4: invalid YAML" in said, said
        assert str(reconcile.state) not in said, said
    assert reconcile.alive(pid) and reconcile.record("alpha")["ref"]["pid"] == pid
    assert "Degraded" in reconcile("status", check=0).out.splitlines()[0]
    wide = reconcile("status", "-o", "wide", check=0).out
    described = reconcile("describe", "alpha", check=0).out
    assert " manifests/alpha.yaml " in wide and str(reconcile.state) not in wide, wide
    assert "Source:       manifests/alpha.yaml\n" in described, described

    fixed = remote.deploy("alpha", command=reconcile.demo_command(load_seconds="0.1"))
    reconcile.converge(*git_args(remote))
    seen = source(reconcile)
    assert seen["state"] == "Synced" and seen["applied"] == fixed, seen
    history = reconcile("history", "-o", "json", check=0).json()
    assert [(h["revision"], h["outcome"]) for h in history] == [
        (good, "Ready"),
        (broken, "Degraded"),
        (fixed, "Ready"),
    ], history
    dry = reconcile("rollback", "--dry-run", check=0)  # the last good commit but this one
    assert good[:12] in dry.out and broken[:12] not in dry.out, dry.out
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_a_new_file_with_a_yaml_syntax_error_is_shown_by_status_with_file_and_line(
    reconcile: Any, remote: Remote
) -> None:
    """A new manifest whose YAML does not parse names no deployment, so no record shows it
    Pending: `--once` and `plan` said it, `status` did not. It says it now, file and line
    as the repository has them, until a commit fixes the file."""
    remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    typo = "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: gamma\n"
    remote.commit({"manifests/gamma.yaml": typo}, "a new file, a typo")
    reconcile("--once", *git_args(remote), check=1)
    out = reconcile("status", check=0).out
    assert "\nnot loaded: manifests/gamma.yaml:4: invalid YAML: " in out, out
    assert str(reconcile.state) not in out, out
    remote.commit({"manifests/gamma.yaml": None}, "the typo removed")
    reconcile.converge(*git_args(remote))
    assert "not loaded" not in reconcile("status", check=0).out
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_an_invalid_spec_s_record_names_the_file_as_the_repository_has_it(
    reconcile: Any, remote: Remote
) -> None:
    """A manifest that loads but does not validate (its name readable): the running
    engine's record says "spec invalid" with the file as the repository names it
    (manifests/alpha.yaml:N), never the checkout's place under the state dir."""
    remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    pid = reconcile.record("alpha")["ref"]["pid"]
    remote.deploy("alpha", basePort="notaport")
    reconcile("--once", *git_args(remote), check=1)
    message = reconcile.record("alpha")["message"]
    assert message.startswith("spec invalid (engine left running): manifests/alpha.yaml:"), message
    table = reconcile("status", check=0).out + reconcile("describe", "alpha", check=0).out
    assert "git/checkout" not in table and " manifests/alpha.yaml:" in table, table
    assert reconcile.alive(pid) and reconcile.record("alpha")["ref"]["pid"] == pid
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_source_on_a_state_dir_without_git_says_so(reconcile: Any) -> None:
    out = reconcile("source", check=1)
    assert "follows no git source" in out.err, out


def test_a_torn_source_file_is_refused_and_moved_aside_by_hand_followed_afresh(
    reconcile: Any, remote: Remote
) -> None:
    """The refusal itself: tests/git/test_damaged_source.py; here its way out."""
    first = remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    state = StateDir(reconcile.state)
    state.git_source.write_text('{"url": "file:')  # torn by a disk that lied
    out = reconcile("source", check=1)  # named, with the way out, left in place
    assert f"{state.git_source}: not a valid document" in out.err, out
    assert "move it aside to follow the source afresh" in out.err, out
    assert "Traceback" not in out.err and state.git_source.read_text() == '{"url": "file:'
    reconcile("--once", *git_args(remote), check=1)  # refused: nothing fetched nor applied
    state.git_source.rename(state.git_source.with_name("source.json.bad"))  # the way out
    reconcile.converge(*git_args(remote))  # followed afresh: written again
    seen = source(reconcile)
    assert seen["state"] == "Synced" and seen["applied"] == first, seen
    state.git_history.write_text("[{")  # `history` reads it as none, and moves nothing
    out = reconcile("history", check=0)
    assert "state file skipped" in out.err and str(state.git_history) in out.err, out
    assert state.git_history.read_text() == "[{"
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_git_and_f_are_one_or_the_other(reconcile: Any, remote: Remote) -> None:
    out = reconcile("--once", "--git", remote.url, "-f", str(reconcile.manifests), check=64)
    assert "one or the other" in out.err, out
    both = reconcile("--once", "--git", remote.url, "--branch", "a", "--tag", "b", check=64)
    assert "--branch and --tag are one or the other" in both.err, both
    folder = str(reconcile.manifests)  # a git-only flag beside -f was silently ignored
    lone = reconcile("--once", "-f", folder, "--branch", "prod", check=64)
    assert "--branch is for a git source" in lone.err and "drop it" in lone.err, lone
    many = reconcile("--once", "-f", folder, "--interval", "5m", "--git-timeout", "9s", check=64)
    assert "--interval, --git-timeout are for a git source" in many.err, many


def test_node_yaml_git_section_with_a_flag_over_one_key(reconcile: Any, remote: Remote) -> None:
    remote.deploy("alpha")
    run_git(remote.work, "push", "-q", "origin", "HEAD:refs/heads/prod")
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(
        f"git:\n  url: {remote.url}\n  branch: nope\n  path: manifests/\n  interval: 1h\n"
    )
    reconcile.converge("--git", remote.url, "--branch", "prod")
    seen = source(reconcile)
    assert seen["branch"] == "prod" and seen["path"] == "manifests", seen
    assert reconcile.record("alpha")["owner"] == remote.owner()
    reconcile("--git", remote.url, "--branch", "prod", "down", check=0)


def test_node_yaml_git_settings_that_cannot_be_followed_name_their_line(
    reconcile: Any, remote: Remote
) -> None:
    """A branch beside a tag, or a path that climbs out of the repository, in node.yaml
    said `git: give a branch or a tag, not both (--branch / --tag)`: the flags' words,
    no file, no line."""
    reconcile.state.mkdir(parents=True, exist_ok=True)
    node_yaml = reconcile.state / "node.yaml"
    mine = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    for body, said in (
        ("  branch: main\n  tag: v1\n", ":4: git.tag: give a branch or a tag, not both"),
        ("  path: ../up\n", ":3: git.path: git path '../up' must be relative"),
    ):
        node_yaml.write_text(f"git:\n  url: {remote.url}\n{body}")
        out = reconcile("--once", *mine, "--devices", reconcile.devices, common=False, check=1)
        assert f"{node_yaml}{said}" in out.err, out
    node_yaml.write_text(f"git:\n  url: {remote.url}\n  branch: main\n")
    out = reconcile("--once", *mine, "--tag", "v1", common=False, check=1)  # the flag's word wins
    assert "couldn't find remote ref refs/tags/v1" in out.err, out


def test_a_repository_given_as_a_relative_path_is_found_from_where_it_was_given(
    reconcile: Any, remote: Remote
) -> None:
    """`reconcile --git ../ops.git`, as `git clone` takes it: the node's git ran in its own
    checkout, where the path named nothing ("'../ops.git' does not appear to be a git
    repository") though the repository was right there. A flag's path is taken from where
    the command runs, node.yaml's from the file's folder (as its tlsCert)."""
    first = remote.deploy("alpha")
    typed = os.path.relpath(remote.bare, reconcile.tmp)  # the CLI runs in reconcile.tmp
    assert not os.path.isabs(typed)
    reconcile.converge("--git", typed, "--git-path", "manifests")
    seen = source(reconcile)
    assert seen["url"] == str(remote.bare) and seen["applied"] == first, seen
    assert reconcile.record("alpha")["owner"] == f"git:{remote.bare}#manifests"
    newer = remote.deploy("beta")
    from_file = os.path.relpath(remote.bare, reconcile.state)
    (reconcile.state / "node.yaml").write_text(f"git: {{url: {from_file}, path: manifests}}\n")
    mine = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    reconcile("--once", *mine, "--devices", reconcile.devices, common=False, check=0)
    seen = source(reconcile)
    assert seen["url"] == str(remote.bare) and seen["applied"] == newer, seen
    reconcile("--git", typed, "--git-path", "manifests", "down", check=0)


def test_a_metric_per_state(reconcile: Any, remote: Remote) -> None:
    remote.deploy("alpha")
    metrics = reconcile.tmp / "metrics.prom"
    reconcile.converge(*git_args(remote), "--metrics-file", str(metrics))
    lines = metrics.read_text().splitlines()
    assert 'reconcile_git_source_state{state="Synced"} 1.0' in lines, lines
    for state in ("Progressing", "Degraded", "PullFailed", "Pinned", "Unverified"):
        assert f'reconcile_git_source_state{{state="{state}"}} 0.0' in lines, lines
    shutil.move(remote.bare, remote.bare.with_name("moved.git"))
    reconcile("--once", *git_args(remote), "--metrics-file", str(metrics), check=1)
    assert 'reconcile_git_source_state{state="PullFailed"} 1.0' in metrics.read_text()
    reconcile("--git", remote.url, "--git-path", "manifests", "down", check=0)


def test_down_under_a_daemon_following_git_names_the_file_in_the_repository(
    reconcile: Any, remote: Remote, git_daemon: Any
) -> None:
    """`down` says a daemon starts it again (issue 34): for a git source the manifest to
    change is the repository's (named as it has it), and the change is pushed; the node's
    checkout is not the place."""
    remote.deploy("alpha")
    d = git_daemon(*git_args(remote))
    d.wait(lambda: (reconcile.record("alpha") or {}).get("phase") == "Ready", "alpha Ready")
    down = reconcile(*git_args(remote, "down", "alpha"), check=0)
    assert f"the daemon (pid {d.proc.pid}) on this state dir starts alpha again" in down.err
    assert "(manifests/alpha.yaml:" in down.err and "and push" in down.err, down
    assert str(reconcile.state) not in down.err, down
    assert d.stop() == 0
    reconcile(*git_args(remote, "down"), check=0)


def test_errors_that_name_a_second_file_name_it_as_the_repository_does(
    reconcile: Any, remote: Remote
) -> None:
    """A duplicate name's error names the other file too: both as the repository has them."""
    text = reconcile.dump_yaml(reconcile.deployment("alpha", basePort=reconcile.port))
    remote.commit({"manifests/a.yaml": text, "manifests/b.yaml": text}, "alpha twice")
    reconcile("--once", *git_args(remote), check=1)
    said = reconcile(*git_args(remote, "validate"), check=1).err
    assert "manifests/a.yaml:4: metadata.name: duplicate deployment name 'alpha': also " in said
    assert "also declared in manifests/b.yaml:4" in said, said
    assert str(reconcile.state) not in said, said


def test_plan_for_another_source_than_the_state_dir_follows_plans_nothing(
    reconcile: Any, remote: Remote
) -> None:
    """`plan --git OTHER` planned the followed source's checkout under OTHER's name,
    "against commit X, the one the node applied" (never OTHER's), or showed the followed
    source's fetch error as OTHER's."""
    applied = remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    other = f"{remote.url}-other"
    planned = reconcile("--git", other, "--git-path", "manifests", "plan", check=2)
    assert planned.out.startswith(f"nothing applied yet from {other} (this state dir"), planned
    assert f"follows {remote.url} branch main path manifests)" in planned.out, planned
    assert applied[:12] not in planned.out and "owned by another" not in planned.out, planned
    reconcile("--once", "--git", remote.url, "--branch", "gone", check=1)  # a failed fetch
    planned = reconcile(*git_args(remote), "plan", check=2)  # not the branch gone's error
    assert "couldn't find remote ref" not in planned.out, planned
    reconcile(*git_args(remote), "down", check=0)


def test_a_source_followed_under_owner_is_judged_by_that_owner_s_records(
    reconcile: Any, remote: Remote
) -> None:
    """Another repository (a mirror of the first) is another owner: the pass names the
    conflict and `--owner` to keep the records' own. Under that `--owner`, `source` and
    `status` judged the deployments of `git:<url>#<path>`, none, and said Synced
    ("0 deployment(s) Ready") whatever the set's engines did."""
    remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    mirror = remote.bare.with_name("mirror.git")
    run_git(remote.bare.parent, "clone", "-q", "--bare", str(remote.bare), str(mirror))
    other = ("--git", str(mirror), "--git-path", "manifests")
    conflict = reconcile("--once", *other, check=1)
    assert f"--owner '{remote.owner()}'" in conflict.err, conflict
    kept = (*other, "--owner", remote.owner())
    reconcile.converge(*kept)
    seen = source(reconcile)
    assert seen["state"] == "Synced" and "1 deployment(s) Ready" in seen["message"], seen

    failing = [sys.executable, "-c", "raise SystemExit(3)"]
    remote.deploy("alpha", command=failing, restartPolicy="Never")
    run_git(remote.work, "push", "-q", "--force", str(mirror), "HEAD:main")
    reconcile("--once", "--wait", "--timeout", "60s", *kept, check=1, timeout=120)  # Failed
    seen = source(reconcile)
    assert seen["state"] == "Degraded" and "alpha Failed" in seen["message"], seen
    line = reconcile("status", check=0).out.splitlines()[0]
    assert "Degraded" in line, line
    reconcile(*kept, "down", check=0)


def test_a_commit_outside_the_path_moves_each_revision_without_an_event_each(
    reconcile: Any, remote: Remote
) -> None:
    """A busy monorepo: a commit that touches nothing under the git path journaled an
    "update ... (no spec change)" event per deployment. The records still carry the
    commit (DESIGN: each record its `revision`, `status` shows it), and no event says so."""
    remote.deploy("alpha")
    remote.deploy("beta", basePort=reconcile.port + 20)
    reconcile.converge(*git_args(remote))
    before = {name: len(reconcile.events(name)) for name in ("alpha", "beta")}
    elsewhere = remote.commit({"docs/README": "elsewhere\n"}, "a commit outside manifests/")
    reconcile.converge(*git_args(remote))
    assert source(reconcile)["applied"] == elsewhere
    for name in ("alpha", "beta"):
        assert reconcile.record(name)["revision"] == elsewhere
        assert len(reconcile.events(name)) == before[name], reconcile.events(name)
    table = reconcile("status", check=0).out
    rows = [ln for ln in table.splitlines() if ln.split()[:1] in (["alpha"], ["beta"])]
    assert len(rows) == 2 and all(elsewhere[:12] in ln for ln in rows), table
    reconcile(*git_args(remote, "down"), check=0)
    assert reconcile.record("alpha") is None and reconcile.record("beta") is None


def test_the_same_repository_spelled_otherwise_is_the_same_owner(
    reconcile: Any, remote: Remote
) -> None:
    """`--git /srv/ops` after `--git file:///srv/ops.git` made a new owner: every deployment
    conflicted with the records of the first spelling, and `--owner` on every command was
    the way out. Equivalent spellings are one owner, the one the records already carry."""
    first = remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    assert reconcile.record("alpha")["owner"] == remote.owner()
    pid = reconcile.record("alpha")["ref"]["pid"]
    newer = remote.deploy("beta", basePort=reconcile.port + 20)
    bare = str(remote.bare)
    for spelling in (bare.removesuffix(".git"), f"{bare}/", f"file://{bare}/"):
        out = reconcile.converge("--git", spelling, "--git-path", "manifests")
        assert "conflict" not in out.out + out.err, out
        for name in ("alpha", "beta"):
            rec = reconcile.record(name)
            assert rec["owner"] == remote.owner() and rec["revision"] == newer, rec
        seen = source(reconcile)
        assert seen["state"] == "Synced" and seen["applied"] == newer, seen
    assert first != newer and reconcile.record("alpha")["ref"]["pid"] == pid  # never restarted
    assert not [e for e in reconcile.events("alpha") if e["action"] in ("stop", "conflict")]
    reconcile("--git", bare.removesuffix(".git"), "--git-path", "manifests", "down", check=0)
    assert reconcile.record("alpha") is None and reconcile.record("beta") is None


def test_spellings_of_one_repository_compare_equal_and_others_do_not() -> None:
    from controller.store.sources.git.source import same_repository

    ssh = {"git@Example.com:org/ops.git", "ssh://git@example.com/org/ops/", "example.com:org/ops"}
    assert {same_repository(u) for u in ssh} == {"ssh://example.com/org/ops"}
    https = {"https://user:tok@Example.com/org/ops.git", "HTTPS://example.com/org/ops/"}
    assert {same_repository(u) for u in https} == {"https://example.com/org/ops"}
    local = {"/srv/ops.git", "/srv/ops/", "file:///srv/ops.git/", "/srv/x/../ops"}
    assert {same_repository(u) for u in local} == {"file:///srv/ops"}
    assert same_repository("/srv/ops2") != same_repository("/srv/ops")
    assert same_repository("https://example.com/org/ops") != same_repository(
        "https://example.com/org/Ops"
    )


def test_a_source_followed_again_under_another_spelling_keeps_its_records_owner(
    reconcile: Any, remote: Remote
) -> None:
    """Following another repository, then the first again spelled otherwise (its path
    for its file:// URL): source.json names the second by then, so the spelling was
    taken for a new owner, and each of the first's deployments conflicted with itself."""
    remote.deploy("alpha")
    reconcile.converge(*git_args(remote))
    pid = reconcile.record("alpha")["ref"]["pid"]
    other = Remote(remote.bare.parent.parent / "other", reconcile)
    other.deploy("beta", basePort=reconcile.port + 20)
    reconcile.converge("--git", other.url, "--git-path", "manifests")
    assert reconcile.record("beta")["owner"] == other.owner()
    again = reconcile.converge("--git", str(remote.bare) + "/", "--git-path", "manifests")
    assert "conflict" not in again.out + again.err, again
    rec = reconcile.record("alpha")
    assert rec["owner"] == remote.owner() and rec["ref"]["pid"] == pid, rec
    assert source(reconcile)["state"] == "Synced", source(reconcile)
    reconcile("--git", other.url, "--git-path", "manifests", "down", check=0)
    reconcile("--git", str(remote.bare), "--git-path", "manifests", "down", check=0)
    assert reconcile.record("alpha") is None and reconcile.record("beta") is None
