"""A slow stop in the daemon: the engine goes Terminating and the loop goes on.

Kubernetes' kubelet sends SIGTERM, leaves the pod Terminating (holding what it holds)
and goes on with other pods; SIGKILL comes at the grace deadline. Every engine here
ignores SIGTERM (``STUBBORN``), so its stop lasts its whole grace period unless the test
ends it by hand; each daemon runs with ``--resync 1h``, so what happens is the work of
pidfds and timers.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from test_daemon_loop import PYTHON, STUBBORN, pid_of, ready_pid, sleeper, started, stubborn_pid

from controller.backends.choose import open_backend
from controller.daemon.loop import build_reconciler
from controller.store.config.node import resolve
from controller.store.instances.records import RecordStore

LONG_GRACE = 120  # seconds: never over while a test waits (each ends the engine itself)
# An engine whose child, in its group, ignores SIGTERM as it does: a stop reaches both.
STUBBORN_PAIR = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "os.fork()\n"
    "time.sleep(600)\n"
)


def stubborn(rc: Any, name: str, grace: float = LONG_GRACE, **spec: Any) -> None:
    rc.write(name, command=[PYTHON, "-c", STUBBORN], readiness={"periodSeconds": 0.2},
             stopGracePeriodSeconds=grace, **spec)  # fmt: skip


def phase(rc: Any, name: str) -> str | None:
    rec = rc.record(name)
    return None if rec is None else str(rec["phase"])


def terminating(rc: Any, name: str) -> int | None:
    """The pid of ``name``'s engine while its record is Terminating and it runs."""
    pid = pid_of(rc, name)
    return pid if phase(rc, name) == "Terminating" and pid and rc.alive(pid) else None


def group(pgid: int) -> set[int]:
    """The live (not zombie) processes of process group ``pgid``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if stat[0] != "Z" and int(stat[2]) == pgid:
            found.add(int(entry))
    return found


def journalled(rc: Any, name: str, action: str) -> list[str]:
    """The outcomes of ``name``'s ``action`` events. A teardown's record changes before
    its event is appended (crash-safe: the journal never says what did not happen), so
    a test that saw the record change waits for the event too, before reading it."""
    return [e["outcome"] for e in rc.events(name) if e["action"] == action]


def end_by_hand(rc: Any, d: Any, name: str, pid: int) -> None:
    """SIGKILL the stubborn engine's group (its exit): the daemon drops its record, then
    journals the stop."""
    os.killpg(pid, signal.SIGKILL)
    d.wait(lambda: rc.record(name) is None and not group(pid) and journalled(rc, name, "stop"),
           f"{name}'s stop finished and journalled")  # fmt: skip


def test_a_slow_stop_does_not_hold_up_a_crash_restart(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    stubborn(rc, "stubborn")
    d = started(rc, daemon, "steady")
    d.wait(lambda: stubborn_pid(rc, "stubborn"), "stubborn Ready, SIGTERM ignored")
    steady = ready_pid(rc, "steady")
    assert steady is not None
    (rc.manifests / "stubborn.yaml").unlink()
    old = d.wait(lambda: terminating(rc, "stubborn"), "stubborn Terminating")
    os.kill(steady, signal.SIGKILL)  # a crash while the stop's grace runs
    again = d.wait(lambda: (p := ready_pid(rc, "steady")) != steady and p, "steady restarted")
    # Restarted while the stop was in its grace: before, the pass waited it out first.
    assert terminating(rc, "stubborn") == old, rc.events("stubborn")
    assert group(old) == {old}
    end_by_hand(rc, d, "stubborn", old)
    assert ready_pid(rc, "steady") == again
    finish(d)


def test_a_terminating_engines_gpu_goes_to_no_one_until_its_group_is_gone(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    rc.devices = "nvidia:0"
    stubborn(rc, "old", devices={"count": 1})
    d = daemon("--allow-empty")  # its one manifest goes: prune it
    old = d.wait(lambda: stubborn_pid(rc, "old"), "old Ready, SIGTERM ignored")
    (rc.manifests / "old.yaml").unlink()
    d.wait(lambda: terminating(rc, "old"), "old Terminating")
    rc.write("new", devices={"count": 1}, **sleeper())
    d.wait(lambda: phase(rc, "new") == "Pending", "new waits for the device")
    assert rc.status("old")["old"]["devices"] == ["nvidia:0"]
    assert rc.status("new")["new"]["devices"] == []
    # it waits for old's teardown and says so (not "no capacity: remove a manifest": it is)
    said = rc.status("new")["new"]["message"]
    assert said.startswith("waiting for old to stop, which makes room (old: manifest removed"), said
    end_by_hand(rc, d, "old", old)
    d.wait(lambda: ready_pid(rc, "new"), "new Ready once old's group is gone")
    assert rc.status("new")["new"]["devices"] == ["nvidia:0"]
    finish(d)


def test_a_recreate_waits_for_the_old_group_before_its_new_engine(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    stubborn(rc, "web")
    d = daemon()
    old = d.wait(lambda: stubborn_pid(rc, "web"), "web Ready, SIGTERM ignored")
    port = rc.record("web")["port"]
    # A spec change: Recreate. The old engine keeps its record's grace (LONG_GRACE); the
    # new one's is short, so `down` at the end ends it at once.
    stubborn(rc, "web", grace=1, env={"CHANGED": "1"})
    d.wait(lambda: terminating(rc, "web"), "web Terminating")
    rc.write("other", **sleeper())  # the daemon goes on meanwhile
    d.wait(lambda: ready_pid(rc, "other"), "other Ready while web stops")
    assert terminating(rc, "web") == old and rc.record("web")["port"] == port
    os.killpg(old, signal.SIGKILL)
    d.wait(lambda: (p := ready_pid(rc, "web")) != old and p, "web's new engine")
    assert not group(old)
    assert rc.record("web")["stored_spec"]["env"] == {"CHANGED": "1"}
    finish(d)


def test_sigkill_at_the_grace_deadline_reaches_the_whole_group(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    rc.write("pair", command=[PYTHON, "-c", STUBBORN_PAIR], readiness={"periodSeconds": 0.2},
             stopGracePeriodSeconds=1)  # fmt: skip
    d = daemon("--allow-empty")  # its one manifest goes: prune it
    leader = d.wait(lambda: stubborn_pid(rc, "pair"), "pair Ready, SIGTERM ignored")
    d.wait(lambda: len(group(leader)) == 2, "the engine's child")
    (rc.manifests / "pair.yaml").unlink()
    # No resync for an hour and no exit to wake it: the grace's own timer kills the group.
    gone = lambda: rc.record("pair") is None and not group(leader)  # noqa: E731
    d.wait(lambda: gone() and journalled(rc, "pair", "stop"), "the group killed, journalled")
    outcomes = journalled(rc, "pair", "stop")
    assert outcomes[-1] == "stopped; record dropped", outcomes
    finish(d)


def test_a_daemon_killed_while_an_engine_terminates_leaves_the_next_to_finish_it(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    stubborn(rc, "slow")
    first = daemon("--allow-empty")
    old = first.wait(lambda: stubborn_pid(rc, "slow"), "slow Ready, SIGTERM ignored")
    (rc.manifests / "slow.yaml").unlink()
    first.wait(lambda: terminating(rc, "slow"), "slow Terminating")
    first.stop(signal.SIGKILL)
    second = daemon("--allow-empty")
    second.wait_pass()  # its first pass found the stop under way and went on
    assert terminating(rc, "slow") == old, rc.events("slow")
    end_by_hand(rc, second, "slow", old)  # the engine's exit: the next daemon finishes
    outcomes = journalled(rc, "slow", "stop")
    assert outcomes[-1] == "stopped; record dropped", outcomes
    finish(second)


# An engine that answers GET /health with 200 while ``<dir>/healthy`` exists (its liveness
# probe's target) and ignores SIGTERM while ``<dir>/stubborn`` exists (checked at the
# signal: the test lets it go), serving on the port its record was given.
FAILING = (
    "import http.server, os, signal, sys\n"
    "where, port = sys.argv[1], int(sys.argv[2])\n"
    "def term(signum, frame):\n"
    "    if not os.path.exists(os.path.join(where, 'stubborn')):\n"
    "        os._exit(0)\n"
    "signal.signal(signal.SIGTERM, term)\n"
    "class Health(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        ok = os.path.exists(os.path.join(where, 'healthy'))\n"
    "        self.send_response(200 if ok else 503)\n"
    "        self.end_headers()\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "http.server.HTTPServer(('127.0.0.1', port), Health).serve_forever()\n"
)


def catches_sigterm(pid: int) -> bool:
    """Whether ``pid``'s caught signals (``SigCgt`` in its status) hold SIGTERM."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)))


def test_a_liveness_kill_does_not_hold_up_a_crash_restart(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    flags = rc.tmp / "failing"
    flags.mkdir()
    (flags / "healthy").touch()
    (flags / "stubborn").touch()
    liveness = {"httpGet": {"path": "/health"}, "periodSeconds": 0.3, "timeoutSeconds": 1,
                "failureThreshold": 2}  # fmt: skip
    rc.write("hangs", command=[PYTHON, "-c", FAILING, str(flags), "{port}"],
             readiness={"httpGet": {"path": "/health"}, "periodSeconds": 0.2},
             livenessProbe=liveness, stopGracePeriodSeconds=LONG_GRACE)  # fmt: skip
    d = started(rc, daemon, "steady")
    old = d.wait(lambda: (p := ready_pid(rc, "hangs")) and catches_sigterm(p) and p,
                 "hangs Ready, its SIGTERM handler set")  # fmt: skip
    steady = ready_pid(rc, "steady")
    assert steady is not None
    (flags / "healthy").unlink()  # its liveness probe fails: the kill ignores SIGTERM
    d.wait(lambda: terminating(rc, "hangs") == old, "hangs Terminating (the liveness kill)")
    os.kill(steady, signal.SIGKILL)  # a crash while the kill's grace runs
    d.wait(lambda: (p := ready_pid(rc, "steady")) != steady and p, "steady restarted")
    rc.write("new", **sleeper())  # and a new manifest
    d.wait(lambda: ready_pid(rc, "new"), "new Ready")
    # Both while the kill was in its grace: before, the pass waited it out first.
    assert terminating(rc, "hangs") == old, rc.events("hangs")
    (flags / "healthy").touch()
    (flags / "stubborn").unlink()  # its next engine stops at SIGTERM (finish's down)
    os.killpg(old, signal.SIGKILL)  # the engine's exit: the daemon finishes the kill
    again = d.wait(lambda: (p := ready_pid(rc, "hangs")) != old and p, "hangs restarted")
    assert not group(old)
    fails = [e for e in rc.events("hangs") if e["action"] == "fail"]
    assert [e["outcome"] for e in fails] == ["BackOff"], fails
    assert fails[0]["reason"].startswith("liveness probe GET /health failed 2 times"), fails
    rec = rc.record("hangs")
    assert rec is not None and rec["restarts"] == 1 and rec["ref"]["pid"] == again, rec
    finish(d)


def test_a_park_does_not_hold_up_a_new_manifest(reconcile: Any, daemon: Any, finish: Any) -> None:
    rc = reconcile
    rc.devices = "nvidia:0"
    stubborn(rc, "parked", replicas=1, devices={"count": 1})
    d = daemon()
    old = d.wait(lambda: stubborn_pid(rc, "parked"), "parked Ready, SIGTERM ignored")
    stubborn(rc, "parked", replicas=0, devices={"count": 1})  # scaled to zero: Park
    d.wait(lambda: terminating(rc, "parked") == old, "parked Terminating")
    rc.write("new", **sleeper())
    d.wait(lambda: ready_pid(rc, "new"), "new Ready while parked stops")
    rc.write("gpu", devices={"count": 1}, **sleeper())
    d.wait(lambda: phase(rc, "gpu") == "Pending", "gpu waits for parked's device")
    # The Terminating record keeps its device until its group is gone (invariant 1).
    assert terminating(rc, "parked") == old, rc.events("parked")
    assert rc.status("parked")["parked"]["devices"] == ["nvidia:0"]
    assert rc.status("gpu")["gpu"]["devices"] == []
    os.killpg(old, signal.SIGKILL)
    d.wait(lambda: phase(rc, "parked") == "Idle", "parked Idle once its group is gone")
    assert not group(old)
    d.wait(lambda: ready_pid(rc, "gpu"), "gpu Ready on the freed device")
    assert rc.status("gpu")["gpu"]["devices"] == ["nvidia:0"]
    parks = [e["outcome"] for e in rc.events("parked") if e["action"] == "park"]
    assert parks == ["idle: holds nothing"], parks
    finish(d)


def test_a_preemption_waits_for_its_victims_group_and_holds_up_nothing(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    rc.devices = "nvidia:0"
    stubborn(rc, "low", devices={"count": 1}, priority=0)
    d = daemon()
    old = d.wait(lambda: stubborn_pid(rc, "low"), "low Ready, SIGTERM ignored")
    rc.write("high", devices={"count": 1}, priority=10, **sleeper())
    d.wait(lambda: terminating(rc, "low") == old, "low Terminating (preempted)")
    rc.write("other", **sleeper())
    d.wait(lambda: ready_pid(rc, "other"), "other Ready while low stops")
    # The preemptor is nominated, not started: the victim's device is its own until its
    # group is gone (invariant 1), and nobody else is preempted meanwhile.
    assert terminating(rc, "low") == old, rc.events("low")
    assert phase(rc, "high") == "Pending", rc.status("high")
    assert rc.status("low")["low"]["devices"] == ["nvidia:0"]
    assert rc.status("high")["high"]["devices"] == []
    os.killpg(old, signal.SIGKILL)
    d.wait(lambda: ready_pid(rc, "high"), "high Ready once low's group is gone")
    assert not group(old)
    assert rc.status("high")["high"]["devices"] == ["nvidia:0"]
    low = rc.status("low")["low"]
    assert low["phase"] == "Pending" and low["devices"] == [], low
    assert low["message"].startswith("preempted by high"), low
    preempts = [e["outcome"] for e in rc.events("low") if e["action"] == "preempt"]
    assert preempts == ["stopped; Pending until room returns"], preempts
    finish(d)


def test_a_promotion_renames_once_the_old_group_is_gone_and_holds_up_nothing(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    stubborn(rc, "web", strategy="RollingUpdate")
    d = daemon()
    old = d.wait(lambda: stubborn_pid(rc, "web"), "web Ready, SIGTERM ignored")
    # A new spec: web@next beside the old, promoted once Ready. The old engine keeps its
    # record's grace (LONG_GRACE); the new one's is short, for finish's `down`.
    stubborn(rc, "web", grace=1, strategy="RollingUpdate", env={"CHANGED": "1"})
    d.wait(lambda: terminating(rc, "web") == old, "the old web Terminating (promoted)")
    new = ready_pid(rc, "web@next")
    assert new is not None, rc.events("web")
    rc.write("other", **sleeper())
    d.wait(lambda: ready_pid(rc, "other"), "other Ready while the old web stops")
    assert terminating(rc, "web") == old and ready_pid(rc, "web@next") == new, rc.events("web")
    os.killpg(old, signal.SIGKILL)
    # The rename's event comes after `@next`'s record is deleted: waited for too.
    d.wait(lambda: ready_pid(rc, "web") == new and rc.record("web@next") is None
           and journalled(rc, "web", "promote"),
           "web@next renamed web once the old group is gone, and journalled")  # fmt: skip
    assert not group(old)
    assert rc.record("web")["stored_spec"]["env"] == {"CHANGED": "1"}
    assert [e["action"] for e in rc.events("web")][-1] == "promote", rc.events("web")
    finish(d)


def test_a_daemon_killed_while_a_park_waits_leaves_the_next_to_park_it(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    stubborn(rc, "parked", replicas=1)
    first = daemon()
    old = first.wait(lambda: stubborn_pid(rc, "parked"), "parked Ready, SIGTERM ignored")
    stubborn(rc, "parked", replicas=0)  # scaled to zero: Park
    first.wait(lambda: terminating(rc, "parked") == old, "parked Terminating")
    first.stop(signal.SIGKILL)
    second = daemon()
    second.wait_pass()  # its first pass found the teardown under way and went on
    assert terminating(rc, "parked") == old, rc.events("parked")
    os.killpg(old, signal.SIGKILL)  # the engine's exit: the next daemon finishes it
    second.wait(lambda: phase(rc, "parked") == "Idle", "parked Idle (parked again)")
    assert not group(old)
    assert rc.record("parked")["devices"] == [], rc.record("parked")
    finish(second)


def test_a_stop_the_daemon_began_and_a_once_finished_is_forgotten(reconcile: Any) -> None:
    """A deferred stop the daemon's launcher began and a cron `--once` beside it finished
    (the engine ended, the record dropped) was kept in the launcher's stops for the
    daemon's whole life: no pass of its would finish it again. The daemon's reconciler
    (built as it builds it, stops deferred) runs its passes here; the `--once` is the
    real CLI."""
    rc = reconcile
    rc.write("keeper", **sleeper())
    stubborn(rc, "web")
    cfg = resolve(
        manifests=[str(rc.manifests)], state_dir=str(rc.state), node=rc.node, devices=rc.devices
    )
    store = RecordStore(cfg.state_dir)
    reconciler = build_reconciler(cfg, open_backend(cfg, store), store)
    launcher = reconciler.executor.launcher
    launcher.defer_stops = True  # as the daemon's
    stopping = launcher._stopping  # what the daemon keeps of the stops it began
    try:
        assert rc.converge().code == 0
        # Ready as soon as it runs: its SIGTERM is ignored a moment later (stubborn_pid)
        pid: int = rc.wait_for(lambda: stubborn_pid(rc, "web"), 30, "web ignoring SIGTERM")
        (rc.manifests / "web.yaml").unlink()
        began = reconciler.run_pass()
        assert began.records["web"].phase.value == "Terminating", began.records["web"]
        assert set(stopping) == {"web"}
        os.killpg(pid, signal.SIGKILL)  # its end, seen by the cron pass first
        rc.wait_for(lambda: not group(pid), 30, "web's group gone")
        rc.once()
        assert rc.record("web") is None, rc.events("web")
        after = reconciler.run_pass()
        assert "web" not in after.records and "keeper" in after.records, after.records
        assert stopping == {}, stopping
    finally:
        rc.down()
