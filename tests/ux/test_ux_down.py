"""`reconcile down` says what it did to each record and whose records it left (issue 25)."""

from __future__ import annotations

import json
import sys
from typing import Any


def test_down_says_removed_for_what_never_ran(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web")
    rc.write("huge", basePort=rc.port + 5, devices={"count": 5, "kind": "nvidia"})
    # an engine that ended: nothing runs to be stopped
    rc.write("done", basePort=rc.port + 7, command=["/bin/sh", "-c", "exit 3"],
             restartPolicy="Never")  # fmt: skip
    rc.once(check=1)  # huge is Pending: no room
    assert rc.record("huge")["phase"] == "Pending" and rc.record("done")["phase"] == "Failed"
    down = rc("down", check=0)
    assert sorted(down.out.splitlines()) == [
        "removed done (Failed: not running)",
        "removed huge (Pending: nothing running)",
        "stopped web",
    ], down
    assert rc.record("huge") is None and rc.record("web") is None


def test_down_from_another_folder_names_the_sets_it_found(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web")
    rc.converge()
    elsewhere = rc.tmp / "elsewhere"
    elsewhere.mkdir()
    owner = str(rc.manifests.absolute())
    down = rc("down", "-f", str(elsewhere), check=0)
    assert down.out == "", down  # nothing of that set here: nothing stopped
    assert f"manifest set {str(elsewhere.absolute())!r} owns no deployment here" in down.err
    assert f"records of manifest set {owner!r} are here (web)" in down.err, down
    assert f"--owner {owner!r}" in down.err
    assert rc.record("web")["phase"] == "Ready"  # left alone
    assert rc("down", "-f", str(elsewhere), "--owner", owner, check=0).out == "stopped web\n"


def test_down_under_a_daemon_says_it_is_undone_and_how_to_keep_it_down(reconcile: Any) -> None:
    """`down web` while a daemon watches the folder was undone at its next pass without a
    word (issue 34, item 22): it says so, and names the manifest to remove or scale to 0."""
    rc = reconcile
    path = rc.write("web")
    daemon = rc.daemon("--resync", "1h")
    rc.wait_for(lambda: (rc.record("web") or {}).get("phase") == "Ready", timeout=60)
    down = rc("down", "web", check=0)
    assert down.out == "stopped web\n", down
    assert f"the daemon (pid {daemon.pid}) on this state dir starts web again" in down.err, down
    assert f"({path}:1)" in down.err and "`replicas: 0`" in down.err, down
    daemon.terminate()
    daemon.wait(timeout=30)
    rc.once()
    alone = rc("down", check=0)  # no daemon: nothing undoes this down, so nothing is said
    assert alone.out == "stopped web\n" and "daemon" not in alone.err, alone


def test_down_under_a_daemon_names_the_declaration_this_node_selects(reconcile: Any) -> None:
    """`chat` declared for gpu=a100 nodes and again for gpu=h100 ones, on an h100 node:
    `down chat` said nothing of the daemon that starts it again (it read both, a
    duplicate, and found no declaration); it names the h100 one's file and line."""
    rc = reconcile
    rc.state.mkdir(mode=0o700)
    (rc.state / "node.yaml").write_text("labels: {gpu: h100}\n")
    for file, selector in (("chat-a100", {"gpu": "a100"}), ("chat-h100", {"gpu": "h100"})):
        spec = rc.deployment("chat", nodeSelector=selector, basePort=rc.port)
        rc.write_text(f"{file}.yaml", rc.dump_yaml(spec))
    daemon = rc.popen("--resync", "1h")
    try:
        rc.wait_for(lambda: (rc.record("chat") or {}).get("phase") == "Ready", timeout=60)
        down = rc("down", "chat", check=0)
        assert down.out == "stopped chat\n", down
        said = f"the daemon (pid {daemon.pid}) on this state dir starts chat again"
        assert said in down.err, down
        where = f"({rc.manifests / 'chat-h100.yaml'}:1)"
        assert f"its manifest {where} still declares it" in down.err, down
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        rc.once()
        rc("down", check=0)  # what the daemon started again before it ended


def test_down_never_says_never_ran_of_an_engine_that_ran(reconcile: Any) -> None:
    """A preempted deployment (and an OnDemand one parked after its idleTimeout) ran, then
    was stopped: its record holds nothing, and `down` said `removed low (Pending: never
    ran)`, which is false. It says what is true of every such record: nothing runs."""
    rc = reconcile
    rc.devices = "nvidia:0"
    gpu = {"count": 1, "kind": "nvidia"}
    rc.write("low", devices=gpu)
    rc.converge()
    rc.write("high", devices=gpu, priority=10, basePort=rc.port + 2)
    rc.once(check=1)  # low is preempted: Pending, waiting for room
    assert rc.record("low")["phase"] == "Pending"
    down = rc("down", check=0)
    assert sorted(down.out.splitlines()) == [
        "removed low (Pending: nothing running)",
        "stopped high",
    ], down


def test_down_then_deleting_the_manifest_ends_the_history_once(reconcile: Any) -> None:
    """`down`, then the manifest deleted, once left the journal open: a later deployment
    of the name showed the old one's history in `events NAME`. The next pass ends it
    with `removed`, once, as a prune does."""
    rc = reconcile
    rc.write("keep", basePort=rc.port + 5)  # an empty folder prunes nothing (invariant 5)
    web = rc.write("web")
    rc.converge()
    assert rc("down", "web", check=0).out.strip() == "stopped web"
    web.unlink()
    rc.once()
    rc.once()
    actions = [e["action"] for e in rc.events("web")]
    assert actions[-2:] == ["stop", "removed"] and actions.count("removed") == 1, actions
    rc.write("web")
    rc.converge()
    shown = rc("events", "web", "-o", "json", check=0).out
    now = [json.loads(line)["action"] for line in shown.splitlines() if line.strip()]
    assert "stop" not in now and "removed" not in now and "start" in now, shown
    rc.down()


def test_another_sets_pass_leaves_a_stopped_deployments_history_open(reconcile: Any) -> None:
    """A state dir is shared by manifest sets: only the set that stopped the deployment
    ends its history (its manifest may still be in its own folder)."""
    rc = reconcile
    rc.write("keep", basePort=rc.port + 5)
    rc.write("web")
    rc.converge()
    rc("down", "web", check=0)
    other = rc.tmp / "other"
    rc.write("solo", folder=other, basePort=rc.port + 7)
    rc("--once", "-f", str(other), check=0)
    assert [e["action"] for e in rc.events("web")][-1] == "stop", rc.events("web")
    rc("-f", str(other), "down", check=0)
    rc.down()


def test_logs_after_down_show_the_last_instance_then_previous_the_one_before(
    reconcile: Any,
) -> None:
    """After a rolling update and `down`, `logs web` is the last instance's run (the one
    that took over) and `--previous` the instance it replaced, as before `down`."""
    rc = reconcile
    spec = {"strategy": "RollingUpdate", "devices": {"count": 1, "kind": "nvidia"}}
    rc.devices = "nvidia:0,nvidia:1"
    serve = f'exec {sys.executable} -m controller.demo.engine --port "$PORT"'
    rc.write("web", command=["sh", "-c", f"echo old one; {serve}"], **spec)
    rc.converge()
    rc.write("web", command=["sh", "-c", f"echo new one; {serve}"], **spec)
    rc.converge()
    before = rc("logs", "web", check=0).out
    previous = rc("logs", "web", "--previous", check=0).out
    assert "old one" in before and "new one" in before, before
    assert "old one" in previous and "new one" not in previous, previous
    rc.down()
    assert rc("logs", "web", check=0).out == before
    assert rc("logs", "web", "--previous", check=0).out == previous
