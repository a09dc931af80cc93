"""Notifications of the git source on a real bare repository: Synced at each applied
commit, PullFailed when the remote is gone, Synced again, and a `reconcile rollback`
(queued by the command, posted by the daemon), and an autoRollback."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.git.conftest import Remote, run_git, source
from tests.git.test_rollback import node_only
from tests.hookreceiver import Receiver


@pytest.fixture
def hook(reconcile: Any) -> Iterator[Receiver]:
    receiver = Receiver(reconcile.port + 15).start()
    yield receiver
    receiver.stop()


def told(hook: Receiver, event: str) -> list[dict[str, Any]]:
    with hook.lock:
        return [t for t in hook.accepted if t["event"] == event]


def test_sync_states_and_a_rollback_are_posted(
    reconcile: Any, remote: Remote, git_daemon: Any, hook: Receiver
) -> None:
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(
        f"notify:\n  - url: http://127.0.0.1:{hook.port}/reconcile\n"
        "    events: [Synced, PullFailed, RolledBack]\n"
    )
    good = remote.deploy("alpha")
    d = git_daemon("--git", remote.url, "--git-path", "manifests", "--interval", "0.5s")
    synced = d.wait(lambda: told(hook, "Synced"), "Synced posted")
    assert synced[0]["revision"] == good and synced[0]["source"] == remote.url, synced
    assert synced[0]["node"] == reconcile.node and "Synced" in synced[0]["text"]
    assert synced[0]["text"].count(good[:12]) == 1, synced  # the commit said once

    gone = remote.bare.with_name("gone.git")
    shutil.move(remote.bare, gone)
    failed = d.wait(lambda: told(hook, "PullFailed"), "PullFailed posted")
    assert "does not appear to be a git repository" in failed[0]["message"], failed
    assert failed[0]["revision"] == good  # still running it
    shutil.move(gone, remote.bare)
    d.wait(lambda: len(told(hook, "Synced")) == 2, "Synced posted again")

    newer = remote.commit({"README": "newer\n"}, "newer")
    d.wait(lambda: [t["revision"] for t in told(hook, "Synced")][-1:] == [newer], "newer")
    node_only(reconcile, "rollback", good)
    rolled = d.wait(lambda: told(hook, "RolledBack"), "RolledBack posted by the daemon")
    assert rolled[0]["deployments"] == ["alpha"] and good[:12] in rolled[0]["message"], rolled
    assert rolled[0]["revision"] == good, rolled  # the commit it runs now (it said null)
    d.wait(lambda: source(reconcile)["applied"] == good, "the rollback applied")
    assert len(told(hook, "PullFailed")) == 1, hook.accepted  # one per change, not per fetch
    assert d.stop() == 0
    node_only(reconcile, "down")


def test_an_auto_rollback_is_posted(
    reconcile: Any, remote: Remote, git_daemon: Any, hook: Receiver
) -> None:
    reconcile.state.mkdir(parents=True, exist_ok=True)
    # The deadline outlasts the passes that start the bad engine and see it fail (at 3 s
    # a CI run at load ~20 rolled back while it was still Starting: no Degraded to post)
    (reconcile.state / "node.yaml").write_text(
        f"git:\n  url: {remote.url}\n  path: manifests\n  autoRollback: {{progressDeadline: 8s}}\n"
        f"notify:\n  - url: http://127.0.0.1:{hook.port}/reconcile\n"
        "    events: [RolledBack, Degraded, Pinned]\n"
    )
    good = remote.deploy("alpha")
    reconcile.converge("--git", remote.url)
    bad = remote.deploy("alpha", command=[sys.executable, "-c", "raise SystemExit(3)"])
    d = git_daemon("--git", remote.url, "--interval", "1h", "--resync", "1s")
    rolled = d.wait(lambda: told(hook, "RolledBack"), "the auto-rollback posted")
    assert rolled[0]["deployments"] == ["alpha"], rolled
    assert bad[:12] in rolled[0]["message"] and good[:12] in rolled[0]["message"], rolled
    assert "progressDeadline" in rolled[0]["message"]
    assert rolled[0]["revision"] == good, rolled  # the commit it runs now
    # before it, the commit's failing deployment was Degraded, named in the notification
    (degraded,) = told(hook, "Degraded")
    assert degraded["deployments"] == ["alpha"] and degraded["revision"] == bad, degraded
    assert "alpha Failed" in degraded["message"] or "alpha BackOff" in degraded["message"]
    # Pinned once, at the commit it runs: it was told twice, first naming the bad commit
    # (the pin is set after that pass's move), then again at the next pass's move
    d.wait(lambda: [t["revision"] for t in told(hook, "Pinned")][-1:] == [good], "Pinned")
    assert [t["revision"] for t in told(hook, "Pinned")] == [good], hook.accepted
    assert d.stop() == 0
    node_only(reconcile, "down")


def test_a_commit_whose_manifest_does_not_load_names_its_deployment(
    reconcile: Any, remote: Remote, hook: Receiver
) -> None:
    """Degraded by a manifest that does not load (its engine runs on, spec invalid) said
    `"deployments": []`, so a failed try of the hook was no event of any deployment."""
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(
        f"notify:\n  - url: http://127.0.0.1:{hook.port}/reconcile\n    events: [Degraded]\n"
    )
    remote.deploy("alpha")
    remote.deploy("beta")
    reconcile.converge("--git", remote.url, "--git-path", "manifests")
    text = (remote.work / "manifests" / "beta.yaml").read_text().replace("spec:", "spec: [", 1)
    bad = remote.commit({"manifests/beta.yaml": text}, "beta: a typo")
    reconcile("--once", "--git", remote.url, "--git-path", "manifests", check=1)
    (told_,) = told(hook, "Degraded")  # `--once` posts what its pass queued
    assert told_["revision"] == bad and "manifests/beta.yaml" in told_["message"], told_
    assert told_["deployments"] == ["beta"], told_
    node_only(reconcile, "down")


def test_a_rollback_to_a_commit_the_remote_will_not_give_claims_no_rollback(
    reconcile: Any, remote: Remote, git_daemon: Any, hook: Receiver
) -> None:
    """`rollback SHA` of a commit the checkout lacks pins it and leaves the fetch by its
    id to the move. When the remote would not give it, the command still printed
    `rolled back to SHA`, journaled a `rollback` event per deployment saying so, and
    queued a RolledBack notification whose `revision` was a commit the node never ran.
    Now they come once the node runs it: a refused one is said by the move alone (exit 1,
    PullFailed), a commit only another branch holds is fetched and said as before."""
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(
        f"notify:\n  - url: http://127.0.0.1:{hook.port}/reconcile\n"
        "    events: [RolledBack, PullFailed]\n"
    )
    remote.deploy("alpha")
    run_git(remote.work, "checkout", "-q", "-b", "feature")
    elsewhere = remote.commit({"README": "feature\n"}, "feature", push=False)
    run_git(remote.work, "push", "-q", "origin", "feature")  # main never had it
    run_git(remote.work, "checkout", "-q", "main")
    d = git_daemon("--git", remote.url, "--git-path", "manifests", "--interval", "1h")
    ready = lambda: (reconcile.record("alpha") or {}).get("phase") == "Ready"  # noqa: E731
    d.wait(ready, "alpha Ready")
    pid = reconcile.record("alpha")["ref"]["pid"]

    never = "2" * 40
    typo = node_only(reconcile, "rollback", never, check=1)
    assert "not applied:" in typo.err and "would not give it by its id" in typo.err, typo
    assert "rolled back to" not in typo.out + typo.err, typo
    failed = d.wait(lambda: told(hook, "PullFailed"), "the failed move posted")
    assert never[:12] in failed[0]["message"], failed
    assert not [e for e in reconcile.events("alpha") if e["action"] == "rollback"]
    assert reconcile.record("alpha")["ref"]["pid"] == pid  # the engine runs on

    out = node_only(reconcile, "rollback", elsewhere)  # fetched by its id by the move
    assert f"rolled back to {elsewhere[:12]}" in out.out, out
    rolled = d.wait(lambda: told(hook, "RolledBack"), "the rollback posted")
    assert [t["revision"] for t in rolled] == [elsewhere], hook.accepted
    (event,) = [e for e in reconcile.events("alpha") if e["action"] == "rollback"]
    assert elsewhere[:12] in event["reason"], event
    assert d.stop() == 0
    node_only(reconcile, "down")
