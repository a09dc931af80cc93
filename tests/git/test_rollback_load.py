"""A rollback under load: the daemon with --listen follows a bare repository; commit A is
Ready, commit B (a changed spec, RollingUpdate) rolls out, then ``reconcile rollback`` to
A while a client sends requests through the gateway back to back. None of them fails, and
the history says who rolled back to what."""

from __future__ import annotations

from typing import Any

from tests.gateway.clients import Loop
from tests.git.conftest import Remote, source

GPU = {"count": 1, "kind": "nvidia"}


def commit(remote: Remote, rc: Any, version: str) -> str:
    """``roll`` at ``version`` (its argv, so its hash, changes): a rolling update to make."""
    command = rc.demo_command(load_seconds="0.5", chunks=version)
    return remote.deploy("roll", devices=GPU, strategy="RollingUpdate", command=command)


def ready_at(rc: Any, sha: str, old_pid: int | None) -> int:
    """Wait for ``roll`` Ready at ``sha`` on an engine other than ``old_pid``, no ``@next``."""

    def done() -> int | None:
        status = rc.status()
        item, rec = status.get("roll", {}), rc.record("roll") or {}
        settled = item.get("phase") == "Ready" and "roll@next" not in status
        fresh = item.get("pid") not in (None, old_pid) and rec.get("revision") == sha
        return item["pid"] if settled and fresh else None

    pid: int = rc.wait_for(done, timeout=60, what=f"roll Ready at {sha[:12]}")
    return pid


def test_a_rollback_under_load_fails_no_request(
    reconcile: Any, remote: Remote, gateway: Any
) -> None:
    a = commit(remote, reconcile, "3")
    g = gateway("--interval", "0.5s", "--git", remote.url, "--git-path", "manifests")
    a_pid = ready_at(reconcile, a, None)
    b = commit(remote, reconcile, "4")
    with Loop(g, "roll").running() as loop:
        loop.answered_by(reconcile, a_pid)
        b_pid = ready_at(reconcile, b, a_pid)
        loop.answered_by(reconcile, b_pid)
        out = reconcile("rollback", a, check=0)  # the daemon's pass applies the pin
        assert f"rolled back to {a[:12]}" in out.out, out
        back_pid = ready_at(reconcile, a, b_pid)
        loop.answered_by(reconcile, back_pid)
    assert not loop.errors, loop.errors[:5]
    bad = [answer for answer in loop.answers if answer[0] != 200]
    assert not bad, bad[:5]
    pids = [pid for _, pid in loop.answers]
    assert pids.index(f"pid-{back_pid}") > pids.index(f"pid-{b_pid}") > 0, sorted(set(pids))
    reconcile.wait_gone(b_pid)

    seen = source(reconcile)
    assert seen["state"] == "Pinned" and seen["applied"] == a, seen

    # B was Ready when left: it keeps its outcome (RolledBack is for a commit left unhealthy);
    # the rollback is a row of its own, whose outcome follows A's deployments to Ready.
    def history() -> list[tuple[str, str, str]]:
        rows = reconcile("history", "-o", "json", check=0).json()
        return [(h["revision"], h["by"], h["outcome"]) for h in rows]

    want = [(a, "poll", "Ready"), (b, "poll", "Ready"), (a, "rollback", "Ready")]
    reconcile.wait_for(lambda: history() == want, timeout=30, what=f"the history {want}")
    assert g.stop() == 0, g.text()[-3000:]
    reconcile("--git", remote.url, "--git-path", "manifests", "down", "--gateway", check=0)
