"""`reconcile restart NAME...` (kubectl's `rollout restart`) through the real CLI (issue 25).

Without a daemon the command runs the passes itself and returns once every replica is
a new, Ready instance; with one, it asks (``<state>/restart/<name>.json``) and watches
the daemon's passes do it. Rolling where the strategy is RollingUpdate, recreate
otherwise; an unknown name is exit 1 with a suggestion.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from procs import IGNORE_TERM

from controller.store.side import restart

RESTARTED = "restarted by `reconcile restart`"


def _pid(rc: Any, name: str) -> int:
    rec = rc.record(name)
    assert rec is not None and rec["ref"], rec
    return int(rec["ref"]["pid"])


def _ready_pid(rc: Any, name: str) -> int | None:
    rec = rc.record(name) or {}
    return rec["ref"]["pid"] if rec.get("phase") == "Ready" and rec.get("ref") else None


def test_restart_recreates_and_waits_until_ready(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web")
    rc.write("other", basePort=rc.port + 5)
    rc.converge()
    before, untouched = _pid(rc, "web"), _pid(rc, "other")
    asked = rc("restart", "web", "--no-wait", check=0)  # no daemon: asks, does nothing
    assert "restart of web requested" in asked.out and _pid(rc, "web") == before
    plan = rc("plan", check=2)  # desired state: plan shows what a pass will do
    assert "replace" in plan.out and RESTARTED in plan.out, plan
    done = rc("restart", "web", check=0)
    assert "restart of web requested (1 replica, recreate)" in done.out, done
    assert "restarted web (pid " in done.out, done
    assert rc.status()["web"]["phase"] == "Ready"
    assert _pid(rc, "web") != before and not rc.alive(before)
    assert _pid(rc, "other") == untouched  # another deployment: left alone
    assert any(RESTARTED in e.get("reason", "") for e in rc.events("web")), rc.events("web")
    assert set(restart.read_all(rc.state)) == {"web"}  # desired state, like an activation
    now = _pid(rc, "web")
    rc.once()  # the request is met: the next pass changes nothing
    assert _pid(rc, "web") == now
    rc.down()


def test_a_rolling_restart_replaces_each_replica_beside_the_old(reconcile: Any) -> None:
    rc = reconcile
    rc.devices = "nvidia:0,nvidia:1,nvidia:2"
    spec = {"strategy": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}
    rc.write("web", replicas=2, devices={"count": 1, "kind": "nvidia"}, **spec)
    rc.converge()
    before = {n: _pid(rc, n) for n in ("web", "web@1")}
    done = rc("restart", "web", check=0, timeout=120)
    assert "(2 replicas, rolling: RollingUpdate)" in done.out, done
    after = {n: _pid(rc, n) for n in ("web", "web@1")}
    assert all(after[n] != before[n] for n in after), (before, after)
    assert {r["phase"] for r in rc.status().values()} == {"Ready"}
    reasons = [e.get("reason", "") for e in rc.events("web")]
    assert any(f"rolling update ({RESTARTED})" in r for r in reasons), reasons
    assert any(e.get("action") == "promote" for e in rc.events("web")), rc.events("web")
    rc.down()


def test_a_rolling_restart_with_no_surge_room_replaces_one_replica_at_a_time(
    reconcile: Any,
) -> None:
    """Every device held (two replicas and another deployment on three): no surge fits,
    so the replicas are replaced in place, one at a time. The first one replaced lost the
    device it freed to the second one's surge and waited "no capacity": `restart` exited
    1, "cannot progress", while the rollout went on (a trial on one node)."""
    rc = reconcile
    rc.devices = "nvidia:0,nvidia:1,nvidia:2"
    gpu = {"count": 1, "kind": "nvidia"}
    rc.write("web", replicas=2, devices=gpu, strategy="RollingUpdate")
    rc.write("other", basePort=rc.port + 5, devices=gpu)
    rc.converge()
    before = {n: _pid(rc, n) for n in ("web", "web@1", "other")}
    done = rc("restart", "web", check=0, timeout=120)
    assert "restarted web (pid " in done.out, done
    after = {n: _pid(rc, n) for n in ("web", "web@1", "other")}
    assert after["web"] != before["web"] and after["web@1"] != before["web@1"], done
    assert after["other"] == before["other"]  # another deployment: never the room's price
    reasons = [e.get("reason", "") for e in rc.events("web")]
    assert any("no room for a surge" in r for r in reasons), reasons
    assert not any("no capacity" in r for r in reasons if "no room" not in r), reasons
    rc.down()


def test_an_unknown_name_says_which_is_meant(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web")
    rc.converge()
    wrong = rc("restart", "wbe", check=1)
    assert "no deployment named 'wbe'" in wrong.err and "did you mean 'web'?" in wrong.err
    assert restart.read_all(rc.state) == {}  # nothing asked
    assert "no deployment named '../etc'" in rc("restart", "../etc", check=1).err  # not a path
    rc.down()


@pytest.mark.parametrize("gateway", [True, False], ids=["datagram", "sigusr1"])
def test_the_daemon_does_the_restart_the_cli_asked_for(reconcile: Any, gateway: bool) -> None:
    """The daemon is woken at once: with a gateway as an OnDemand request wakes it (its
    datagram), without one by SIGUSR1. Its resync (an hour here) never comes."""
    rc = reconcile
    rc.write("web")
    listen = ["--listen", f"127.0.0.1:{rc.port + 15}"] if gateway else []
    daemon = rc.daemon("--resync", "1h", *listen)
    rc.wait_for(lambda: (rc.record("web") or {}).get("phase") == "Ready", timeout=60)
    before = _pid(rc, "web")
    done = rc("restart", "web", check=0, timeout=120)
    assert f"the daemon (pid {daemon.pid}) restarts it now" in done.err, done
    assert _pid(rc, "web") != before and rc.record("web")["phase"] == "Ready"
    second = _pid(rc, "web")
    asked = rc("restart", "web", "--no-wait", check=0)  # asks and returns
    assert "restart of web requested" in asked.out and "restarted" not in asked.out
    rc.wait_for(lambda: _ready_pid(rc, "web") not in (None, second), timeout=60)
    daemon.terminate()
    daemon.wait(timeout=30)
    rc.down("--gateway")


def test_a_replacement_waiting_for_another_teardown_is_no_failure(reconcile: Any) -> None:
    """The daemon stops every replaced engine, then starts the new ones: while a slow one
    spends its grace period, a quick one is Pending for its start. `restart` once called
    that "cannot progress" and exited 1, though the restart then succeeded."""
    rc = reconcile
    rc.write("quick")
    command = [sys.executable, "-c", IGNORE_TERM, "{port}"]
    rc.write("stubborn", basePort=rc.port + 5, command=command, stopGracePeriodSeconds=3)
    daemon = rc.daemon("--resync", "1h")
    ready = ("quick", "stubborn")
    rc.wait_for(lambda: all(_ready_pid(rc, n) for n in ready), timeout=60)
    before = {n: _pid(rc, n) for n in ready}
    done = rc("restart", *ready, check=0, timeout=120)
    assert "restarted quick (pid " in done.out and "restarted stubborn (pid " in done.out, done
    assert all(_pid(rc, n) != before[n] for n in ready), done
    daemon.terminate()
    daemon.wait(timeout=30)
    rc.down()


def test_a_cron_sets_restart_and_down_beside_a_daemon_of_another_set(reconcile: Any) -> None:
    """A daemon runs one set; a cron set shares the state dir. `restart` of the cron
    set's deployment once said "the daemon restarts it now" and waited 10 minutes for a
    daemon that never acts on another set's records; `down` said the daemon would start
    it again. Only the set's own passes do: `restart` runs them, `down` says nothing."""
    rc = reconcile
    rc.write("web")
    cron = rc.tmp / "cron"
    rc.write("job", folder=cron, basePort=rc.port + 5)
    daemon = rc.daemon("--resync", "1h")
    rc.wait_for(lambda: _ready_pid(rc, "web") is not None, timeout=60)
    rc("-f", str(cron), "--once", "--wait", "--timeout", "30s", check=0, timeout=60)
    before = _pid(rc, "job")
    done = rc("-f", str(cron), "restart", "job", "--timeout", "60s", check=0, timeout=120)
    assert "the daemon" not in done.err and "restarted job (pid " in done.out, done
    assert _pid(rc, "job") != before and rc.record("job")["phase"] == "Ready"
    stopped = rc("-f", str(cron), "down", check=0)
    assert "stopped job" in stopped.out and "daemon" not in stopped.err, stopped
    daemon.terminate()
    daemon.wait(timeout=30)
    rc.down()


def test_a_restart_that_cannot_progress_says_why(reconcile: Any) -> None:
    rc = reconcile
    rc.write("huge", devices={"count": 5, "kind": "nvidia"})
    rc.once(check=1)  # Pending: the node has 2
    stuck = rc("restart", "huge", check=1)
    assert "restart cannot progress: huge: cannot start huge (Pending)" in stuck.err, stuck
    rc.down()


def test_a_restart_that_times_out_says_where_it_stands_and_where_to_look(reconcile: Any) -> None:
    """`timed out waiting for the restart of web` said neither what the new instance was
    doing (Starting: its probe never passes) nor where to look (on a full disk the
    daemon's passes failed, and nothing else said so)."""
    rc = reconcile
    rc.write("web", readiness={"httpGet": {"path": "/nope"}, "periodSeconds": 0.5})
    rc.once(check=None)
    late = rc("restart", "web", "--timeout", "2s", check=1)
    assert "timed out waiting for the restart (web: " in late.err, late
    assert "`reconcile events NAME` say why" in late.err, late
    rc.down()


def test_the_request_file_names_only_deployments_and_a_torn_one_is_none(tmp_path: Path) -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    restart.request(tmp_path, "web", at)
    assert restart.read_all(tmp_path) == {"web": at}
    for bad in ("../web", "Web", "web@1", ""):
        with pytest.raises(ValueError):
            restart.request(tmp_path, bad, at)  # invariant 9: never a path
    with pytest.raises(ValueError):
        restart.request(tmp_path, "web", datetime(2026, 1, 2))  # naive: not comparable
    (tmp_path / "restart" / "torn.json").write_text('{"requested_at": "2026-01-')
    (tmp_path / "restart" / "naive.json").write_text('{"requested_at": "2026-01-02T03:04:05"}')
    (tmp_path / "restart" / "Not-DNS.json").write_text('{"requested_at": "2026-01-02T03:04:05Z"}')
    assert restart.read_all(tmp_path) == {"web": at}  # the others count as no request
    assert list((tmp_path / "restart").glob("*.tmp")) == []
