"""Facts that change nothing that runs are restated in place, through the real CLI (issue 25).

A spec's hash leaves out aliases, idleTimeout, activation, image, replicas and the like
(specs.NOT_HASHED): changing one on a running deployment must not restart it, yet the
record (which the gateway and the daemon read) must say it. The manifests' git commit is
such a fact too: a commit that changes no manifest moves every record's revision.
"""

from __future__ import annotations

from typing import Any

from test_ux_gitops import commit_all, git

from controller.gateway.routing.table import Table
from controller.store.instances.records import RecordStore


def _routed(rc: Any, name: str) -> int | None:
    """The port the gateway's routing table sends a request for ``name`` to."""
    table = Table()
    table.update(RecordStore(rc.state).load().records.values())
    target = table.target(name)
    return target.port if target else None


def test_new_aliases_and_idle_timeout_update_the_record_with_the_same_pid(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web", aliases=["old-name"])
    rc.converge()
    before = rc.record("web")
    assert _routed(rc, "old-name") == before["port"] and _routed(rc, "new-name") is None

    rc.write("web", aliases=["new-name"], idleTimeout="17m")
    plan = rc("plan", check=2)
    assert "in-place" in plan.out and "spec.aliases, spec.idleTimeout changed" in plan.out, plan
    rc.once()
    after = rc.record("web")
    assert after["ref"] == before["ref"] and after["phase"] == "Ready"  # no restart
    assert "new-name" in after["models"] and "old-name" not in after["models"]
    assert after["idle_timeout"] == 17 * 60 != before["idle_timeout"]
    assert _routed(rc, "new-name") == after["port"] and _routed(rc, "old-name") is None
    updates = [e for e in rc.events("web") if e["action"] == "update"]
    assert updates and updates[-1]["outcome"] == "updated in place (no restart)", updates
    rc("plan", check=0)  # and now in sync
    rc.down()


def test_a_commit_that_changes_no_manifest_moves_the_revision(reconcile: Any) -> None:
    rc = reconcile
    repo = rc.tmp / "repo"
    manifests = repo / "manifests"
    rc.write("web", folder=manifests)
    git(repo, "init", "-q", "-b", "main")
    first = commit_all(repo, "web")
    rc.converge("-f", str(manifests))
    pid = rc.record("web")["ref"]["pid"]
    assert rc.record("web")["revision"] == first

    git(repo, "commit", "-q", "--allow-empty", "-m", "docs only")  # HEAD moves, no manifest
    second = git(repo, "rev-parse", "HEAD")
    plan = rc("plan", "-f", str(manifests), check=0)  # bookkeeping, not a change
    assert "In sync" in plan.out, plan
    rc.once("-f", str(manifests))
    assert rc.record("web")["revision"] == second != first
    assert rc.record("web")["ref"]["pid"] == pid  # no restart
    table = rc("status", check=0).out.splitlines()
    assert "REVISION" in table[0] and second[:12] in table[1]  # shown once any has one
    rc.down("-f", str(manifests))
