"""A remote that hangs: the fetch's limit (``--git-timeout``, ``git.timeout``) ends the
fetch while the last good commit runs on, and a git left fetching by a reconcile that was
SIGKILLed (the OOM killer) no longer holds the checkout, and every later pass, for good.

The remote is a real repository reached through a fake ``ssh`` (``GIT_SSH_COMMAND``, as a
node's own credentials are given): it runs ``git-upload-pack`` here, or hangs (``sleep``)
while the test's ``hang`` file exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from controller.store.lock import FileLock
from controller.store.sources.git.source import peek_status
from controller.store.statedir import StateDir
from tests.git.conftest import GitDaemon, Remote, run_git, source

GIT = ("--git-path", "manifests")


class HungRemote:
    """``remote``'s repository over ``ssh://``; ``hang(True)`` makes every fetch hang."""

    def __init__(self, remote: Remote, root: Path) -> None:
        self.remote = remote
        self.flag = root / "hang"
        ssh = root / "fake-ssh"
        ssh.write_text(f'#!/bin/sh\n[ -e "{self.flag}" ] && exec sleep 600\nexec sh -c "$2"\n')
        ssh.chmod(0o755)
        # "simple": git passes the host and the command alone (no -G probe, no -o options)
        self.env = {"GIT_SSH_COMMAND": str(ssh), "GIT_SSH_VARIANT": "simple"}

    @property
    def url(self) -> str:
        return f"ssh://node{self.remote.bare}"

    def hang(self, on: bool) -> None:
        if on:
            self.flag.touch()
        else:
            self.flag.unlink(missing_ok=True)


@pytest.fixture
def hung(remote: Remote, reconcile: Any) -> HungRemote:
    found = HungRemote(remote, reconcile.tmp)
    reconcile.env.update(found.env)  # every reconcile the test runs reaches it so
    return found


def test_the_fetch_limit_ends_a_hung_fetch_and_the_last_good_commit_runs_on(
    reconcile: Any, remote: Remote, hung: HungRemote, git_daemon: Any
) -> None:
    """The limit was a fixed 300 s, inside the pass: a remote that hangs held every pass
    five minutes at a time. ``--git-timeout`` sets it (Flux's ``spec.timeout``)."""
    good = remote.deploy("alpha")
    d = git_daemon("--git", hung.url, *GIT, "--interval", "1s", "--git-timeout", "2s")
    d.wait(lambda: (reconcile.record("alpha") or {}).get("phase") == "Ready", "alpha Ready")
    pid = reconcile.record("alpha")["ref"]["pid"]
    hung.hang(True)
    remote.deploy("beta")

    def timed_out() -> list[dict[str, Any]]:
        return [
            x
            for x in d.lines()
            if x.get("event") == "git fetch failed" and "took more than 2s" in x["error"]
        ]

    (failed, *_) = d.wait(timed_out, "a fetch stopped at its 2 s limit")
    assert "raise the limit (--git-timeout, or git.timeout in node.yaml)" in failed["error"]
    seen = source(reconcile)
    assert seen["state"] == "PullFailed" and seen["applied"] == good, seen
    assert "git fetch took more than 2s (stopped)" in seen["message"], seen
    assert reconcile.alive(pid) and reconcile.record("beta") is None
    hung.hang(False)  # the remote answers again: the next fetch applies beta
    d.wait(lambda: (reconcile.record("beta") or {}).get("phase") == "Ready", "beta Ready")
    assert d.stop() == 0
    reconcile("--git", hung.url, *GIT, "down", check=0)


def test_a_once_with_no_flags_keeps_the_limit_its_source_was_given(
    reconcile: Any, remote: Remote, hung: HungRemote
) -> None:
    """The state dir remembers the source (README): its fetch limit too, as its interval."""
    remote.deploy("alpha")
    hung.hang(True)
    first = reconcile("--once", "--git", hung.url, *GIT, "--git-timeout", "1s", check=1)
    assert "git fetch took more than 1s (stopped)" in first.err, first
    node = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    again = reconcile("--once", *node, "--devices", reconcile.devices, common=False, check=1)
    assert "git fetch took more than 1s (stopped)" in again.err, again


def test_a_rollback_s_fetch_by_id_from_a_remote_that_hangs_ends_at_the_limit(
    reconcile: Any, remote: Remote, hung: HungRemote
) -> None:
    """A rollback to a commit the checkout lacks fetches it by its id, within the fetch's
    limit: a remote that hangs is said as such (not "the remote no longer has it"), the
    pin stands and the engine runs on."""
    remote.deploy("alpha")
    reconcile.converge("--git", hung.url, *GIT, "--git-timeout", "2s")
    pid = reconcile.record("alpha")["ref"]["pid"]
    run_git(remote.work, "checkout", "-q", "-b", "feature")
    elsewhere = remote.commit({"README": "feature\n"}, "feature", push=False)
    run_git(remote.work, "push", "-q", "origin", "feature")  # not on the branch followed
    hung.hang(True)
    out = reconcile("rollback", elsewhere, check=1)  # no daemon: the command's own move
    assert "its fetch by id from the remote timed out" in out.err, out
    assert "took more than 2s" in out.err and "git.timeout" in out.err, out
    seen = source(reconcile)
    assert seen["pinned"] == elsewhere and seen["applied"] != elsewhere, seen
    assert reconcile.alive(pid)
    hung.hang(False)
    reconcile("rollback", elsewhere, check=0)  # asked again: tried at once, fetched
    assert source(reconcile)["applied"] == elsewhere
    reconcile("--git", hung.url, *GIT, "down", check=0)


def test_a_git_left_fetching_by_a_sigkilled_reconcile_is_stopped_by_the_next_pass(
    reconcile: Any, remote: Remote, hung: HungRemote
) -> None:
    """The git inherits git.lock (so no second git runs beside it): once its reconcile
    was SIGKILLed mid-fetch, nothing stopped it at its limit, and a fetch from a remote
    that hangs held the lock for good: every later pass waited 5 minutes on it, then
    failed. The next pass now stops that git (proved ours: pid and start time written
    down as it started, its reconcile gone) and fetches again."""
    remote.deploy("alpha")
    reconcile.converge("--git", hung.url, *GIT)
    hung.hang(True)
    newer = remote.deploy("beta")
    once = reconcile.popen("--once", "--git", hung.url, *GIT)
    with _stopped_at_the_end(
        reconcile.wait_for(lambda: _hung_fetch(once.pid), 30, "a hung git fetch")
    ) as git:
        once.send_signal(signal.SIGKILL)
        assert once.wait(timeout=30) == -signal.SIGKILL
        assert git.is_running(), "the orphan must outlive its reconcile for this test"
        hung.hang(False)
        again = reconcile("--once", "--git", hung.url, *GIT, check=0, timeout=60)
        assert "git left running by a reconcile that died; stopped" in again.err, again
        assert _gone(git), f"git (pid {git.pid}) still running"
    assert source(reconcile)["applied"] == newer
    assert reconcile.record("beta") is not None
    reconcile("--git", hung.url, *GIT, "down", check=0)


def test_a_wait_for_the_checkout_ends_when_its_holder_is_killed_mid_fetch(
    reconcile: Any, remote: Remote, hung: HungRemote
) -> None:
    """A rollback (or a pass) already waiting for the checkout when the reconcile holding
    it was SIGKILLed mid-fetch went on waiting on the git left behind, to its limit."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", hung.url, *GIT)
    remote.deploy("beta")
    hung.hang(True)
    once = reconcile.popen("--once", "--git", hung.url, *GIT)
    with _stopped_at_the_end(
        reconcile.wait_for(lambda: _hung_fetch(once.pid), 30, "a hung git fetch")
    ) as git:
        hung.hang(False)  # that git hangs on; the rollback's own pass fetches
        err = reconcile.tmp / "rollback.err"
        mine = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
        with open(err, "wb") as f:
            argv = reconcile.argv("rollback", good, *mine, common=False)
            proc = reconcile.spawn(argv, stderr=f)
        said = "waiting for the git checkout"
        reconcile.wait_for(lambda: said in err.read_text(), 30, "the rollback waits")
        once.send_signal(signal.SIGKILL)
        assert once.wait(timeout=30) == -signal.SIGKILL
        assert proc.wait(timeout=60) == 0, err.read_text()
        assert "git left running by a reconcile that died; stopped" in err.read_text()
        assert _gone(git), f"git (pid {git.pid}) still running"
    assert source(reconcile)["pinned"] == good
    reconcile("--git", hung.url, *GIT, "down", check=0)


@pytest.mark.parametrize("case", ["pid-reused", "its-reconcile-lives"])
def test_a_git_not_proved_an_orphan_is_never_signalled(
    reconcile: Any, remote: Remote, case: str
) -> None:
    """Only a process that is the git written down (pid and start time) whose reconcile
    is gone is stopped: a pid another process has now, or a git whose reconcile still
    runs (it stops its git itself), is waited for, as any holder of the lock is."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url, *GIT)
    other = reconcile.spawn(["sleep", "600"])
    me, it = psutil.Process(), psutil.Process(other.pid)
    git = {"pid": other.pid, "start_time": it.create_time()}
    by = {"pid": os.getpid(), "start_time": me.create_time()}  # alive: the test itself
    if case == "pid-reused":  # written down for a git that started long before
        git["start_time"] -= 3600
        by["start_time"] -= 3600  # and its reconcile's pid another's now too
    state = StateDir(reconcile.state)
    written = {"version": 1, "git": git, "by": by}
    state.git_running.write_text(json.dumps(written))
    lock = FileLock(state.git_lock, what="git checkout lock")
    lock.acquire(10)  # held, as by a git the test stands for
    err = reconcile.tmp / "rollback.err"
    mine = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    try:
        with open(err, "wb") as f:
            argv = reconcile.argv("rollback", good, *mine, common=False)
            proc = reconcile.spawn(argv, stderr=f)
        said = "waiting for the git checkout"
        reconcile.wait_for(lambda: said in err.read_text(), 30, "the rollback waits")
        assert other.poll() is None, "a process not proved ours was signalled"
    finally:
        lock.release()
    assert proc.wait(timeout=60) == 0, err.read_text()
    assert other.poll() is None and "stopped" not in err.read_text()
    reconcile("--git", remote.url, *GIT, "down", check=0)


def test_sigterm_stops_the_fetch_made_beside_the_passes(
    reconcile: Any, remote: Remote, hung: HungRemote, git_daemon: Any
) -> None:
    """The daemon's fetch runs on a thread of its own: a stop ends it as it ended the
    fetch of a pass (no git left holding the checkout, no wait for its limit)."""
    remote.deploy("alpha")
    d = git_daemon("--git", hung.url, *GIT, "--interval", "1s", "--git-timeout", "5m")
    d.wait(lambda: (reconcile.record("alpha") or {}).get("phase") == "Ready", "alpha Ready")
    hung.hang(True)
    with _stopped_at_the_end(d.wait(lambda: _hung_fetch(d.proc.pid), "a hung git fetch")) as git:
        assert d.stop() == 0, d.tail()
        assert _gone(git), f"git (pid {git.pid}) left running"
    lock = FileLock(StateDir(reconcile.state).git_lock, what="git checkout lock")
    assert lock.try_acquire(), "git.lock still held: the next daemon would wait on it"
    lock.release()
    assert "fetch stopped: the daemon is stopping" in d.log.read_text(), d.tail()
    hung.hang(False)
    reconcile("--git", hung.url, *GIT, "down", check=0)


def test_sigterm_stops_a_move_s_fetch_by_id(
    reconcile: Any, remote: Remote, hung: HungRemote, git_daemon: Any
) -> None:
    """A rollback's move fetching a commit the checkout lacks, by its id, from a remote
    that hangs: the daemon's stop ends that fetch too, not after its limit (5 minutes)."""
    remote.deploy("alpha")
    run_git(remote.work, "checkout", "-q", "-b", "feature")
    elsewhere = remote.commit({"README": "feature\n"}, "feature", push=False)
    run_git(remote.work, "push", "-q", "origin", "feature")  # not on the branch followed
    d = git_daemon("--git", hung.url, *GIT, "--interval", "1h", "--git-timeout", "5m")
    d.wait(lambda: (reconcile.record("alpha") or {}).get("phase") == "Ready", "alpha Ready")
    hung.hang(True)
    # its wait for the daemon's move would outlast the daemon: ended below
    rollback = reconcile.popen("rollback", elsewhere)
    with _stopped_at_the_end(d.wait(lambda: _hung_fetch(d.proc.pid), "the move's fetch")) as git:
        assert elsewhere in git.cmdline(), git.cmdline()  # the move's, by id
        assert d.stop() == 0, d.tail()
        assert _gone(git), f"git (pid {git.pid}) left running"
    rollback.kill()
    rollback.wait(timeout=30)
    lock = FileLock(StateDir(reconcile.state).git_lock, what="git checkout lock")
    assert lock.try_acquire(), "git.lock still held: the next daemon would wait on it"
    lock.release()
    stopped = [x for x in d.lines() if x.get("event") == "git checkout not moved"]
    assert stopped and "the daemon is stopping" in stopped[0]["reason"], d.tail()
    seen = source(reconcile)  # a stop is no failure of the move: the next start moves
    assert seen["pinned"] == elsewhere and "cannot check out" not in seen["message"], seen
    hung.hang(False)
    reconcile("rollback", "--resume", check=0)
    reconcile("--git", hung.url, *GIT, "down", check=0)


@pytest.mark.parametrize(
    ("value", "said"),
    [("0", "'0' is zero"), ("soon", "'soon' is not a duration"), ("-5s", "'-5s' is negative")],
    ids=["zero", "words", "negative"],
)
def test_a_bad_fetch_limit_flag_is_a_usage_error(reconcile: Any, value: str, said: str) -> None:
    out = reconcile("--once", "--git", "file:///nowhere.git", f"--git-timeout={value}", check=64)
    assert "--git-timeout" in out.err and said in out.err, out


def test_a_bad_fetch_limit_in_node_yaml_names_its_line(reconcile: Any, remote: Remote) -> None:
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(f"git:\n  url: {remote.url}\n  timeout: 0s\n")
    out = reconcile("--once", check=1)
    assert "node.yaml:3: git.timeout: '0s' is no length of time" in out.err, out
    assert "Traceback" not in out.err


def test_the_fetch_limit_without_a_source_says_what_it_needs(reconcile: Any) -> None:
    mine = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    out = reconcile("--once", "--git-timeout", "5m", *mine, common=False, check=1)
    assert "--git-timeout need --git URL" in out.err, out


def _hung_fetch(pid: int) -> psutil.Process | None:
    """The ``git fetch`` ``pid`` runs, once it hangs: its fake ssh is sleeping (until then
    it may still find the ``hang`` file gone, and fetch)."""
    for kid in psutil.Process(pid).children():
        with contextlib.suppress(psutil.Error):
            if kid.name() == "git" and "fetch" in kid.cmdline():
                below = kid.children(recursive=True)
                return kid if any(p.name() == "sleep" for p in below) else None
    return None


def _gone(proc: psutil.Process) -> bool:
    """Ended (a zombie counts: an orphan's reaper may be slow, or none)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@contextlib.contextmanager
def _stopped_at_the_end(git: psutil.Process) -> Iterator[psutil.Process]:
    """The orphan git (a session of its own: the fixture's teardown misses it) and its
    fake ssh stopped whatever the test found, if it is still that process."""
    try:
        yield git
    finally:
        with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
            if git.is_running():  # pid and start time: never a reused pid's process
                os.killpg(git.pid, signal.SIGKILL)


def test_passes_go_on_while_a_fetch_hangs(
    reconcile: Any, remote: Remote, hung: HungRemote, git_daemon: Any
) -> None:
    """The fetch ran inside the pass, under the pass lock: while a remote hung, nothing
    else happened on the node for the whole fetch limit (here 5 minutes), at every retry:
    an engine killed meanwhile stayed down, and a cron `--once` of another set failed on
    the lock. The daemon now fetches beside its passes (Flux's source-controller beside
    its kustomize-controller): the engine is restarted at once (the first restart is
    immediate) on the commit applied, while the fetch still hangs, and the commit the
    fetch brings is applied as soon as one succeeds."""
    good = remote.deploy("alpha")
    d = git_daemon("--git", hung.url, *GIT, "--interval", "1s", "--git-timeout", "5m")
    d.wait(lambda: (reconcile.record("alpha") or {}).get("phase") == "Ready", "alpha Ready")
    old = reconcile.record("alpha")["ref"]["pid"]
    hung.hang(True)
    newer = remote.deploy("beta")
    with _stopped_at_the_end(d.wait(lambda: _hung_fetch(d.proc.pid), "a hung git fetch")) as git:
        os.kill(old, signal.SIGKILL)

        def restarted() -> bool:
            rec = reconcile.record("alpha") or {}
            return rec.get("phase") == "Ready" and rec["ref"]["pid"] != old

        d.wait(restarted, "alpha restarted while the fetch hangs")
        assert reconcile.record("alpha")["revision"] == good
        seen = source(reconcile)
        assert seen["applied"] == good and reconcile.record("beta") is None, seen
        # cron's `--once` of another manifest set, and its `down`, get the pass lock (they
        # waited for it 60 s, then failed)
        reconcile.write("gamma")
        reconcile("--once", "--wait", "--timeout", "15s", check=0, timeout=30)
        assert (reconcile.record("gamma") or {}).get("phase") == "Ready"
        reconcile("down", check=0, timeout=20)
        assert reconcile.record("gamma") is None
        assert git.is_running(), "the fetch ended: this proves nothing"
        hung.hang(False)
        os.killpg(git.pid, signal.SIGKILL)  # the remote drops the connection: a retry
    d.wait(lambda: (reconcile.record("beta") or {}).get("phase") == "Ready", "beta Ready")
    assert source(reconcile)["applied"] == newer
    assert d.stop() == 0
    reconcile("--git", hung.url, *GIT, "down", check=0)


def _said(d: Any, event: str, trigger: str | None = None) -> bool:
    """The daemon logged ``event`` (a pass: one ``trigger`` among those it ran for)."""
    return any(
        x.get("event") == event and (trigger is None or trigger in x["trigger"].split(","))
        for x in d.lines()
    )


def _applied(rc: Any) -> str | None:
    """The commit the node runs, from its source file (None: none yet, or no file yet)."""
    st = peek_status(rc.state)
    return None if st is None else st.applied


def test_a_daemon_with_no_checkout_fetches_beside_its_loop_and_keeps_the_engines(
    reconcile: Any, remote: Remote, hung: HungRemote, git_daemon: Any
) -> None:
    """A daemon's pass onto a checkout not current (none yet: here its folder was removed)
    fetched on the loop's own thread: while the remote hung, for the fetch's whole limit,
    the loop answered nothing (a SIGHUP, an engine's exit, the gateway). The fetch runs on
    its thread from the start now; meanwhile nothing of the source is read, and the
    records' engines are kept (``--allow-empty`` or not: no folder read is no empty one)."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", hung.url, *GIT)
    pid = reconcile.record("alpha")["ref"]["pid"]
    shutil.rmtree(StateDir(reconcile.state).git)
    hung.hang(True)
    d = git_daemon("--git", hung.url, *GIT, "--git-timeout", "5m", "--allow-empty")
    with _stopped_at_the_end(d.wait(lambda: _hung_fetch(d.proc.pid), "a hung git fetch")) as git:
        d.wait(lambda: _said(d, "pass"), "a pass while the first fetch hangs")
        d.proc.send_signal(signal.SIGHUP)
        d.wait(lambda: _said(d, "configuration reloaded"), "the SIGHUP answered meanwhile")
        d.wait(lambda: _said(d, "pass", trigger="sighup"), "the reload's pass meanwhile")
        assert reconcile.alive(pid) and reconcile.record("alpha")["ref"]["pid"] == pid
        # The source is said while its first fetch runs ("follows no git source" before).
        said = reconcile("source", check=0).out
        assert re.search(r"state: +Progressing", said), said
        assert "not fetched yet (the first fetch began " in said, said
        assert git.is_running(), "the fetch ended: this proves nothing"
        hung.hang(False)
        os.killpg(git.pid, signal.SIGKILL)  # the remote drops the connection: a retry
    d.wait(lambda: _applied(reconcile) == good, "the commit checked out again")
    assert reconcile.record("alpha")["ref"]["pid"] == pid and reconcile.alive(pid)
    assert d.stop() == 0, d.tail()
    reconcile("--git", hung.url, *GIT, "down", check=0)


def test_a_branch_changed_by_sighup_runs_the_commit_applied_while_its_fetch_hangs(
    reconcile: Any, remote: Remote, hung: HungRemote
) -> None:
    """Another branch in node.yaml, then SIGHUP: the pass after the reload fetched it on
    the loop's thread, so a remote that hung held every restart for the fetch's limit.
    The commit applied (the same repository and path: the same records) runs on while
    the new branch is fetched beside the loop, as Flux serves its last artifact: a
    crashed engine restarts at once, and the branch's commit is applied once fetched."""
    good = remote.deploy("alpha")
    node_yaml = reconcile.state / "node.yaml"
    reconcile.state.mkdir(parents=True, exist_ok=True)
    section = f"git: {{url: {hung.url}, path: manifests, interval: 1h, timeout: 5m, branch: %s}}\n"
    node_yaml.write_text(section % "main")
    log = reconcile.tmp / "daemon.log"
    mine = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    node = (*mine, "--devices", reconcile.devices)  # no -f: node.yaml's git source
    with open(log, "wb") as err:
        argv = reconcile.argv("-v", "--resync", "1h", *node, common=False)
        d = GitDaemon(reconcile.spawn(argv, stderr=err), log, reconcile)
    d.wait(lambda: (reconcile.record("alpha") or {}).get("phase") == "Ready", "alpha Ready")
    old = reconcile.record("alpha")["ref"]["pid"]
    remote.deploy("beta")
    run_git(remote.work, "push", "-q", "origin", "HEAD:refs/heads/next")
    newer = run_git(remote.work, "rev-parse", "HEAD")
    hung.hang(True)
    node_yaml.write_text(section % "next")
    d.proc.send_signal(signal.SIGHUP)
    with _stopped_at_the_end(d.wait(lambda: _hung_fetch(d.proc.pid), "a hung git fetch")) as git:
        os.kill(old, signal.SIGKILL)

        def restarted() -> bool:
            rec = reconcile.record("alpha") or {}
            return rec.get("phase") == "Ready" and rec["ref"]["pid"] != old

        d.wait(restarted, "alpha restarted while the new branch's fetch hangs")
        seen = source(reconcile)
        assert seen["branch"] == "next" and seen["applied"] == good, seen
        assert reconcile.record("alpha")["revision"] == good and reconcile.record("beta") is None
        assert git.is_running(), "the fetch ended: this proves nothing"
        hung.hang(False)
        os.killpg(git.pid, signal.SIGKILL)  # the remote drops the connection: a retry

    def beta_ready() -> bool:
        return (reconcile.record("beta") or {}).get("phase") == "Ready"

    d.wait(beta_ready, "beta Ready", timeout=60)  # after the retry's back-off (5 s)
    assert source(reconcile)["applied"] == newer
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=30) == 0, d.tail()
    reconcile("down", *node, common=False, check=0)


def test_a_rollback_while_a_fetch_hangs_stops_the_fetch_and_applies_at_once(
    reconcile: Any, remote: Remote, hung: HungRemote, git_daemon: Any
) -> None:
    """`reconcile rollback` during a daemon's fetch from a remote that hangs waited for
    the fetch's limit (here 5 minutes) before it even wrote the pin, and the daemon's
    move waited for the fetch too. The daemon's pass now stops its own fetch for the
    move (no failure: no PullFailed, the next fetch follows), and the rollback is done."""
    good = remote.deploy("alpha")
    d = git_daemon("--git", hung.url, *GIT, "--interval", "1s", "--git-timeout", "5m")
    d.wait(lambda: (reconcile.record("alpha") or {}).get("phase") == "Ready", "alpha Ready")
    newer = remote.deploy("beta")
    d.wait(lambda: (reconcile.record("beta") or {}).get("phase") == "Ready", "beta Ready")
    assert source(reconcile)["applied"] == newer
    hung.hang(True)
    with _stopped_at_the_end(d.wait(lambda: _hung_fetch(d.proc.pid), "a hung git fetch")) as git:
        mine = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
        out = reconcile("rollback", good, *mine, common=False, check=0, timeout=90)
        assert f"rolled back to {good[:12]}" in out.out, out
        assert _gone(git), f"the fetch (git pid {git.pid}) still runs"
    seen = source(reconcile)
    assert seen["state"] == "Pinned" and seen["applied"] == seen["pinned"] == good, seen
    d.wait(lambda: reconcile.record("beta") is None, "beta stopped by the move's pass")
    said = "fetch stopped: a rollback's move goes first"
    assert any(x.get("change") == said for x in d.lines()), d.tail()
    assert d.stop() == 0, d.tail()
    hung.hang(False)
    reconcile("--git", hung.url, *GIT, "down", check=0)


def test_an_auto_rollback_while_a_fetch_hangs_is_applied_at_once(
    reconcile: Any, remote: Remote, hung: HungRemote, git_daemon: Any
) -> None:
    """autoRollback pins the last good commit in a pass; its move waited for the fetch in
    flight (a remote that hangs: its whole limit) while the bad commit crash-looped on."""
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(
        "git: {autoRollback: {progressDeadline: 3s}, timeout: 5m}\n"
    )
    good = remote.deploy("alpha")
    reconcile.converge("--git", hung.url, *GIT)
    remote.deploy("alpha", command=[sys.executable, "-c", "raise SystemExit(3)"])
    reconcile.once("--git", hung.url, *GIT, check=None)  # applied: it crash-loops
    hung.hang(True)
    d = git_daemon("--git", hung.url, *GIT, "--interval", "1h", "--resync", "1s")
    with _stopped_at_the_end(d.wait(lambda: _hung_fetch(d.proc.pid), "a hung git fetch")):
        d.wait(lambda: source(reconcile)["applied"] == good, "the auto-rollback's move")
        seen = source(reconcile)
        assert seen["state"] == "Pinned" and "auto-rollback" in seen["message"], seen
        d.wait(lambda: (reconcile.record("alpha") or {}).get("phase") == "Ready", "alpha Ready")
        assert reconcile.record("alpha")["revision"] == good
    assert d.stop() == 0, d.tail()
    hung.hang(False)
    reconcile("--git", hung.url, *GIT, "down", check=0)


def test_a_rollback_with_no_daemon_fetches_nothing_from_a_remote_that_hangs(
    reconcile: Any, remote: Remote, hung: HungRemote
) -> None:
    """With no daemon, `reconcile rollback`'s own pass fetched before its move: from a
    remote that hangs it waited the fetch's limit (here 5 minutes). The commit it goes
    back to is in the checkout: its pass moves there and fetches nothing."""
    good = remote.deploy("alpha")
    reconcile.converge("--git", hung.url, *GIT, "--git-timeout", "5m")
    newer = remote.deploy("beta")
    reconcile.converge("--git", hung.url, *GIT)
    assert source(reconcile)["applied"] == newer
    hung.hang(True)
    mine = ("--state-dir", str(reconcile.state), "--node", reconcile.node)
    out = reconcile("rollback", good, *mine, "--devices", reconcile.devices, common=False,
                    check=0, timeout=60)  # fmt: skip
    assert f"rolled back to {good[:12]}" in out.out, out
    seen = source(reconcile)
    assert seen["applied"] == seen["pinned"] == good and seen["state"] == "Pinned", seen
    assert reconcile.record("beta") is None and reconcile.record("alpha") is not None
    hung.hang(False)
    reconcile("--git", hung.url, *GIT, "down", check=0)
