"""status, logs and describe of a replicated deployment, through the real CLI (issue 21).

``web`` runs 3 replicas of the demo engine (one GPU each, nvidia:0-2) beside ``solo``, a
deployment of one replica whose output must read exactly as before replicas existed.
Forged records (written by the store, read by the CLI) cover what a pass takes long to
reach: a replica with no room, a deployment scaled to 0, a rolling ``@next``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import pytest
import yaml
from procs import wait_for
from strategies import entry, record

from controller.core.state import Phase

NEW_KEYS = {"replicas", "ready_replicas", "instances", "observed_at", "conditions"}
NEW_KEYS |= {"restarts_total", "worst_phase", "node_conditions"}
INSTANCE_KEYS = {"replica", "phase", "pid", "port", "host", "node", "devices", "restarts"}
INSTANCE_KEYS |= {"message"}
NAMES = ["web", "web@1", "web@2"]


def _replicate(rc: Any) -> Any:
    rc.devices = "nvidia:0,nvidia:1,nvidia:2"
    rc.write("web", replicas=3, devices={"count": 1, "kind": "nvidia"})
    rc.write("solo", basePort=rc.port + 10)
    rc.converge()
    return rc


@pytest.fixture
def replicated(reconcile: Any) -> Any:
    """web and solo for a test that stops or changes them."""
    yield _replicate(reconcile)
    reconcile.down()


@pytest.fixture(scope="module")
def up_once(module_reconcile: Any) -> Any:
    """web and solo, brought up once for the tests that only read status, logs and
    describe (each bring-up is four engines and a pass)."""
    yield _replicate(module_reconcile)
    module_reconcile.down()


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()[1:]]


def test_status_shows_one_row_per_deployment_ready_of_desired(up_once: Any) -> None:
    rc = up_once
    records = rc.status()  # the records, in-process: one per replica
    assert sorted(records) == ["solo", *NAMES]
    rows = {r[0]: r for r in _rows(rc("status", check=0).out)}
    assert sorted(rows) == ["solo", "web"]  # replicas are no deployments of their own
    ports = ",".join(str(records[n]["port"]) for n in NAMES)
    assert rows["web"][1:8] == ["command", rc.node, "0,1,2", ports, "Ready", "3/3", "0"]
    assert rows["solo"][5:7] == ["Ready", "1/1"]

    wide = _rows(rc("status", "-o", "wide", check=0).out)
    assert [r[0] for r in wide] == ["solo", "web", *NAMES]  # the deployment, then each replica
    for name, row in zip(NAMES, wide[2:], strict=True):
        assert row[5:7] == ["Ready", "1/1"] and str(records[name]["pid"]) in row
    assert rc("status", "-o", "name", check=0).out == "solo\nweb\n"


def test_status_json_is_one_item_per_deployment_with_its_instances(up_once: Any) -> None:
    rc = up_once
    records = rc.status()
    items = {i["name"]: i for i in rc("status", "-o", "json", check=0).json()}
    assert sorted(items) == ["solo", "web"]
    web = items["web"]
    assert web["replicas"] == 3 and web["ready_replicas"] == 3
    assert [i["replica"] for i in web["instances"]] == [0, 1, 2]
    for inst, name in zip(web["instances"], NAMES, strict=True):
        assert set(inst) >= INSTANCE_KEYS
        assert inst["name"] == name and inst["phase"] == "Ready"
        assert inst["pid"] == records[name]["pid"] and inst["port"] == records[name]["port"]
        assert inst["devices"] == records[name]["devices"]
    for key in ("pid", "port", "host", "devices"):  # the top level is replica 0's
        assert web[key] == records["web"][key]
    # One replica: every field exactly as the record's view always was, plus the new ones.
    solo = items["solo"]
    assert {k: v for k, v in solo.items() if k not in NEW_KEYS} == records["solo"]
    assert solo["replicas"] == 1 and solo["ready_replicas"] == 1
    assert [i["replica"] for i in solo["instances"]] == [0]
    assert rc("status", "web", "-o", "json", check=0).json() == [web]
    assert rc("status", "web@1", "-o", "json", check=0).json() == [web]  # its deployment


def test_logs_of_every_replica_prefixed_or_one_with_replica(up_once: Any) -> None:
    rc = up_once
    lines = rc("logs", "web", check=0).out.splitlines()
    for name in NAMES:
        mine = [line for line in lines if line.startswith(f"{name:<5} | ")]
        assert any(f"reconcile: start {name} instance" in line for line in mine), lines
    assert all(line[:8] in {"web   | ", "web@1 | ", "web@2 | "} for line in lines), lines
    one = rc("logs", "web", "--replica", "1", check=0).out
    assert "reconcile: start web@1 instance" in one and " | " not in one.splitlines()[0]
    assert rc("logs", "web", "--tail", "1", check=0).out.count("\n") == 3  # a line each
    solo = rc("logs", "solo", check=0).out  # one replica: as before, no prefix
    assert solo.startswith("--- ") and "solo | " not in solo
    assert rc("logs", "web", "--replica", "7", check=1).err.startswith(
        "reconcile: web has no replica 7: its replicas are 0 (web), 1 (web@1), 2 (web@2)"
    )
    assert rc("logs", "web", "--replica", "-1", check=64).code == 64


def test_logs_follow_reaches_every_replica(replicated: Any) -> None:
    rc = replicated
    follow, _ = rc.follow("web")
    for name in NAMES:
        port = rc.record(name)["port"]
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
    rc.down()  # every record goes: -f ends by itself
    out, _ = follow.communicate(timeout=30)
    assert follow.returncode == 0
    for name in NAMES:
        assert any(
            line.startswith(f"{name:<5} | ".encode()) and b"GET /v1/models" in line
            for line in out.splitlines()
        ), out


def _follow_web(rc: Any, first: bytes) -> tuple[subprocess.Popen[bytes], bytearray, Path]:
    """`logs web -f` started, its output read until ``first``: (it, what it printed, the
    file its stderr goes to)."""
    err = rc.tmp / "follow.err"
    with open(err, "wb") as errors:
        follow = rc.spawn(
            rc.argv("logs", "web", "-f"), stdout=subprocess.PIPE, stderr=errors, bufsize=0
        )
    assert follow.stdout is not None
    got = bytearray()
    assert _read_until(follow.stdout, got, first, 30), got
    return follow, got, err


def _read_until(out: IO[bytes], got: bytearray, wanted: bytes, seconds: float) -> bool:
    """Read ``out`` into ``got`` until ``wanted`` is in it or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while wanted not in got and time.monotonic() < deadline:
        ready, _, _ = select.select([out], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            chunk = out.read(65536)
            if not chunk:
                break
            got += chunk
    return wanted in got


@pytest.fixture
def one_of_two(reconcile: Any) -> Any:
    """web with one replica, room for a second; brought down whatever the test found."""
    reconcile.devices = "nvidia:0,nvidia:1"
    reconcile.write("web", replicas=1, devices={"count": 1, "kind": "nvidia"})
    reconcile.converge()
    yield reconcile
    reconcile.down()


def test_logs_follow_picks_up_a_replica_added_after_it_started(one_of_two: Any) -> None:
    """`logs -f web` listed web's replicas once, at its start: a scale-up's web@1 was
    never shown (stern shows it); now it is, from its start, and its end is said."""
    rc = one_of_two
    follow, got, err = _follow_web(rc, b"reconcile: start web instance")
    rc.write("web", replicas=2, devices={"count": 1, "kind": "nvidia"})
    rc.converge()
    port = rc.record("web@1")["port"]
    urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).read()
    assert _read_until(follow.stdout, got, b"web@1 | ", 30), got
    assert _read_until(follow.stdout, got, b"GET /v1/models", 30), got
    assert b"web@1 | --- " in got  # shown from its start, behind its name
    rc.write("web", replicas=1, devices={"count": 1, "kind": "nvidia"})
    rc.converge()
    ended = "reconcile: web@1 ended (its record is gone)"
    wait_for(lambda: ended in err.read_text(), 30, "the follow to say web@1 ended")
    assert follow.poll() is None  # web itself still runs: the follow goes on
    rc.down()
    follow.communicate(timeout=30)
    assert follow.returncode == 0


def test_describe_shows_a_section_per_replica(up_once: Any) -> None:
    rc = up_once
    text = rc("describe", "web", check=0).out
    names = [
        line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Name:")
    ]
    assert names == NAMES
    assert "Replicas:     3 desired, 3 ready" in text
    solo = rc("describe", "solo", check=0).out
    assert "Replicas:" not in solo  # one replica: as before


def test_events_of_a_replica_are_its_deployment_s(up_once: Any) -> None:
    """`status`, `describe` and `logs` take `web@1`; `events web@1` said "no deployment
    named 'web@1'". Events are kept per deployment: those are shown, and said so."""
    rc = up_once
    whole = rc("events", "web", "-o", "json", check=0)
    one = rc("events", "web@1", "-o", "json", check=0)
    assert one.out == whole.out and one.out.strip(), one
    assert "events are kept per deployment: web's" in one.err, one
    unknown = rc("events", "nope@1", check=1).err  # no such deployment: said as before
    assert "no deployment named 'nope@1'" in unknown, unknown


def test_logs_of_a_replica_it_does_not_have_names_those_it_has(up_once: Any) -> None:
    """It said "no log for 'web@5' (never started?)" of a deployment of three."""
    said = up_once("logs", "web", "--replica", "5", check=1).err
    assert "web has no replica 5: its replicas are 0 (web), 1 (web@1), 2 (web@2)" in said


def test_logs_of_a_replica_it_does_not_have_names_those_scaled_away_as_gone(
    replicated: Any,
) -> None:
    """Scaled from 3 to 1, ``--replica 5`` listed 1 and 2 as its replicas: their logs
    stay, their engines do not."""
    rc = replicated
    rc.write("web", replicas=1, devices={"count": 1, "kind": "nvidia"})
    rc.converge()
    assert rc.record("web@2") is None and rc.record("web@1") is None
    said = rc("logs", "web", "--replica", "5", check=1).err
    assert said.startswith(
        "reconcile: web has no replica 5: its replicas are 0 (web); "
        "gone, their logs kept: 1 (web@1), 2 (web@2)"
    ), said
    assert "reconcile: start web@2 instance" in rc("logs", "web", "--replica", "2", check=0).out


def test_down_name_and_drain_evict_reach_every_replica(replicated: Any) -> None:
    rc = replicated
    pids = {n: rc.record(n)["ref"]["pid"] for n in NAMES}
    stopped = rc("down", "web", check=0).out.splitlines()
    assert sorted(stopped) == [f"stopped {n}" for n in NAMES]
    for name in NAMES:
        rc.wait_gone(pids[name])
        assert rc.record(name) is None
    assert rc.status()["solo"]["phase"] == "Ready"  # another deployment: untouched
    missing = rc("down", "web", "nope", check=1).err
    assert "no deployment named 'nope'" in missing and "'web'" in missing  # gone already
    slip = rc("down", "sloo", check=1).err  # one slip from a name the set owns here
    assert "no deployment named 'sloo' in this set here; did you mean 'solo'?" in slip, slip
    assert "nothing to stop" not in slip and rc.status()["solo"]["phase"] == "Ready", slip

    rc.converge()  # its manifest still declares it: the next pass starts it again
    said = rc("drain", "--evict", "--reason", "test", check=0).out.splitlines()
    evicted = sorted(line for line in said if line.startswith("evicted "))
    assert evicted == sorted(f"evicted {n}" for n in ["solo", *NAMES])
    rc("uncordon", check=0)


# -- forged records: what a pass takes long to reach ---------------------------------------


def _forge(rc: Any, *records: Any) -> None:
    store = rc.store()
    for rec in records:
        store.write(rec)


def test_a_replica_with_no_room_counts_as_desired_not_ready(reconcile: Any) -> None:
    rc = reconcile
    spec = entry("web", replicas=3)
    no_room = "no free device (nvidia: 2 of 2 held)"
    _forge(
        rc,
        record("web", spec=spec, devices=("nvidia:0",)),
        record("web@1", spec=spec, devices=("nvidia:1",), port=8001),
        record("web@2", spec=spec, phase=Phase.PENDING, port=None, message=no_room),
    )
    (row,) = _rows(rc("status", check=0).out)
    assert row[0] == "web" and row[3:7] == ["0,1", "8000,8001", "Ready,Pending", "2/3"]
    assert rc("status", check=0).out.rstrip().endswith(f"web@2: {no_room}")
    (item,) = rc("status", "-o", "json", check=0).json()
    assert (item["replicas"], item["ready_replicas"]) == (3, 2)
    assert item["instances"][2]["phase"] == "Pending" and item["instances"][2]["port"] is None


def test_scaled_to_zero_is_zero_of_zero(reconcile: Any) -> None:
    rc = reconcile
    idle = record("web", spec=entry("web", replicas=0), phase=Phase.IDLE, port=None)
    _forge(rc, idle)
    (row,) = _rows(rc("status", check=0).out)
    assert row[5:7] == ["Idle", "0/0"]
    (item,) = rc("status", "-o", "json", check=0).json()
    assert (item["replicas"], item["ready_replicas"]) == (0, 0)


def test_a_rolling_next_shows_under_its_replica(reconcile: Any) -> None:
    rc = reconcile
    spec = entry("web", replicas=2, strategy="RollingUpdate")
    _forge(
        rc,
        record("web", spec=spec, devices=("nvidia:0",)),
        record("web@1", spec=spec, devices=("nvidia:1",), port=8001),
        record("web@1@next", spec=spec, phase=Phase.STARTING, port=8002),
    )
    wide = _rows(rc("status", "-o", "wide", check=0).out)
    assert [r[0] for r in wide] == ["web", "web", "web@1", "web@1@next"]
    assert wide[0][6] == "2/2"  # the replica serves while its new instance starts
    (item,) = rc("status", "-o", "json", check=0).json()
    shown = [(i["replica"], i["name"], i["phase"]) for i in item["instances"]]
    assert shown == [(0, "web", "Ready"), (1, "web@1", "Ready"), (1, "web@1@next", "Starting")]


def test_describe_as_json_and_yaml(up_once: Any) -> None:
    rc = up_once
    (doc,) = rc("describe", "web", "-o", "json", check=0).json()
    assert doc["name"] == "web" and doc["replicas"] == 3 and doc["spec"]["replicas"] == 3
    for inst, name in zip(doc["instances"], NAMES, strict=True):
        assert inst["name"] == name
        assert any(e.get("action") == "start" for e in inst["events"]), inst["events"]
        assert any(f"reconcile: start {name} instance" in line for line in inst["log"])
    assert yaml.safe_load(rc("describe", "web", "-o", "yaml", check=0).out) == [doc]
    assert rc("describe", "nope", "-o", "json", check=1).err.startswith("reconcile: no deploy")
    assert rc("describe", "web", "-o", "xml", check=64).code == 64


def test_once_quiet_from_cron_says_nothing_of_what_is_fine(reconcile: Any) -> None:
    """The cron line is `--once -q`, and cron mails whatever it prints: every minute, a
    deployment Idle as asked (scaled to 0, OnDemand) printed `web: Idle: ...` on stderr
    with exit 0, a mail a minute about nothing. Quiet, it prints only what exits 1 (here
    a replica with no room); without -q every record's message is said as before."""
    rc = reconcile
    rc.write("zero", replicas=0)
    rc.write("lazy", activation="OnDemand", basePort=rc.port + 2)
    quiet = rc.once("-q", check=0)
    assert quiet.out == "" and quiet.err == "", quiet
    assert "zero: Idle: scaled to 0" in rc.once(check=0).err  # said when not quiet
    rc.write("wide", replicas=3, devices={"count": 1, "kind": "nvidia"}, basePort=rc.port + 4)
    failing = rc.once("-q", check=1)
    assert "wide@2: Pending: no capacity" in failing.err, failing
    assert "Idle" not in failing.err, failing
    rc.down()


def _web1_ready_after(rc: Any, pid: int | None) -> dict[str, Any] | None:
    """web@1's record once Ready with an engine other than ``pid``."""
    rec = rc.record("web@1")
    ref = (rec or {}).get("ref") or {}
    return rec if rec and rec["phase"] == "Ready" and ref.get("pid") != pid else None


def test_logs_follow_goes_on_with_a_replica_that_ends_and_comes_back(one_of_two: Any) -> None:
    """Under a daemon, a replica killed mid-follow and started again (its record kept) is
    followed on; one scaled away and back (its record gone, then a new one) was not
    followed again, said ended and never back (stern follows a pod's new container). It
    is followed again from where it stopped, and said to be back."""
    rc = one_of_two
    rc.write("web", replicas=2, devices={"count": 1, "kind": "nvidia"})
    rc.converge()
    follow, got, err = _follow_web(rc, b"web@1 | ")
    daemon = rc.daemon("--resync", "1h")
    try:
        later = _killed_then_scaled_away_and_back(rc, follow.stdout, got, err)
    finally:  # a daemon left running past a failure starts what the teardown stopped
        daemon.terminate()
        daemon.wait(timeout=30)
    assert b"web@1 | --- " in later  # from where it stopped: the new run's start
    assert later.count(b"reconcile: start web@1 instance") == 1, later  # nothing twice
    assert "reconcile: web@1 is back (a new instance): following it" in err.read_text()
    rc.down()
    follow.communicate(timeout=30)
    assert follow.returncode == 0


def _killed_then_scaled_away_and_back(rc: Any, out: IO[bytes], got: bytearray, err: Path) -> bytes:
    """web@1's engine killed (the daemon starts it again), then web@1 scaled away and
    back, each seen through the follow's ``out``: what it said after the comeback."""
    first = rc.record("web@1")
    assert first is not None
    os.kill(first["ref"]["pid"], signal.SIGKILL)
    killed = wait_for(lambda: _web1_ready_after(rc, first["ref"]["pid"]), 30, "web@1 again")
    urllib.request.urlopen(f"http://127.0.0.1:{killed['port']}/v1/models", timeout=5).read()
    assert _read_until(out, got, b'web@1 | 127.0.0.1 "GET /v1/models', 30), got
    rc.write("web", replicas=1, devices={"count": 1, "kind": "nvidia"})
    ended = "reconcile: web@1 ended (its record is gone)"
    wait_for(lambda: ended in err.read_text(), 30, "the follow to say web@1 ended")
    rc.write("web", replicas=2, devices={"count": 1, "kind": "nvidia"})
    back = wait_for(lambda: _web1_ready_after(rc, None), 30, "web@1 back")
    urllib.request.urlopen(f"http://127.0.0.1:{back['port']}/v1/models", timeout=5).read()
    later = bytearray()
    assert _read_until(out, later, b'web@1 | 127.0.0.1 "GET /v1/models', 30), (
        later,
        err.read_text(),
    )
    return bytes(later)
