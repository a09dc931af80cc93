"""history and rollback on a real bare repository: a bad commit, a rollback to the last
good one (pinned), a push while pinned (fetched, not applied), --resume."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from controller.core.state import Phase
from controller.store.lock import FileLock
from controller.store.sources.git import source as gitsource
from controller.store.statedir import StateDir
from tests.engines.test_vllm_standin import KEY, STANDIN
from tests.git.conftest import Remote, run_git, source

GIT = ("--git-path", "manifests")


def node_only(rc: Any, *args: str, check: int | None = 0) -> Any:
    """The CLI with the node's options and no -f: the state dir's remembered source."""
    mine = ("--state-dir", str(rc.state), "--node", rc.node, "--devices", rc.devices)
    return rc(*args, *mine, check=check, common=False)


def test_rollback_pins_the_last_good_commit_until_resumed(reconcile: Any, remote: Remote) -> None:
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    bad = remote.deploy("alpha", command=[sys.executable, "-c", "raise SystemExit(3)"])
    # Its engine can never be Ready: the wait exits 1 however it ends. A pass replaces alpha
    # in one go (stop, then start in its next round) before the wait looks at its deadline,
    # and alpha crashes and restarts at once; a 30 s timeout sat out the 10 s back-off to the
    # second restart (the crash-loop verdict, tests/ux/test_ux_operator.py's business).
    reconcile("--once", "--wait", "--timeout", "3s", "--git", remote.url, *GIT, check=1)
    assert reconcile.record("alpha")["revision"] == bad

    dry = reconcile("rollback", "--dry-run", check=0)  # a plan against good's manifests
    assert good[:12] in dry.out, dry
    (line,) = [ln for ln in dry.out.splitlines() if " alpha " in ln]
    assert "replace" in line and "spec.command" in line, dry.out
    assert "1 to replace" in dry.out and "0 to destroy" in dry.out, dry.out
    assert source(reconcile)["applied"] == bad  # the dry run changed nothing

    out = reconcile("rollback", check=0)  # no daemon: the command's own pass applies it
    assert f"rolled back to {good[:12]}" in out.out, out
    node_only(reconcile, "--once", "--wait", "--timeout", "30s")  # the remembered source
    assert reconcile.record("alpha")["revision"] == good
    seen = source(reconcile)
    assert seen["state"] == "Pinned" and seen["pinned"] == good and seen["applied"] == good, seen

    newer = remote.commit({"README": "newer\n"}, "newer")
    node_only(reconcile, "--once")  # pinned and Ready: 0; the newer commit is fetched only
    seen = source(reconcile)
    assert seen["fetched"] == newer and seen["applied"] == good, seen
    assert newer[:12] in seen["message"], seen  # how far behind it is

    history = reconcile("history", "-o", "json", check=0).json()
    assert [h["revision"] for h in history] == [good, bad, good], history
    assert [h["outcome"] for h in history][:2] == ["Ready", "RolledBack"], history
    assert history[-1]["by"] == "rollback" and history[0]["by"] == "poll", history
    assert history[0]["subject"] == "deploy alpha" and history[0]["author"] == "Tess Ter"
    assert any(e["action"] == "rollback" for e in reconcile.events("alpha"))

    reconcile("rollback", "--resume")  # back to the newest commit (alpha crash-loops there)
    assert source(reconcile)["pinned"] is None
    resumes = [e for e in reconcile.events("alpha") if e["action"] == "resume"]
    assert len(resumes) == 1, reconcile.events("alpha")
    again = reconcile("rollback", "--resume", check=0)  # nothing pinned: said, nothing done
    assert "not pinned: already following main" in again.out, again
    assert [e for e in reconcile.events("alpha") if e["action"] == "resume"] == resumes
    assert reconcile.record("alpha")["revision"] == newer
    table = reconcile("history", check=0).out
    assert newer[:12] in table.splitlines()[-1], table
    node_only(reconcile, "down")
    assert reconcile.record("alpha") is None


def test_history_and_rollback_without_a_git_source_say_so(reconcile: Any) -> None:
    assert "follows no git source" in reconcile("history", check=1).err
    assert "follows no git source" in reconcile("rollback", check=1).err


def test_auto_rollback_to_the_last_good_commit_until_a_newer_one(
    reconcile: Any, remote: Remote, git_daemon: Any
) -> None:
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(
        f"git:\n  url: {remote.url}\n  path: manifests\n  autoRollback: {{progressDeadline: 3s}}\n"
    )
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url)
    bad = remote.deploy("alpha", command=[sys.executable, "-c", "raise SystemExit(3)"])
    d = git_daemon("--git", remote.url, "--interval", "1h", "--resync", "1s")
    d.wait(lambda: source(reconcile)["pinned"] == good, "the auto-rollback's pin")
    d.wait(lambda: (reconcile.record("alpha") or {}).get("revision") == good, "good applied")
    d.wait(lambda: reconcile.record("alpha")["phase"] == "Ready", "alpha Ready again")
    seen = source(reconcile)
    assert seen["state"] == "Pinned" and "auto-rollback" in seen["message"], seen
    history = reconcile("history", "-o", "json", check=0).json()
    assert [(h["revision"], h["outcome"]) for h in history][:2] == [
        (good, "Ready"),
        (bad, "RolledBack"),
    ], history
    assert history[-1]["revision"] == good and history[-1]["by"] == "auto-rollback", history
    events = reconcile.events("alpha")
    assert any(e["action"] == "auto-rollback" and bad[:12] in e["reason"] for e in events)
    assert d.stop() == 0

    newer = remote.deploy("alpha", command=reconcile.demo_command(load_seconds="0.1"))
    node_only(reconcile, "--once", "--wait", "--timeout", "30s")  # a newer commit lifts it
    seen = source(reconcile)
    assert seen["pinned"] is None and seen["applied"] == newer, seen
    node_only(reconcile, "down")


def test_a_drain_longer_than_the_progress_deadline_rolls_back_no_good_commit(
    reconcile: Any, remote: Remote
) -> None:
    """A good commit applied on a drained node waits for uncordon (its engine serves the
    old spec): a drain past autoRollback's progressDeadline rolled it back. The deadline
    now waits out the drain and counts again from its end (Kubernetes' paused rollout)."""
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(
        f"git:\n  url: {remote.url}\n  path: manifests\n  autoRollback: {{progressDeadline: 10m}}\n"
    )
    remote.deploy("alpha")
    reconcile.converge("--git", remote.url)
    reconcile("drain", "--ttl", "1h", "--reason", "maintenance", check=0)
    newer = remote.deploy("alpha", command=reconcile.demo_command(load_seconds="0.1"))
    held = reconcile.once("--git", remote.url, check=1)  # applied; the drain holds the change
    assert "held: node drained" in held.err, str(held)
    # The drain has lasted past the deadline: the commit's entry says it was applied then.
    entries = gitsource.read_history(reconcile.state)
    assert entries[-1]["revision"] == newer and "paused_at" in entries[-1], entries
    entries[-1]["applied_at"] = "2026-01-01T00:00:00+00:00"
    gitsource.write_history(reconcile.state, entries)
    reconcile.once("--git", remote.url, check=1)
    seen = source(reconcile)
    assert seen["pinned"] is None and seen["applied"] == newer, seen  # not rolled back
    reconcile("uncordon", check=0)
    reconcile.converge("--git", remote.url)  # the change applied within a fresh deadline
    seen = source(reconcile)
    assert seen["pinned"] is None and seen["applied"] == newer, seen
    history = reconcile("history", "-o", "json", check=0).json()
    assert (history[-1]["revision"], history[-1]["outcome"]) == (newer, "Ready"), history
    assert reconcile.record("alpha")["revision"] == newer
    node_only(reconcile, "down")


def test_a_dry_run_is_the_plan_against_the_older_commit(reconcile: Any, remote: Remote) -> None:
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    text = reconcile.dump_yaml(reconcile.deployment("beta", basePort=reconcile.port + 4))
    bad = remote.commit({"manifests/beta.yaml": text}, "add beta")
    reconcile.converge("--git", remote.url, *GIT)
    before = reconcile.pids()
    assert len(before) == 2, before

    dry = reconcile("rollback", good, "--dry-run", check=0)
    assert f"{bad[:12]} -> {good[:12]}" in dry.out, dry.out
    (line,) = [ln for ln in dry.out.splitlines() if " beta " in ln]
    assert "destroy" in line, dry.out  # beta is not in good's manifests
    assert "0 to create" in dry.out and "1 to destroy" in dry.out, dry.out
    # alpha, the same at both commits, was "manifest moved to /tmp/reconcile-rollback-..."
    (line,) = [ln for ln in dry.out.splitlines() if " alpha " in ln]
    assert "unchanged" in line and "0 to update in place" in dry.out, dry.out
    assert "reconcile-rollback-" not in dry.out + dry.err, dry  # the temp dir is ours
    assert reconcile.pids() == before  # nothing stopped or started
    assert source(reconcile)["pinned"] is None and source(reconcile)["applied"] == bad
    node_only(reconcile, "down")


def test_a_dry_run_reads_a_symlink_and_a_submodule_as_a_pass_does(
    reconcile: Any, remote: Remote
) -> None:
    """`rollback --dry-run` wrote each file of the older commit's folder with `git show`:
    a submodule in it (a gitlink) failed that (`fatal: bad object`, a traceback), and a
    symlink that stays in the folder (`beta.yaml -> beta.txt`, which a pass follows) was
    read as its target's text ("a document must be a mapping"). The older commit's plan is
    the plan a pass would make there: beta created, alpha unchanged, exit 0."""
    text = reconcile.dump_yaml(reconcile.deployment("beta", basePort=reconcile.port + 4))
    (remote.work / "manifests").mkdir()
    (remote.work / "manifests" / "beta.yaml").symlink_to("beta.txt")
    base = remote.deploy("alpha")
    remote.commit({"manifests/beta.txt": text}, "beta by a link", push=False)
    run_git(remote.work, "update-index", "--add", "--cacheinfo", f"160000,{base},manifests/lib")
    run_git(remote.work, "commit", "-q", "-m", "a submodule")
    run_git(remote.work, "push", "-q", "--force", "origin", "HEAD:main")
    good = run_git(remote.work, "rev-parse", "HEAD")
    # the submodule goes too: `add -A` drops it (no folder of it here)
    remote.commit({"manifests/beta.yaml": None, "manifests/beta.txt": None}, "beta gone")
    reconcile.converge("--git", remote.url, *GIT)
    dry = reconcile("rollback", good, "--dry-run", check=0)
    assert "Traceback" not in dry.err and "error" not in dry.out, dry
    (line,) = [ln for ln in dry.out.splitlines() if " beta " in ln]
    assert "create" in line and "1 to create" in dry.out and "1 unchanged" in dry.out, dry
    assert source(reconcile)["pinned"] is None
    node_only(reconcile, "down")


def test_a_dry_run_probes_a_starting_engine_with_its_envfrom_key(
    reconcile: Any, remote: Remote, tmp_path: Path
) -> None:
    """`rollback --dry-run` probed a Starting engine before it read envFrom's values (as
    `plan` did): its probe presented no key, was refused, and the plan showed an engine
    keyed from envFrom Starting where a pass found it Ready. It reads them first and its
    probe presents the key; the key in nothing it says."""
    rc = reconcile
    fake, secrets = tmp_path / "vllm", tmp_path / "engine.env"
    fake.write_text(STANDIN.format(python=sys.executable))
    fake.chmod(0o755)
    secrets.write_text(f"VLLM_API_KEY={KEY}\n")
    secrets.chmod(0o600)
    readiness = {"completion": {}, "deadlineSeconds": 600, "periodSeconds": 0.2}
    env = {"ARGV_FILE": str(tmp_path / "keyed.argv.json")}
    spec = {"engine": "vllm", "model": "tiny", "executable": str(fake), "command": None}
    good = remote.deploy(
        "keyed", **spec, env=env, readiness=readiness, envFrom=[{"file": str(secrets)}]
    )
    rc.converge("--git", remote.url, *GIT, timeout="60s")
    remote.commit({"NOTES.md": "no manifest changed\n"}, "notes")
    rc.converge("--git", remote.url, *GIT, timeout="60s")
    store = rc.store()
    record = store.read("keyed")
    assert record is not None and record.phase is Phase.READY, record
    store.write(dataclasses.replace(record, phase=Phase.STARTING))  # answering, not seen yet

    dry = rc("rollback", good, "--dry-run", check=0)
    lines = [ln.split() for ln in dry.out.splitlines() if " keyed " in ln]
    assert lines == [["keyed", "unchanged", "Ready"]], dry.out
    assert KEY not in dry.out + dry.err, dry
    node_only(rc, "down")


def test_a_once_naming_another_source_beside_the_daemon_keeps_the_pin(
    reconcile: Any, remote: Remote, git_daemon: Any
) -> None:
    """A `--once` with a mistyped --git-path (or another branch) on a state dir whose
    daemon follows the repository took the source's state as a new source's: the
    rollback's pin was dropped, and the daemon went back to the commit rolled back from.
    It is refused now, naming both sources; the pin and the engines stay."""
    from controller.cli.operate.restartverb import daemon_pid

    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    remote.deploy("alpha", command=reconcile.demo_command(load_seconds="0.1"))
    reconcile.converge("--git", remote.url, *GIT)
    reconcile("rollback", good, check=0)
    d = git_daemon("--git", remote.url, *GIT, "--interval", "1h")
    d.wait(lambda: daemon_pid(reconcile.state), "the daemon's lock")
    pids = reconcile.pids()

    typo = reconcile("--once", "--git", remote.url, "--git-path", "manifestz", check=1)
    assert "the daemon (pid" in typo.err and "path manifests;" in typo.err, typo
    assert "this run names" in typo.err and "path manifestz:" in typo.err, typo
    assert "Traceback" not in typo.err
    seen = source(reconcile)
    assert seen["pinned"] == good and seen["path"] == "manifests", seen
    assert reconcile.pids() == pids
    node_only(reconcile, "--once")  # the daemon's own source (the state dir's): it runs
    assert d.stop() == 0
    node_only(reconcile, "down")


def test_a_rollback_waiting_on_a_fetch_says_so(reconcile: Any, remote: Remote) -> None:
    """A daemon's fetch from a remote that hangs holds the checkout for up to 5 minutes:
    `reconcile rollback` waited all that time without a word, as if hung."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    remote.commit({"README": "newer\n"}, "newer")
    reconcile.once("--git", remote.url, *GIT)
    lock = FileLock(StateDir(reconcile.state).git_lock, what="git checkout lock")
    lock.acquire(10)  # as the daemon's fetch holds it
    err = reconcile.tmp / "rollback.err"
    mine = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    try:
        with open(err, "wb") as f:
            proc = reconcile.spawn(reconcile.argv("rollback", good, *mine, common=False), stderr=f)
        said = f"waiting for the git checkout: pid {os.getpid()} is using it"
        reconcile.wait_for(lambda: said in err.read_text(), 30, "the rollback says it waits")
        assert proc.poll() is None and source(reconcile)["pinned"] is None
    finally:
        lock.release()
    assert proc.wait(timeout=60) == 0, err.read_text()
    assert source(reconcile)["pinned"] == good
    node_only(reconcile, "down")


def test_a_force_pushed_away_blob_is_collected_and_every_history_commit_kept(
    reconcile: Any, remote: Remote
) -> None:
    """The node's git runs with gc.auto=0 and nothing collected its checkout: a large file
    from a history force-pushed away stayed on the state dir's disk for good. Once the
    object store has grown past gitsource.COLLECT_MIN it is collected, and each commit a
    rollback may name (history.json's, the pin) is kept by a ref of ours."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    side = remote.commit({"README": "side\n"}, "a side line, force-pushed away below")
    reconcile.converge("--git", remote.url, *GIT)
    reconcile("rollback", good, check=0)  # pinned: what is pushed now is fetched, not applied
    big = gitsource.COLLECT_MIN * 3 // 4  # under the floor: its fetch collects nothing
    (remote.work / "weights.bin").write_bytes(os.urandom(big))
    remote.commit({}, "a large file, by mistake")
    blob = run_git(remote.work, "rev-parse", "HEAD:weights.bin")
    node_only(reconcile, "--once")
    checkout = StateDir(reconcile.state).git_checkout
    assert run_git(checkout, "cat-file", "-t", blob) == "blob"  # fetched

    run_git(remote.work, "reset", "-q", "--hard", good)  # the mistake force-pushed away
    (remote.work / "other.bin").write_bytes(os.urandom(big))  # and the store past the floor
    fixed = remote.commit({}, "the large file gone, another")
    node_only(reconcile, "--once")
    seen = source(reconcile)
    assert seen["fetched"] == fixed and seen["applied"] == good, seen
    gone = subprocess.run(
        ["git", "-C", str(checkout), "cat-file", "-e", blob], capture_output=True, check=False
    )
    assert gone.returncode != 0, "the force-pushed-away blob is still in the checkout"

    reconcile("rollback", "--resume", check=0)  # to fixed, then back to each history commit
    assert source(reconcile)["applied"] == fixed
    history = reconcile("history", "-o", "json", check=0).json()
    assert {h["revision"] for h in history} == {good, side, fixed}, history
    for rev in (fixed, side, good):  # side: on no branch, kept by a ref of ours alone
        reconcile("rollback", rev, check=0)
        assert source(reconcile)["applied"] == rev
    assert reconcile.record("alpha")["revision"] == good
    node_only(reconcile, "down")
    assert reconcile.record("alpha") is None


def test_a_pin_on_a_commit_gone_from_the_remote_is_said_once_and_stops_no_fetch(
    reconcile: Any, remote: Remote, git_daemon: Any
) -> None:
    """A pin the checkout cannot reach (the remote's history rewritten without it, the
    checkout made again) can never be checked out. Each of the daemon's passes tried it
    again, warned again, said PullFailed until the next fetch's success said Pinned, and
    stopped the fetch in flight for it (a rollback's move goes first), so the node fetched
    at the pace of its passes. Now its first failure is said once (`source`, one event per
    deployment, one warning), the pin stands, the move is tried again with back-off, and
    the fetches go on, as Flux keeps its last artifact and requeues a GitRepository whose
    commit is gone."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    remote.commit({"README": "newer\n"}, "newer")
    reconcile.converge("--git", remote.url, *GIT)
    reconcile("rollback", good, check=0)
    pid = reconcile.record("alpha")["ref"]["pid"]
    run_git(remote.work, "checkout", "-q", "--orphan", "rewritten")
    remote.commit({}, "history rewritten")  # good is on no branch of the remote now
    forget_unreachable(remote)  # nor in its objects: a fetch by its id cannot bring it
    shutil.rmtree(StateDir(reconcile.state).git_checkout / ".git")  # a checkout made again

    failed = node_only(reconcile, "--once", check=1)  # fetched, and the move fails
    assert f"cannot check out {good[:12]}" in failed.err and "--resume" in failed.err, failed
    assert "the remote would not give it by its id" in failed.err, failed
    seen = source(reconcile)
    assert seen["state"] == "PullFailed" and seen["pinned"] == good, seen
    assert "the pin stands" in seen["message"] and "reconcile history" in seen["message"], seen

    d = git_daemon("--git", remote.url, *GIT, "--interval", "1h")
    passes = lambda: [ln for ln in d.lines() if ln.get("event") == "pass"]  # noqa: E731
    d.wait(passes, "the daemon's first pass")
    newest = remote.commit({"README": "newest\n"}, "newest")
    StateDir(reconcile.state).git_fetch_now.touch()  # as a webhook asks
    d.proc.send_signal(signal.SIGUSR1)
    d.wait(lambda: source(reconcile)["fetched"] == newest, "the fetch, pinned or not")
    for n in range(2):  # passes with no fetch in flight: each tried the move again
        before = len(passes())
        d.proc.send_signal(signal.SIGUSR1)
        d.wait(lambda before=before: len(passes()) > before, f"pass {n} asked for")
    seen = source(reconcile)
    assert seen["state"] == "PullFailed" and seen["pinned"] == good, seen  # not "Pinned"
    warned = [ln for ln in d.lines() if ln.get("event") == "git checkout failed"]
    stopped = [ln for ln in d.lines() if "a rollback's move goes first" in str(ln)]
    assert not warned and not stopped, d.tail()  # said by the --once, once
    said = [e for e in reconcile.events("alpha") if e["action"] == "checkout"]
    assert len(said) == 1 and said[0]["outcome"] == "failed", reconcile.events("alpha")
    assert reconcile.record("alpha")["ref"]["pid"] == pid  # the engine runs on, untouched

    reconcile("rollback", "--resume", check=0)  # the way out it names
    d.wait(lambda: source(reconcile)["state"] == "Synced", "the branch followed again")
    assert source(reconcile)["applied"] == newest
    assert d.stop() == 0
    node_only(reconcile, "down")
    assert reconcile.record("alpha") is None


def forget_unreachable(remote: Remote) -> None:
    """The bare remote's objects no branch reaches, dropped (as a host's gc does)."""
    run_git(remote.bare, "reflog", "expire", "--expire=now", "--all")
    run_git(remote.bare, "gc", "--quiet", "--prune=now")


def test_a_pin_on_a_commit_the_checkout_lacks_is_fetched_by_its_id(
    reconcile: Any, remote: Remote
) -> None:
    """A commit the remote still holds but the checkout lacks (a checkout made again, the
    branch force-pushed away from it) was refused by `rollback REV` ("no commit the node
    has fetched"), and a pin on it (`rollback` to the last good commit, autoRollback)
    failed its move until the branch brought it back. Now the move fetches it by its id,
    as Flux fetches a GitRepository's ref.commit."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    pid = reconcile.record("alpha")["ref"]["pid"]
    run_git(remote.work, "checkout", "-q", "--orphan", "rewritten")
    newer = remote.commit({"README": "rewritten\n"}, "history rewritten")  # alpha as it was
    shutil.rmtree(StateDir(reconcile.state).git_checkout / ".git")  # a checkout made again
    node_only(reconcile, "--once", "--wait", "--timeout", "30s")
    assert source(reconcile)["applied"] == newer
    with contextlib.suppress(gitsource.GitFailed):  # the premise: the checkout lacks it
        gitsource.git(StateDir(reconcile.state).git_checkout, "cat-file", "-e", good)
        raise AssertionError(f"the checkout holds {good}")

    dry = reconcile("rollback", "--dry-run", good, check=1)  # no manifests here to read
    assert "a dry run fetches nothing" in dry.err and f"rollback {good}" in dry.err, dry
    out = reconcile("rollback", good, check=0)  # no daemon: the command's pass moves
    assert f"rolled back to {good[:12]}" in out.out, out
    seen = source(reconcile)
    assert seen["state"] == "Pinned" and seen["pinned"] == seen["applied"] == good, seen
    assert reconcile.record("alpha")["revision"] == good
    assert reconcile.record("alpha")["ref"]["pid"] == pid  # the same spec: untouched
    assert reconcile("history", "-o", "json", check=0).json()[-1]["by"] == "rollback"

    reconcile("rollback", "--resume", check=0)
    assert source(reconcile)["applied"] == newer
    typo = reconcile("rollback", "0" * 40, check=1)  # a whole id the remote never had
    assert "the remote would not give it by its id" in typo.err and "--resume" in typo.err
    assert reconcile.record("alpha")["ref"]["pid"] == pid  # the engine runs on
    reconcile("rollback", "--resume", check=0)
    node_only(reconcile, "down")
    assert reconcile.record("alpha") is None


def test_a_daemon_s_move_to_a_commit_by_its_id_is_fetched_or_said_at_once(
    reconcile: Any, remote: Remote, git_daemon: Any
) -> None:
    """With a daemon, `rollback SHA` of a commit only another branch holds is fetched by
    the daemon's move; one the remote never had is said as soon as the daemon's move
    fails (`rollback` waited out its 60 s, then said only "has not applied it yet")."""
    remote.deploy("alpha")
    run_git(remote.work, "checkout", "-q", "-b", "feature")
    elsewhere = remote.commit({"README": "feature\n"}, "feature", push=False)
    run_git(remote.work, "push", "-q", "origin", "feature")  # main never had it
    run_git(remote.work, "checkout", "-q", "main")
    d = git_daemon("--git", remote.url, *GIT, "--interval", "1h")
    said = lambda: reconcile("source", "-o", "json", check=None)  # noqa: E731
    d.wait(lambda: said().code == 0 and said().json()["state"] == "Synced", "alpha Ready")

    reconcile("rollback", elsewhere, check=0)  # the daemon's pass fetches and moves
    seen = source(reconcile)
    assert seen["state"] == "Pinned" and seen["applied"] == elsewhere, seen
    typo = reconcile("rollback", "1" * 40, check=1)
    assert "not applied:" in typo.err and "would not give it by its id" in typo.err, typo
    assert source(reconcile)["applied"] == elsewhere  # the checkout stays where it was
    reconcile("rollback", "--resume", check=0)
    assert d.stop() == 0
    node_only(reconcile, "down")
    assert reconcile.record("alpha") is None


def test_a_rollback_stops_the_collection_of_a_large_checkout(
    reconcile: Any, remote: Remote, git_daemon: Any
) -> None:
    """The daemon collects its checkout after a fetch that grew it (`git gc`, under
    git.lock, up to 10 minutes for a very large one). A rollback's move stopped the fetch
    in flight, not the gc after it: it waited for the housekeeping, and `rollback` gave up
    after its minute ("the daemon has not applied it yet"). The gc is stopped as the fetch
    is (the next fetch collects again), and what a gc cut short leaves is removed."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    remote.commit({"README": "newer\n"}, "newer")
    reconcile.converge("--git", remote.url, *GIT)
    (remote.work / "weights.bin").write_bytes(os.urandom(gitsource.COLLECT_MIN + (1 << 20)))
    remote.commit({}, "a large file: its fetch collects the checkout")
    path = f"{_slow_gc(reconcile.tmp)}:{os.environ['PATH']}"
    d = git_daemon("--git", remote.url, *GIT, "--interval", "1h", env={"PATH": path})
    with _stopped_at_the_end(d.wait(lambda: _collecting(d.proc.pid), "the gc under way")) as gc:
        pack = StateDir(reconcile.state).git_checkout / ".git" / "objects" / "pack"
        left = [pack / ".tmp-4242-pack-0123.pack", pack.parent.parent / "gc.pid"]
        for path_left in left:  # what a real gc cut short leaves
            path_left.write_text("4242 node\n")
        out = reconcile("rollback", good, check=0)
        assert f"rolled back to {good[:12]}" in out.out, out
        d.wait(lambda: _ended(gc), "the gc stopped")
    assert source(reconcile)["applied"] == good and not any(p.exists() for p in left)
    (said,) = [ln for ln in d.lines() if ln.get("event") == "git checkout not collected"]
    assert said["reason"] == "stopped: a rollback's move goes first", said
    assert d.stop() == 0
    node_only(reconcile, "down")
    assert reconcile.record("alpha") is None


def test_a_rollback_without_a_daemon_stops_a_once_s_collection(
    reconcile: Any, remote: Remote
) -> None:
    """With no daemon, a cron `--once` collecting a large checkout held git.lock for its
    gc (up to 10 minutes): `rollback` waited for the lock its fetch limit and a minute,
    then failed. It stops the collection (anyone's: housekeeping, written down as it
    starts) and moves at once."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    remote.commit({"README": "newer\n"}, "newer")
    reconcile.converge("--git", remote.url, *GIT)
    (remote.work / "weights.bin").write_bytes(os.urandom(gitsource.COLLECT_MIN + (1 << 20)))
    large = remote.commit({}, "a large file: its fetch collects the checkout")
    env = {**reconcile.env, "PATH": f"{_slow_gc(reconcile.tmp)}:{os.environ['PATH']}"}
    with open(reconcile.tmp / "once.err", "wb") as err:
        once = reconcile.popen("--once", "--git", remote.url, *GIT, env=env, stderr=err)
    with _stopped_at_the_end(reconcile.wait_for(lambda: _collecting(once.pid), 30, "the gc")):
        out = reconcile("rollback", good, check=0)
    assert f"rolled back to {good[:12]}" in out.out, out
    assert "git gc stopped: a rollback's move goes first" in out.err, out
    assert once.wait(timeout=60) == 0  # its pass applied what it fetched, uncollected
    seen = source(reconcile)
    assert seen["applied"] == seen["pinned"] == good and seen["fetched"] == large, seen
    node_only(reconcile, "down")
    assert reconcile.record("alpha") is None


def _slow_gc(tmp: Path) -> Path:
    """A folder whose ``git`` is git, but for a gc that runs until it is stopped (a very
    large checkout's): put first on a reconcile's PATH."""
    folder = tmp / "slow-gc"
    folder.mkdir(exist_ok=True)
    wrapper = folder / "git"
    wrapper.write_text(
        '#!/bin/sh\nfor arg; do [ "$arg" = gc ] && exec sleep 600; done\n'
        f'exec {shutil.which("git")} "$@"\n'
    )
    wrapper.chmod(0o755)
    return folder


def _collecting(daemon: int) -> psutil.Process | None:
    """The daemon's `git gc` (the slow one: its wrapper became ``sleep``)."""
    for kid in psutil.Process(daemon).children():
        with contextlib.suppress(psutil.Error):
            if kid.name() == "sleep":
                return kid
    return None


def _ended(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def _stopped_at_the_end(proc: psutil.Process) -> Iterator[psutil.Process]:
    """The slow gc (a session of its own: the fixture's teardown misses it) stopped
    whatever the test found, if it is still that process."""
    try:
        yield proc
    finally:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if proc.is_running():  # pid and start time: never a reused pid's process
                os.killpg(proc.pid, signal.SIGKILL)


def test_a_rollback_to_a_tag_is_to_its_commit(reconcile: Any, remote: Remote) -> None:
    """`rollback v1` was refused, asking for a commit: the checkout fetches no tags, so a
    tag (a revision Argo CD and Flux take) was no name it knew. The remote is asked what a
    tag (an annotated one: its commit) or a branch of that name is at; a name it lacks is
    refused with the next move."""
    good = remote.deploy("alpha")
    run_git(remote.work, "tag", "-a", "v1", "-m", "release 1")  # annotated: peeled
    run_git(remote.work, "push", "-q", "origin", "v1")
    reconcile.converge("--git", remote.url, *GIT)
    newer = remote.commit({"README": "newer\n"}, "newer")
    reconcile.converge("--git", remote.url, *GIT)
    assert source(reconcile)["applied"] == newer

    dry = reconcile("rollback", "--dry-run", "v1", check=0)
    assert good[:12] in dry.out, dry
    out = reconcile("rollback", "v1", check=0)
    assert f"rolled back to {good[:12]}" in out.out, out
    seen = source(reconcile)
    assert seen["pinned"] == good and seen["applied"] == good, seen
    refused = reconcile("rollback", "v9", check=1).err
    assert "'v9' is no commit the node has fetched, nor a tag or branch of the remote" in refused
    assert "`git rev-parse v9^{commit}` in a clone" in refused, refused
    assert source(reconcile)["pinned"] == good  # the refusal changed nothing
    node_only(reconcile, "down")


def test_a_resume_onto_a_commit_that_does_not_load_says_why_it_exits_1(
    reconcile: Any, remote: Remote
) -> None:
    """A README trial: `rollback --resume` to a branch whose newest commit holds a typo
    exited 1 saying only `resumed: following main again`; the why went to a JSON log line."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    typo = "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: beta}\nspec: {prot: 1}\n"
    remote.commit({"manifests/beta.yaml": typo}, "a typo")
    node_only(reconcile, "--once", check=1)  # Degraded: beta does not load
    assert f"rolled back to {good[:12]}" in reconcile("rollback", check=0).out
    resumed = reconcile("rollback", "--resume", check=1)
    assert "resumed: following main again" in resumed.out, resumed
    assert "manifests/beta.yaml:4" in resumed.err and "spec.prot" in resumed.err, resumed
    node_only(reconcile, "down")


def test_a_resume_the_daemon_applies_onto_a_commit_that_does_not_load_exits_1(
    reconcile: Any, remote: Remote, git_daemon: Any
) -> None:
    """With a daemon, `rollback --resume` onto a commit whose manifest does not load exited
    0 once the daemon applied it; it now waits for that pass's end and says why, as the
    command's own pass does without a daemon (the test above)."""
    from controller.cli.operate.restartverb import daemon_pid

    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    typo = "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: beta}\nspec: {prot: 1}\n"
    remote.commit({"manifests/beta.yaml": typo}, "a typo")
    node_only(reconcile, "--once", check=1)  # fetched and applied: beta does not load
    assert f"rolled back to {good[:12]}" in reconcile("rollback", check=0).out
    d = git_daemon("--git", remote.url, *GIT, "--interval", "1h")
    d.wait(lambda: daemon_pid(reconcile.state), "the daemon's lock")
    resumed = reconcile("rollback", "--resume", check=1)
    assert "resumed: following main again" in resumed.out, resumed
    assert "manifests/beta.yaml:4" in resumed.err and "spec.prot" in resumed.err, resumed
    assert d.stop() == 0
    node_only(reconcile, "down")


def test_a_resume_beside_the_daemon_fetches_first_not_the_commit_fetched_an_interval_ago(
    reconcile: Any, remote: Remote, git_daemon: Any
) -> None:
    """Pinned below a bad commit the daemon had fetched, a fix pushed, `rollback --resume`:
    the daemon applied the commit it fetched last, up to its interval old (the bad one
    again: a good engine stopped for it) until its next fetch. A resume fetches first, as a
    `--once` beside the daemon does: the node goes to the fix, never to the stale one."""
    from controller.cli.operate.restartverb import daemon_pid

    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    reconcile("rollback", good, check=0)
    stale = remote.deploy("alpha", command=reconcile.demo_command(load_seconds="0.1"))
    d = git_daemon("--git", remote.url, *GIT, "--interval", "1h")
    d.wait(lambda: daemon_pid(reconcile.state), "the daemon's lock")
    d.wait(lambda: source(reconcile)["fetched"] == stale, "the daemon's first fetch")
    fix = remote.deploy("alpha", command=reconcile.demo_command(load_seconds="0.2"))
    resumed = reconcile("rollback", "--resume", check=0)
    assert "resumed: following main again" in resumed.out, resumed
    seen = source(reconcile)
    assert seen["applied"] == fix and seen["pinned"] is None, seen
    applied = [e["revision"] for e in reconcile("history", "-o", "json", check=0).json()]
    assert stale not in applied and applied[-1] == fix, applied
    assert d.stop() == 0
    node_only(reconcile, "down")
