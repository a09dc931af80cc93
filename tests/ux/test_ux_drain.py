"""drain / uncordon and node capacity limits: durable, expiring, every denial names a fix."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from datetime import datetime
from typing import Any

import pytest
from procs import wait_gone


def test_a_drain_holds_starts_and_expires_by_itself(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web")
    # An hour: the commands that look at the drain in force cannot outlast it, however
    # loaded the box (a 15 s ttl had to cover them, 8 s was missed once at load 12 and
    # --once then started web); the ttl that runs out is a short renewal, below.
    out = rc("drain", "--ttl", "1h", "--reason", "maintenance", check=0).out
    assert f"node {rc.node} drained until" in out and "(maintenance)" in out
    first = json.loads((rc.state / "drain.json").read_text())
    assert "renewed" in rc("drain", "--ttl", "1h", "--reason", "maintenance", check=0).out
    drain = json.loads((rc.state / "drain.json").read_text())
    assert drain["reason"] == "maintenance" and "(pid " in drain["by"]
    assert datetime.fromisoformat(drain["until"]) > datetime.fromisoformat(first["until"])

    rc.once(check=1)  # Pending: --once says so
    message = rc.record("web")["message"]
    assert (
        message.startswith(f"node drained by {drain['by']} until ") and "(maintenance)" in message
    )
    assert message.endswith("run `reconcile uncordon` or wait")
    assert rc.pids() == set()
    status = rc("status", check=0)
    assert "is drained by" in status.err and "`reconcile uncordon` ends it" in status.err

    # Nobody uncordons: renewed for 2 s (the hour's drain replaced, not ended), it runs
    # out, and the next pass starts web (while the hour's drain held, --once could not).
    assert "renewed" in rc("drain", "--ttl", "2s", "--reason", "maintenance", check=0).out
    short = json.loads((rc.state / "drain.json").read_text())
    expires = datetime.fromisoformat(short["until"])
    assert expires < datetime.fromisoformat(drain["until"]), short  # the 2 s one is in force
    rc.wait_for(lambda: time.time() > expires.timestamp(), timeout=20, what="the TTL")
    rc.converge()
    assert rc.record("web")["phase"] == "Ready"
    assert "is drained" not in rc("status", check=0).err
    rc.down()


def test_evict_stops_engines_now_and_uncordon_lets_them_back(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web")
    rc.converge()
    pid = rc.record("web")["ref"]["pid"]
    out = rc("drain", "--evict", "--reason", "swap GPU", check=0).out
    assert "evicted web" in out
    rc.wait_gone(pid)
    # The lease is released at once; the record stays, Pending: dropped, the gateway
    # answered 404 for its model and `status` forgot it until the next pass (a trial).
    record = rc.record("web")
    assert record is not None and record["phase"] == "Pending", record
    assert record["devices"] == [] and record["port"] is None and record["ref"] is None
    assert record["message"] == "evicted: node drained", record
    assert "evicted: node drained" in rc("status", "web", check=0).out
    rc.once(check=1)
    assert "(swap GPU)" in rc.record("web")["message"] and rc.pids() == set()

    out = rc("uncordon", check=0).out
    assert f"node {rc.node} uncordoned" in out and "swap GPU" in out
    assert "was not drained" in rc("uncordon", check=0).out
    rc.converge()
    rc.down()


def test_a_crash_on_a_drained_node_says_the_drain_holds_its_restart(reconcile: Any) -> None:
    """An engine that crashed while the node was drained read `BackOff … restart now`
    (then `restart due: the next pass starts it`) in --once, status and describe, and no
    pass restarted it: the drain held it. Its message names the drain instead, once, and
    keeps its lease; uncordon restarts it."""
    rc = reconcile
    rc.write("web", devices={"count": 1, "kind": "nvidia"})
    rc.converge()
    (pid,) = rc.pids("web")
    rc("drain", "--ttl", "1h", "--reason", "swap GPU 1", check=0)
    os.kill(pid, signal.SIGKILL)
    wait_gone(pid)
    out = rc.once(check=None)  # one crash is not a crash loop: its exit is --once's own rule
    record = rc.record("web")
    assert record is not None and record["phase"] == "BackOff", record
    assert "restart held: node drained by " in record["message"], record
    assert "(swap GPU 1): run `reconcile uncordon` or wait" in record["message"], record
    assert "restart now" not in out.err and "restart held" in out.err, out
    assert record["devices"] == ["nvidia:0"]  # the lease waits for the restart
    for view in (rc("status", check=0).out, rc("describe", "web", check=0).out):
        assert "restart held: node drained" in view and "restart due" not in view, view
    rc.once(check=None)  # a pass more: the same message, no second event
    assert rc.record("web") == record
    assert [e["action"] for e in rc.events("web")].count("held") <= 1
    rc("uncordon", check=0)
    rc.converge()
    assert rc.record("web")["phase"] == "Ready"
    rc.down()


def test_uncordon_wakes_the_daemon(reconcile: Any) -> None:
    """`uncordon` said "deployments start on the next pass" and left the daemon to its
    resync: with `--resync 1h` the node stayed empty for up to an hour, its records still
    saying "node drained". It wakes the daemon, as `restart` does."""
    rc = reconcile
    rc.write("web")
    daemon = rc.daemon("--resync", "1h")
    rc.wait_for(lambda: (rc.record("web") or {}).get("phase") == "Ready", timeout=60)
    rc("drain", "--evict", check=0)
    # the daemon's pass after the engine's exit holds it: Pending, the drain named
    held = lambda: "drained" in (rc.record("web") or {}).get("message", "")  # noqa: E731
    rc.wait_for(held, timeout=30, what="web held by the drain")
    out = rc("uncordon", check=0).out
    rc.wait_for(lambda: (rc.record("web") or {}).get("phase") == "Ready", timeout=60)
    assert f"the daemon (pid {daemon.pid}) starts" in out, out
    daemon.terminate()
    daemon.wait(timeout=30)
    rc.down()


def test_a_folder_in_the_drain_files_place_is_named_and_status_goes_on(
    reconcile: Any,
) -> None:
    """`status` (and the page) failed whole on it with a bare I/O error: named now, with
    the move, as a torn drain file is; the pass refuses it, the engine runs on."""
    rc = reconcile
    rc.write("web")
    rc.converge()
    pid = rc.record("web")["ref"]["pid"]
    drain = rc.state / "drain.json"
    drain.mkdir()
    table = rc("status", check=0)
    assert f"{drain} is unreadable (Is a directory): remove it" in table.err, table
    assert "\nweb " in table.out, table
    refused = rc.once(check=1)
    assert f"reconcile: {drain} is unreadable (Is a directory)" in refused.err, refused
    assert rc.pids("web") == {pid}
    drain.rmdir()
    for shape in ("[]", '{"reason": "hand-written"}'):  # valid JSON, not a drain
        drain.write_text(shape)
        said = rc("status", check=0).err
        assert f"{drain} is unreadable (not a drain: no until): run `reconcile uncordon`" in said
    rc("uncordon", check=0)  # the way out it names
    rc.once()
    rc.down()


def test_bad_ttl_is_a_usage_error(reconcile: Any) -> None:
    result = reconcile("drain", "--ttl", "soon", check=64)
    assert "--ttl" in result.err and "30s, 5m, 1h" in result.err


def test_max_instances_node_wide_and_per_kind(reconcile: Any) -> None:
    rc = reconcile
    rc.write("a", basePort=rc.port)
    rc.write("b", basePort=rc.port + 2)
    rc("--once", "--max-instances", "1", check=1)
    pending = rc.record("b")
    assert rc.record("a")["phase"] in ("Starting", "Ready") and pending["phase"] == "Pending"
    assert pending["message"].startswith("node limit maxInstances=1 reached (running: a)")
    assert "--max-instances" in pending["message"] and "remove a manifest" in pending["message"]
    assert "maxInstances 1" in rc("devices", "--max-instances", "1", check=0).out
    rc.down()

    # Per kind, from the node config file in the state dir.
    (rc.manifests / "a.yaml").unlink()
    (rc.manifests / "b.yaml").unlink()
    gpu = {"count": 1, "kind": "nvidia"}
    rc.write("g1", basePort=rc.port, devices=gpu)
    rc.write("g2", basePort=rc.port + 2, devices=gpu)
    rc.write("cpu-only", basePort=rc.port + 4)
    (rc.state / "node.yaml").write_text("maxInstancesPerKind: {nvidia: 1}\n")
    rc.once(check=1)
    assert rc.record("g1")["devices"] == ["nvidia:0"] and rc.record("cpu-only")["port"]
    message = rc.record("g2")["message"]
    assert message.startswith("node limit maxInstances nvidia=1 reached (held by g1)")
    rc.down()


def test_a_higher_priority_deployment_preempts_for_the_node_limit(reconcile: Any) -> None:
    """--max-instances is room as a device is: a higher priority kept out only by it
    waited forever beside the lower one; it now preempts it, as a GPU shortage does."""
    rc = reconcile
    rc.write("low", basePort=rc.port)
    rc.converge("--max-instances", "1")
    low_pid = rc.status()["low"]["pid"]
    rc.write("high", basePort=rc.port + 2, priority=10)
    rc.once("--max-instances", "1", check=1)  # low Pending: --once says so
    rc.wait_gone(low_pid)
    low, high = rc.record("low"), rc.record("high")
    assert low["phase"] == "Pending" and low["message"].startswith(
        "preempted by high (priority 10)"
    ), low
    assert high["phase"] in ("Starting", "Ready"), high
    assert any(e["action"] == "preempt" for e in rc.events("low")), rc.events("low")
    rc.down()


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("maxInstances: many\n", "node.yaml:1: maxInstances"),
        ("maxInstancesPerKind: {tpu: 1}\n", "node.yaml:1: maxInstancesPerKind.tpu"),
        ("maxInstanses: 2\n", "node.yaml:1: maxInstanses: unknown setting"),
        ("maxInstances: [\n", "node.yaml:2: invalid YAML"),
        # a git section's lengths of time, checked with the rest (they said no line, no key)
        (
            "git:\n  url: file:///x.git\n  interval: 1 minute\n",
            "node.yaml:3: git.interval: '1 minute' is not a duration",
        ),
        (
            "git:\n  url: file:///x.git\n  interval: 0\n",
            "node.yaml:3: git.interval: 0 is no length of time",
        ),
        (
            "git:\n  url: file:///x.git\n  autoRollback: {progressDeadline: soon}\n",
            "node.yaml:3: git.autoRollback.progressDeadline: 'soon' is not a duration",
        ),
    ],
)
def test_a_bad_node_config_names_file_line_and_field(reconcile: Any, text: str, where: str) -> None:
    reconcile.state.mkdir(parents=True, exist_ok=True)
    (reconcile.state / "node.yaml").write_text(text)
    result = reconcile("--once", check=1)
    assert where in result.err and result.err.startswith("reconcile: ")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("maxInstances: [\n", "node.yaml:2: invalid YAML"),
        ("maxInstanses: 2\n", "node.yaml:1: maxInstanses: unknown setting"),
    ],
)
def test_read_verbs_warn_about_a_bad_node_config_and_go_on(
    reconcile: Any, text: str, where: str
) -> None:
    reconcile.write("web")
    reconcile.once()
    (reconcile.state / "node.yaml").write_text(text)
    for verb in (("status",), ("describe", "web"), ("events", "web"), ("devices",)):
        result = reconcile(*verb, check=0)
        assert result.err.startswith("warning: ") and where in result.err, str(result)
    # `plan` shows the plan too, but exits 1 naming the file as `--once` refuses the pass
    # (once, as its error: not also as the other verbs' warning)
    planned = reconcile("plan", check=1)
    assert planned.err == "" and where in planned.out, planned
    assert planned.out.startswith("error: "), planned
    assert "web" in planned.out, planned
    assert "web" in reconcile("status", check=0).out
    gateway = reconcile("gateway", "status", check=None)  # none runs: its own answer, exit 1
    assert where in gateway.err and "no gateway runs for state dir" in gateway.out, str(gateway)
    assert reconcile("--once", check=1).err.startswith("reconcile: ")  # a pass still refuses
    assert where in reconcile.down().err  # stopping needs no limit: it warns and stops
    assert reconcile.status() == {}


def test_a_bad_max_instances_flag_says_how(reconcile: Any) -> None:
    result = reconcile("--once", "--max-instances", "gpu=2", check=64)  # usage (issue 34, 18)
    assert "example: 8,nvidia=2" in result.err


@pytest.mark.parametrize("strategy", ["Recreate", "RollingUpdate"])
def test_a_spec_change_on_a_drained_node_waits_and_the_engine_serves_on(
    reconcile: Any, strategy: str
) -> None:
    """Editing a Ready deployment on a drained node ran `replace … stopped; Pending for the
    new` (a RollingUpdate too: its surge held, it fell back to recreate) and nothing served
    until uncordon. Kubernetes' cordon leaves the old Pod serving: the engine serves on
    with its old spec, its record says the drain holds the change, once; uncordon applies it."""
    rc = reconcile
    spec = {"strategy": strategy, "devices": {"count": 1, "kind": "nvidia"}}
    rc.write("web", **spec)
    rc.converge()
    (pid,) = rc.pids("web")
    port = rc.record("web")["port"]
    rc("drain", "--ttl", "1h", "--reason", "kernel update", check=0)
    rc.write("web", env={"MODE": "new"}, **spec)

    out = rc.once(check=1)  # what the drain holds, --once names (cron mails on it)
    record = rc.record("web")
    assert record["phase"] == "Ready" and record["ref"]["pid"] == pid, record
    assert rc.pids("web") == {pid} and "MODE" not in rc.environ(pid)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as answer:
        assert answer.status == 200  # it serves on
    held = record["message"]
    assert held.startswith("spec.env.MODE changed: held: node drained by "), record
    assert held.endswith("(kernel update): run `reconcile uncordon` or wait"), record
    assert held in out.err and "stopped" not in out.err, out
    planned = rc("plan", check=1).out  # nothing to apply until the drain ends: it waits
    assert "!" in planned and "spec.env.MODE changed: held: node drained" in planned, planned
    # --wait ends at once saying what needs you (it timed out: a Ready engine on its old
    # spec is not done, and nothing it waited for would move); 10m: a hang fails the call
    waited = rc("--once", "--wait", "--timeout", "10m", check=1)
    assert "cannot progress without you: web: spec.env.MODE changed: held" in waited.err, waited
    rc.once(check=1)  # a pass more: the same record, no second event
    assert rc.record("web") == record
    assert [e["action"] for e in rc.events("web")].count("held-change") == 1

    rc("uncordon", check=0)
    rc.converge()
    new = rc.record("web")
    assert new["phase"] == "Ready" and new["message"] == "", new
    assert new["ref"]["pid"] != pid and rc.environ(new["ref"]["pid"])["MODE"] == "new"
    rc.wait_gone(pid)
    rc.down()
