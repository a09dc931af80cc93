"""Health end to end: a real daemon, real engines, real signals.

A hung engine (SIGSTOP: the process alive, every request stuck) is restarted by its
liveness probe; a second hang backs off and restarts once; `--once` counts failures
across passes; two memory-packed engines on one device start one after the other.
The daemons run with ``--resync 1h``: what happens is the work of the probe timers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from test_daemon_loop import ready_pid, spawns

PERIOD, TIMEOUT, THRESHOLD, GRACE = 0.5, 0.5, 3, 1.0
LIVENESS = {
    "httpGet": {"path": "/health"},
    "periodSeconds": PERIOD,
    "timeoutSeconds": TIMEOUT,
    "failureThreshold": THRESHOLD,
}


def _write_live(rc: Any, name: str) -> None:
    rc.write(name, livenessProbe=LIVENESS, stopGracePeriodSeconds=GRACE)


def _at(event: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(event["time"])


def _liveness_fails(rc: Any, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in rc.events(name)
        if e["action"] == "fail" and "liveness probe" in str(e.get("reason", ""))
    ]


def _resume(pid: int) -> None:
    """A stopped engine the test left behind gets SIGCONT, so any teardown reaches it."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def test_a_hung_engine_is_restarted_by_its_liveness_probe(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    _write_live(rc, "hangs")
    d = daemon()
    first = d.wait(lambda: ready_pid(rc, "hangs"), "hangs Ready")
    os.kill(first, signal.SIGSTOP)  # alive, listening, answering nothing
    stopped_at = datetime.now(UTC)
    try:
        second = d.wait(
            lambda: (ready_pid(rc, "hangs") or first) != first and ready_pid(rc, "hangs"),
            "a new engine after the liveness restart",
        )
    finally:
        _resume(first)
    assert not rc.alive(first), "the hung engine was killed (SIGTERM, grace, SIGKILL)"
    events = rc.events("hangs")
    counted = [e["reason"] for e in events if e["action"] == "liveness"]
    assert counted[:2] == [
        f"liveness probe failed (1 of 3 in a row): GET /health: no answer within {TIMEOUT:g}s",
        f"liveness probe failed (2 of 3 in a row): GET /health: no answer within {TIMEOUT:g}s",
    ], counted
    (fail,) = _liveness_fails(rc, "hangs")
    assert fail["reason"].startswith("liveness probe GET /health failed 3 times in a row"), fail
    assert fail["outcome"] == "BackOff", fail
    rec = rc.record("hangs")
    assert rec["restarts"] == 1 and rec["liveness_failures"] == 0, rec
    assert rec["ref"]["pid"] == second
    # The event and describe name the probe and the last failure.
    described = rc("describe", "hangs", check=0).out
    assert "liveness probe GET /health failed 3 times in a row" in described, described
    assert "GET /health every 0.5s, timeout 0.5s, restart after 3 failures in a row" in described
    took = (_at(spawns(rc, "hangs")[-1]) - stopped_at).total_seconds()
    print(  # the figure, not asserted (speed belongs in benchmarks)
        f"liveness restart: SIGSTOP -> new engine spawned {took:.2f}s "
        f"(failureThreshold x periodSeconds + grace = {THRESHOLD * PERIOD + GRACE:g}s)"
    )
    finish(d)


def test_a_second_hang_backs_off_and_restarts_once(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    """The second liveness restart waits out the 10 s back-off; the probe of the old
    engine answering (failing) meanwhile restarts nothing more."""
    rc = reconcile
    # A hung (stopped) engine ignores SIGTERM: each of the two hangs waits out the whole
    # grace before the SIGKILL. The grace is not what this test is about: a short one.
    rc.write("again", livenessProbe=LIVENESS, stopGracePeriodSeconds=0.2)
    d = daemon()
    stopped: list[int] = []
    try:
        for round_ in (1, 2):
            pid = d.wait(
                lambda: (ready_pid(rc, "again") not in (None, *stopped)) and ready_pid(rc, "again"),
                f"engine {round_} Ready",
            )
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
            d.wait(
                lambda r=round_: len(_liveness_fails(rc, "again")) == r, f"liveness fail {round_}"
            )
        backing = d.wait(
            lambda: (rc.record("again") or {}).get("phase") == "BackOff" and rc.record("again"),
            "BackOff after the second hang",
        )
        assert "restart in 10s" in backing["message"], backing
        d.wait(lambda: ready_pid(rc, "again") not in (None, *stopped), "the third engine Ready")
    finally:
        for pid in stopped:
            _resume(pid)
    restarts = [e for e in rc.events("again") if e["action"] == "restart"]
    fails = _liveness_fails(rc, "again")
    assert len(fails) == 2 and len(restarts) == 2, (fails, restarts)
    # one restart per liveness failure, the second only once its back-off was over
    assert _at(fails[0]) < _at(restarts[0]) < _at(fails[1]) < _at(restarts[1])
    assert rc.record("again")["restarts"] == 2
    finish(d)


def test_once_counts_liveness_failures_across_passes(reconcile: Any) -> None:
    """cron's --once probes each Ready engine once per pass; the record keeps the count."""
    rc = reconcile
    rc.write(
        "cron",
        livenessProbe={**LIVENESS, "failureThreshold": 2},
        stopGracePeriodSeconds=GRACE,
    )
    rc.converge()
    pid = ready_pid(rc, "cron")
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        rc.once()
        rec = rc.record("cron")
        assert (rec["phase"], rec["liveness_failures"]) == ("Ready", 1), rec
        assert rec["ref"]["pid"] == pid
        rc.converge()  # the second failure in a row: restarted, then Ready again
    finally:
        _resume(pid)
    rec = rc.record("cron")
    assert rec["phase"] == "Ready" and rec["restarts"] == 1 and rec["ref"]["pid"] != pid, rec
    assert not rc.alive(pid)
    rc.down()


def test_packed_engines_on_one_device_start_one_after_the_other(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    rc.devices = "nvidia:0=80Gi"
    packed = {"count": 1, "kind": "nvidia", "memory": "20Gi"}
    slow = rc.demo_command(load_seconds="1")  # /health 503 for a second: Starting a while
    for name in ("llm-a", "llm-b"):
        rc.write(name, command=slow, devices=packed)
    d = daemon()
    d.wait(lambda: ready_pid(rc, "llm-a") and ready_pid(rc, "llm-b"), "both Ready")
    a_ready = next(e for e in rc.events("llm-a") if e["action"] == "ready")
    (b_spawn,) = spawns(rc, "llm-b")
    assert _at(b_spawn) >= _at(a_ready), (
        a_ready,
        b_spawn,
    )  # the second's exec after the first's Ready
    waited = [e for e in rc.events("llm-b") if e["action"] == "pending"]
    assert waited and waited[0]["reason"] == (
        "waiting for llm-a to be Ready on nvidia:0 (one start at a time per device)"
    ), rc.events("llm-b")
    assert rc.record("llm-a")["devices"] == rc.record("llm-b")["devices"] == ["nvidia:0"]
    finish(d)


def test_once_exits_0_while_a_packed_engine_waits_its_turn(reconcile: Any) -> None:
    """cron's --once: the second packed engine waiting for the first is no failure."""
    rc = reconcile
    rc.devices = "nvidia:0=80Gi"
    packed = {"count": 1, "kind": "nvidia", "memory": "20Gi"}
    for name in ("llm-a", "llm-b"):
        rc.write(name, command=rc.demo_command(load_seconds="1.5"), devices=packed)
    rc.once()  # exit 0
    b = rc.status("llm-b")["llm-b"]
    assert b["phase"] == "Pending" and b["message"].startswith("waiting for llm-a"), b
    rc.converge()
    assert {n: i["phase"] for n, i in rc.status().items()} == {"llm-a": "Ready", "llm-b": "Ready"}
    rc.down()


def test_a_hung_probe_never_holds_up_a_pass(reconcile: Any, daemon: Any, finish: Any) -> None:
    """A liveness probe stuck for its whole minute-long timeout on a stopped engine: a
    manifest dropped meanwhile is started and probed Ready by passes that go on."""
    rc = reconcile
    rc.write(
        "stuck",
        livenessProbe={**LIVENESS, "timeoutSeconds": 60},
        stopGracePeriodSeconds=GRACE,
    )
    d = daemon()
    pid = d.wait(lambda: ready_pid(rc, "stuck"), "stuck Ready")
    os.kill(pid, signal.SIGSTOP)
    try:
        rc.write("fresh", command=rc.demo_command(load_seconds="0.3"))
        d.wait(lambda: ready_pid(rc, "fresh"), "fresh Ready while a probe hangs")
        assert not [e for e in rc.events("stuck") if e["action"] == "liveness"], (
            "no answer from the stopped engine yet: its probe is still waiting"
        )
        assert rc.record("stuck")["ref"]["pid"] == pid
    finally:
        _resume(pid)
    finish(d)


def test_a_probe_in_flight_never_holds_up_the_daemons_exit(reconcile: Any, daemon: Any) -> None:
    """SIGTERM while a liveness probe waits on a stopped engine (its timeout: two minutes):
    the daemon exits now. The probes ran on a thread pool's workers, which an interpreter
    joins as it exits: the daemon's exit waited for the probe's timeout (up to an hour)."""
    rc = reconcile
    rc.write("stuck", livenessProbe={**LIVENESS, "timeoutSeconds": 120})
    d = daemon()
    pid = d.wait(lambda: ready_pid(rc, "stuck"), "stuck Ready")
    port = int(rc.record("stuck")["port"])
    os.kill(pid, signal.SIGSTOP)
    try:  # a probe's connection waits in the stopped engine's accept queue
        d.wait(lambda: _unaccepted(port), "a probe waiting on the stopped engine")
        d.proc.send_signal(signal.SIGTERM)
        assert d.ended("SIGTERM, a probe in flight") == 0, d.tail()
    finally:
        _resume(pid)
    rc.down()


def _unaccepted(port: int) -> int:
    """Connections waiting in the accept queue of the socket listening on ``port`` (a
    listening socket's rx_queue in /proc/net/tcp)."""
    waiting = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    waiting += int(fields[4].split(":")[1], 16)
    return waiting


# An engine whose GET /health answers 500 once the test writes ``<flag>.<its pid>``: a
# failure at once, where a stopped engine's is the probe's whole timeout (5 s by default).
SICKENS = """
import http.server, os, sys
flag = f"{sys.argv[2]}.{os.getpid()}"
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(500 if os.path.exists(flag) else 200)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


def test_a_command_engine_lives_by_its_readiness_get_by_default(reconcile: Any) -> None:
    """`engine: command` whose readiness is a GET and which sets no livenessProbe: that GET
    is its liveness probe (timeout 5 s, 3 failures), so one that fails it is restarted."""
    rc = reconcile
    flag = rc.tmp / "sick"
    command = [sys.executable, "-c", SICKENS, "{port}", str(flag)]
    rc.write("own", command=command, readiness={"httpGet": {"path": "/health"}})
    rc.converge()
    described = rc("describe", "own", check=0).out
    assert "GET /health every 10s, timeout 5s, restart after 3 failures in a row" in described
    pid = ready_pid(rc, "own")
    assert pid is not None
    Path(f"{flag}.{pid}").touch()  # this engine's GET /health answers 500 from now on
    for failures in (1, 2):
        rc.once()
        rec = rc.record("own")
        assert (rec["phase"], rec["liveness_failures"]) == ("Ready", failures), rec
    rc.converge()  # the third failure in a row: restarted, then Ready again
    rec = rc.record("own")
    assert rec["phase"] == "Ready" and rec["restarts"] == 1 and rec["ref"]["pid"] != pid, rec
    assert not rc.alive(pid)
    (fail,) = _liveness_fails(rc, "own")
    assert fail["reason"].startswith("liveness probe GET /health failed 3 times in a row"), fail
    rc.down()


def test_status_and_describe_say_liveness_is_failing_before_the_restart(reconcile: Any) -> None:
    """Kubernetes keeps a pod Ready while liveness fails under its threshold, and shows
    the failures; so does reconcile: the replica's MESSAGE (named on its deployment's
    row), describe's Liveness line, and the event (a trial reported Ready and no word)."""
    rc = reconcile
    flag = rc.tmp / "sick"
    command = [sys.executable, "-c", SICKENS, "{port}", str(flag)]
    rc.write("own", command=command, readiness={"httpGet": {"path": "/health"}}, replicas=2)
    rc.converge()
    pid = ready_pid(rc, "own@1")
    assert pid is not None
    Path(f"{flag}.{pid}").touch()  # this replica's GET /health answers 500 from now on
    rc.once()
    said = "liveness probe failed (1 of 3 in a row): GET /health -> 500"
    (row,) = rc("status", check=0).out.splitlines()[1:]
    assert " Ready " in row and row.endswith(f"own@1: {said}"), row
    described = rc("describe", "own@1", check=0).out
    assert f"restart after 3 failures in a row (1 so far: {said})" in described, described
    assert f"Message:      {said}" in described, described
    (probed,) = [e for e in rc.events("own") if e["action"] == "liveness"]
    assert probed["outcome"] == "1 failure in a row", probed  # was "1 failures"
    rc.down()
