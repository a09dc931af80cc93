"""`reconcile plan`: every class of change, with its reason, in text and JSON, on real engines.

Then the pass applies it: the in-place change keeps the engine (same pid), the replace
names the field that forced it.
"""

from __future__ import annotations

import json
import shlex
import socket
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from controller.redact import redact_args
from tests.procs import wait_for

# How a Failed engine's record says it ended under restartPolicy Never: with its code when
# the pass that started it saw the exit, as the code unknown when it exited after that pass
# (a later `--once` is not its parent: design.md, "exited"). `/bin/sh -c 'exit N'` exits
# within milliseconds, yet on a loaded box after the pass's last round (CI saw it once).
NEVER_ENDED = (
    "engine exited with code {code}; restartPolicy Never",
    "engine exited (code unknown: not our child); restartPolicy Never",
)


def _ended_never(code: int) -> tuple[str, ...]:
    return tuple(line.format(code=code) for line in NEVER_ENDED)


def test_plan_classifies_every_change_and_the_pass_does_exactly_that(reconcile: Any) -> None:
    rc = reconcile
    for offset, name in enumerate(("tuned", "moved", "gone", "steady")):
        rc.write(name, basePort=rc.port + 2 * offset)
    rc.converge()
    pids = {name: rc.record(name)["ref"]["pid"] for name in ("tuned", "moved", "steady")}

    slower = {"httpGet": {"path": "/health"}, "deadlineSeconds": 40, "periodSeconds": 0.5}
    rc.write("tuned", basePort=rc.port, readiness=slower, stopGracePeriodSeconds=3)
    rc.write("moved", basePort=rc.port + 2, command=rc.demo_command(model="other"))
    (rc.manifests / "gone.yaml").unlink()
    rc.write("fresh", basePort=rc.port + 8)
    rc.write("huge", devices={"count": 5, "kind": "nvidia"})

    # `huge` cannot start (a pass would exit 1): plan exits 1 too, as --once would
    doc = rc("plan", "-o", "json", check=1).json()
    by = {c["name"]: c for c in doc["changes"]}
    assert {n: c["change"] for n, c in by.items()} == {
        "fresh": "create",
        "tuned": "in-place",
        "moved": "replace",
        "gone": "destroy",
        "huge": "wait",
    }
    assert by["tuned"]["fields"] == [
        "spec.readiness.deadlineSeconds",
        "spec.readiness.periodSeconds",
        "spec.stopGracePeriodSeconds",
    ]
    assert by["moved"]["fields"] == ["spec.command"]
    assert "manifest removed" in by["gone"]["reason"] and "new deployment" in by["fresh"]["reason"]
    assert "needs 5 nvidia devices" in by["huge"]["reason"]
    assert "the node has only 2: lower devices.count or add devices" in by["huge"]["reason"]
    assert doc["unchanged"] == [{"name": "steady", "phase": "Ready"}]
    assert doc["in_sync"] is False and doc["errors"] == []
    assert doc["revision"] is None  # a folder outside git
    assert doc["summary"]["create"] == 1 and doc["summary"]["unchanged"] == 1

    text = rc("plan", check=1).out
    lines = {
        t[1]: line for line in text.splitlines() if (t := line.split())[:1] and t[0] in SYMBOLS
    }
    assert lines["fresh"].lstrip().startswith("+ fresh") and "create" in lines["fresh"]
    assert lines["moved"].lstrip().startswith("-/+ moved")
    assert "forces replacement: spec.command" in lines["moved"]
    assert lines["tuned"].lstrip().startswith("~ tuned") and "in-place" in lines["tuned"]
    assert lines["gone"].lstrip().startswith("- gone") and "destroy" in lines["gone"]
    assert lines["huge"].lstrip().startswith("! huge")
    assert "unchanged" in next(line for line in text.splitlines() if "steady" in line)
    assert "Plan: 1 to create, 1 to update in place, 1 to replace, 1 to destroy" in text

    rc.once(check=1)  # huge stays Pending: exit 1
    assert rc.record("tuned")["ref"]["pid"] == pids["tuned"]  # updated in place, not restarted
    assert rc.record("tuned")["grace_seconds"] == 3
    assert rc.record("tuned")["probe"]["period_seconds"] == 0.5
    assert rc.record("steady")["ref"]["pid"] == pids["steady"]
    assert rc.record("gone") is None and rc.record("huge")["phase"] == "Pending"
    assert any(e["action"] == "update" for e in rc.events("tuned"))
    assert any(e["action"] == "replace" for e in rc.events("moved"))

    (rc.manifests / "huge.yaml").unlink()
    rc.converge()
    assert rc.record("moved")["ref"]["pid"] != pids["moved"]
    in_sync = rc("plan", "-o", "json", check=0).json()
    assert in_sync["in_sync"] is True and in_sync["changes"] == []
    assert "In sync" in rc("plan", check=0).out
    rc.down()


SYMBOLS = {"+", "~", "-/+", "-", "!", "↻"}


def test_a_new_invalid_deployment_is_a_wait_not_an_update(reconcile: Any) -> None:
    """It cannot start (`!`, with the error), and is never counted as an in-place update."""
    rc = reconcile
    rc.write("broken", stopGracePeriodSeconds="soon")
    doc = rc("plan", "-o", "json", check=1).json()
    (change,) = doc["changes"]
    assert change["name"] == "broken" and change["change"] == "wait", change
    assert "spec invalid" in change["reason"] and "stopGracePeriodSeconds" in change["reason"]
    assert doc["summary"]["in-place"] == 0 and doc["summary"]["wait"] == 1
    text = rc("plan", check=1).out
    assert "! broken" in text and "0 to update in place" in text and "1 waiting" in text, text
    rc("--once", check=1)  # its record says why it is not started
    rc.write("broken", stopGracePeriodSeconds=5)  # fixed: one create, and why
    fixed = rc("plan", "-o", "json", check=2).json()
    assert [(c["name"], c["change"]) for c in fixed["changes"]] == [("broken", "create")], fixed
    assert fixed["changes"][0]["reason"].startswith("manifest is valid again: placing"), fixed


def test_plan_exits_1_on_what_a_pass_leaves_failed_as_once_does(reconcile: Any) -> None:
    """README: `plan` exits 1 in the cases `--once` does. A Failed engine and a crash loop
    are no change a pass would make, yet `--once` exits 1 on them: so does `plan`, and
    its errors name them as `--once`'s do."""
    rc = reconcile
    exit_3 = ["/bin/sh", "-c", "exit 3"]
    rc.write("done", command=exit_3, restartPolicy="Never")
    rc.write("loop", command=exit_3, basePort=rc.port + 2)
    wait_for(
        lambda: (
            rc("--once", check=None).code == 1
            and (rc.record("done") or {}).get("phase") == "Failed"
            and (rc.record("loop") or {}).get("restarts", 0) > 0
            and (rc.record("loop") or {}).get("phase") == "BackOff"
        ),
        what="a Failed engine and a crash loop",
    )
    # Its first back-off is 10 s: the three plans below outlasted it on a busy box (CI,
    # load 15: the third saw its restart due and exited 2). As the pass would leave a loop
    # after its 4th restart (an 80 s back-off): crash-looping for the rest of the test.
    store = rc.store()
    loop = store.read("loop")
    assert loop is not None
    store.write(replace(loop, restarts=4, backoff_until=datetime.now(UTC) + timedelta(seconds=75)))
    failed = rc.record("done")["message"]
    assert failed in _ended_never(3), failed
    assert loop.message.startswith("engine exited "), loop.message  # its code: as done's
    planned = rc("plan", check=1)
    assert f"error: done: Failed: {failed}" in planned.out, planned
    assert f"error: loop is crash-looping ({loop.message})" in planned.out, planned
    doc = rc("plan", "-o", "json", check=1).json()
    assert doc["in_sync"] is False and len(doc["errors"]) == 2, doc
    # The Failed one's spec edited: its record goes and the same pass starts the new spec,
    # a replace (it showed as a destroy of a deployment the manifests still declare).
    exit_4 = ["/bin/sh", "-c", "exit 4"]
    rc.write("done", command=exit_4, restartPolicy="Never")
    doc = rc("plan", "-o", "json", check=1).json()
    changed = [(c["name"], c["change"]) for c in doc["changes"] if c["name"] == "done"]
    assert changed == [("done", "replace")] and doc["summary"]["destroy"] == 0, doc
    # Each try is a whole `--once`: the release, then the start, then the exit seen by
    # that pass or (it exited after the pass's last round) by the next one, with no code.
    # Waiting for "code 4" alone waited for good there (CI, load 8: gave up after 15 s).
    seen: dict[str, Any] = {}

    def new_spec_failed() -> bool:
        seen["once"] = rc("--once", check=None).code
        seen["done"] = done = rc.record("done") or {}
        on_new_spec = done.get("stored_spec", {}).get("command") == exit_4
        return on_new_spec and done.get("phase") == "Failed"

    try:
        wait_for(new_spec_failed, what="the new spec run and Failed")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the last --once: {seen}") from None
    assert seen["done"]["message"] in _ended_never(4), seen
    rc("down", check=0)


def test_a_new_on_demand_deployment_is_a_create_not_a_destroy(reconcile: Any) -> None:
    """Its first pass writes an Idle record and starts nothing: nothing is destroyed."""
    rc = reconcile
    rc.write("lazy", activation="OnDemand")
    doc = rc("plan", "-o", "json", check=2).json()
    assert [(c["name"], c["change"]) for c in doc["changes"]] == [("lazy", "create")], doc
    assert doc["summary"]["destroy"] == 0 and doc["summary"]["create"] == 1, doc
    rc("--once", check=0)
    assert rc.record("lazy")["phase"] == "Idle"
    assert "In sync" in rc("plan", check=0).out


def test_every_action_has_a_plan_class() -> None:
    """A new action must say how `plan` shows it (the fallback once called Reject an update)."""
    from controller.cli.render.planview import SYMBOL
    from controller.core import actions

    kinds = {
        v for v in vars(actions).values() if isinstance(v, type) and issubclass(v, actions.Action)
    }
    missing = sorted(k.__name__ for k in kinds - {actions.Action} if "plan_class" not in vars(k))
    assert not missing, missing
    unshown = sorted(k.__name__ for k in kinds - {actions.Action} if k.plan_class not in SYMBOL)
    assert not unshown, unshown


def test_a_turn_on_a_shared_device_is_no_blocker_for_plan_as_for_once(reconcile: Any) -> None:
    """Two memory-packed engines on one card start one at a time: the second waits its
    turn, which `--once` counts as no failure (the next pass starts it). `plan` said
    "Not in sync: ... (a pass exits 1)" and exited 1 there, so a GitOps job that runs
    `plan` first refused a first deploy of packed models that the pass makes fine."""
    rc = reconcile
    rc.devices = "nvidia:0=80Gi"
    packed = {"count": 1, "kind": "nvidia", "memory": "20Gi"}
    rc.write("first", devices=packed)
    rc.write("second", devices=packed, basePort=rc.port + 2)

    planned = rc("plan", check=2)  # changes, none that needs you
    assert "waiting for first to be Ready on nvidia:0" in planned.out, planned
    assert "Not in sync" not in planned.out and "a pass exits 1" not in planned.out, planned
    doc = rc("plan", "-o", "json", check=2).json()
    assert {c["name"]: c["change"] for c in doc["changes"]} == {
        "first": "create",
        "second": "wait",
    }, doc
    assert doc["in_sync"] is False and doc["errors"] == []
    rc.once(check=0)  # what plan foretold: the pass exits 0, second waits its turn
    if rc.record("second")["phase"] != "Pending":
        # Its turn came in this pass: first was Ready before a later round (a loaded
        # box's rounds are slower than the demo engine's start; Starting, load ~24).
        ready = [e["time"] for e in rc.events("first") if e["action"] == "ready"]
        began = [e["time"] for e in rc.events("second") if e["action"] == "start"]
        assert ready and began and ready[0] <= began[0], (ready, began)
    rc.converge()
    rc.down()


def test_a_manifest_broken_under_a_running_engine_is_a_wait_not_an_update(
    reconcile: Any,
) -> None:
    """A typo in a running deployment's manifest leaves the engine running and needs
    you: `plan` counted it as `~ in-place` ("1 to update in place"), as if a pass would
    apply a change. It is `!` (wait), like a new invalid one, and exits 1 as before."""
    rc = reconcile
    rc.write("steady")
    rc.converge()
    rc.write("steady", stopGracePeriodSeconds="soon")
    doc = rc("plan", "-o", "json", check=1).json()
    (change,) = doc["changes"]
    assert change["name"] == "steady" and change["change"] == "wait", change
    assert "spec invalid (engine left running)" in change["reason"], change
    assert doc["summary"]["in-place"] == 0, doc
    text = rc("plan", check=1).out
    assert "! steady" in text and "0 to update in place" in text, text
    rc("--once", check=1)
    rc.write("steady", restartPolicy="Sometimes")  # another error: still a wait
    again = rc("plan", "-o", "json", check=1).json()
    assert [(c["name"], c["change"]) for c in again["changes"]] == [("steady", "wait")], again
    rc.down()


def test_a_started_engine_whose_probe_passes_is_unchanged_and_ready(reconcile: Any) -> None:
    """Started by a pass that did not wait, its probe passing when `plan` looks: listed
    with the unchanged, its "phase" said "GET /health -> 200" (the probe's answer)."""
    import urllib.request

    rc = reconcile
    rc.write("quick", command=rc.demo_command(load_seconds="3"))  # Ready after the pass
    rc.once()
    assert rc.record("quick")["phase"] == "Starting"
    port = rc.record("quick")["port"]

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    wait_for(healthy, what="the engine's /health answering 200")
    assert rc.record("quick")["phase"] == "Starting"  # no pass has looked since: plan does
    doc = rc("plan", "-o", "json", check=0).json()
    assert doc["unchanged"] == [{"name": "quick", "phase": "Ready"}], doc
    line = next(x for x in rc("plan", check=0).out.splitlines() if "quick" in x)
    assert line.split()[-1] == "Ready", line
    rc.down()


def test_a_broken_node_config_is_said_once_as_the_plan_error(reconcile: Any) -> None:
    """`plan` listed an unreadable node.yaml as its error and also printed the lenient
    verbs' warning of it on stderr: one problem said twice, in two voices. It is said
    once, among the plan's errors (text and JSON alike), and the exit is `--once`'s 1."""
    rc = reconcile
    rc.state.mkdir(mode=0o700)
    node_yaml = rc.state / "node.yaml"
    node_yaml.write_text("labels: {gpu: h100\n")  # half-written
    rc.write("web")
    planned = rc("plan", check=1)
    said = planned.out + planned.err
    assert said.count(f"{node_yaml}:2: invalid YAML") == 1, planned
    assert f"error: {node_yaml}:2: invalid YAML" in planned.out, planned
    assert "`--once` refuses to run on it" in planned.out and planned.err == "", planned
    assert "this plan is made without its settings" in planned.out, planned  # the warning's
    doc = rc("plan", "-o", "json", check=1)
    assert doc.err == "" and len(doc.json()["errors"]) == 1, doc
    assert doc.json()["errors"][0].startswith(f"{node_yaml}:2: invalid YAML"), doc


def test_a_preemption_exits_1_as_the_pass_that_makes_it_does(reconcile: Any) -> None:
    """A higher priority takes the lower one's GPU: the pass stops it and leaves it
    Pending, and `--once` exits 1. `plan` said the same preemption was a change (exit 2)
    and "destroy" without a word of the wait: a GitOps job's plan passed what its apply
    then failed on. It exits 1, says what the pass leaves, and agrees once it happened."""
    rc = reconcile
    rc.devices = "nvidia:0"
    gpu = {"count": 1, "kind": "nvidia"}
    rc.write("low", devices=gpu)
    rc.converge()
    rc.write("high", devices=gpu, priority=10, basePort=rc.port + 2)

    planned = rc("plan", check=1)
    said = "preempted by high (priority 10): stopped, then Pending until room returns"
    assert f"- low   destroy    {said}" in planned.out, planned
    assert "Not in sync" in planned.out and "a pass exits 1" in planned.out, planned
    doc = rc("plan", "-o", "json", check=1).json()
    assert doc["in_sync"] is False, doc
    assert {c["name"]: c["action"] for c in doc["changes"]} == {
        "high": "start",
        "low": "preempt",
    }, doc

    rc.once(check=1)  # what plan foretold
    assert rc.record("low")["phase"] == "Pending"
    rc("plan", check=1)  # and after it: low waits for room
    rc.down()


def test_a_memory_request_no_device_holds_points_at_its_line(reconcile: Any) -> None:
    """`devices.memory` larger than any card can never be placed: the reason names the
    manifest, as a load error would. It pointed at the document's first line (`m.yaml:1`),
    not the `memory:` line, in a file of several documents the wrong one to look at."""
    rc = reconcile
    rc.devices = "nvidia:0=40Gi"
    first = "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: small}\n"
    first += f"spec:\n  engine: command\n  command: [sleep, '60']\n  basePort: {rc.port}\n"
    second = "apiVersion: reconcile/v1\nkind: Deployment\nmetadata: {name: big}\nspec:\n"
    second += "  engine: command\n  command: [sleep, '60']\n  devices:\n    count: 1\n"
    second += "    kind: nvidia\n    memory: 60Gi\n"
    path = rc.write_text("m.yaml", f"{first}---\n{second}")
    line = path.read_text().splitlines().index("    memory: 60Gi") + 1

    doc = rc("plan", "-o", "json", check=1).json()
    by = {c["name"]: c for c in doc["changes"]}
    assert by["big"]["change"] == "wait", doc
    assert by["big"]["reason"].startswith(f"{path}:{line}: spec.devices.memory 60Gi"), doc
    rc.once(check=1)
    assert rc.record("big")["message"].startswith(f"{path}:{line}: "), rc.record("big")
    rc.down()


def test_plan_shows_what_a_replaces_new_engine_runs_which_the_pass_then_runs(
    reconcile: Any,
) -> None:
    """An operator reviewing a changed command saw `-/+ shown replace` and no command: the
    new engine is placed by a later round. `plan` now shows what it would run and where it
    would go if placed now (its new basePort is taken: the port after), secrets hidden,
    as a start's; the pass then runs exactly that."""
    rc = reconcile
    rc.write("shown", basePort=rc.port, command=rc.demo_command(model="old"), env={"A": "b"})
    rc.once()
    old = rc.record("shown")["ref"]["pid"]
    model = "https://user:hunter2-not-for-plan@example.invalid/new"
    new = {"basePort": rc.port + 1, "command": rc.demo_command(model=model), "env": {"A": "b"}}
    rc.write("shown", **new)
    with socket.create_server(("127.0.0.1", rc.port + 1)):  # someone else's, on basePort
        doc = rc("plan", "-o", "json", check=2).json()
        (change,) = doc["changes"]
        assert change["change"] == "replace" and "hunter2" not in json.dumps(doc), doc
        runs = change["runs"]
        assert "https://user:<redacted>@example.invalid/new" in runs["argv"], runs
        assert str(rc.port + 2) in runs["argv"] and "A" in runs["env"], runs
        where = f"if placed now: port {rc.port + 2}, devices none"
        assert change["placed"] == f"a later round of the pass places it; {where}", change
        text = rc("plan", check=2).out
        assert f"      runs: {shlex.join(runs['argv'])}" in text, text
        assert f"      placed: a later round of the pass places it; {where}" in text, text

        rc.once()
    record = rc.record("shown")
    assert record["ref"]["pid"] != old and record["port"] == rc.port + 2, record
    cmdline = Path(f"/proc/{record['ref']['pid']}/cmdline").read_bytes().decode()
    assert redact_args(cmdline.split("\0")[:-1]) == runs["argv"]
    rc.down()


def test_plan_says_when_a_replaces_new_engine_would_not_start(reconcile: Any) -> None:
    """A change that asks for a device another deployment holds: the replace stops the
    running engine, and its new one would wait. `plan` says so under the replace (it
    showed only `-/+ replace`, as if the new engine would run)."""
    rc = reconcile
    rc.write("shown", basePort=rc.port, command=rc.demo_command(model="old"))
    rc.write("other", basePort=rc.port + 3, devices={"count": 2, "kind": "nvidia"})
    rc.once()
    rc.write("shown", basePort=rc.port, devices={"count": 1, "kind": "nvidia"})
    doc = rc("plan", "-o", "json", check=2).json()
    (change,) = doc["changes"]
    assert change["change"] == "replace" and "runs" not in change, change
    assert change["placed"].startswith(
        "a later round of the pass places it; it would not start now (pending: no capacity: "
        "needs 1 nvidia device, 0 free"
    ), change
    assert "held by other [nvidia:0,nvidia:1]" in change["placed"], change
    assert f"      placed: {change['placed']}" in rc("plan", check=2).out
    rc.down()


def test_an_autoscaled_count_no_change_came_to_says_where_it_starts(reconcile: Any) -> None:
    """Before the autoscaler's first change `plan` said "the spec's count (no load seen
    yet)", under load that stayed below the target too (a trial's 10 clients on a fast
    engine), and of a `min: 0` deployment at 0 that the spec's count was 1."""
    rc = reconcile
    rc.write("nap", autoscale={"min": 0, "max": 3})
    rc.write("busy", basePort=rc.port + 5, replicas=2, autoscale={"min": 1, "max": 3})
    plan = rc("plan", check=None).out
    assert "nap: 0 desired (autoscale 0..3: not scaled yet: autoscale.min, where" in plan, plan
    assert "busy: 2 desired (autoscale 1..3: not scaled yet: spec.replicas, where" in plan, plan
    assert "no load seen" not in plan


def test_plan_shows_the_argv_a_start_runs_which_the_pass_then_runs(reconcile: Any) -> None:
    rc = reconcile
    model = "https://user:hunter2-not-for-plan@example.invalid/m"  # a URL's password
    rc.write("shown", basePort=rc.port, command=rc.demo_command(model=model), env={"A": "b"})
    doc = rc("plan", "-o", "json", check=2).json()
    (change,) = doc["changes"]
    runs = change["runs"]
    assert "hunter2" not in json.dumps(doc) and "A" in runs["env"], runs
    assert "https://user:<redacted>@example.invalid/m" in runs["argv"], runs
    text = rc("plan", check=2).out
    assert f"      runs: {shlex.join(runs['argv'])}" in text, text

    rc.once()
    record = rc.record("shown")
    assert record is not None and record["ref"] is not None, record
    cmdline = Path(f"/proc/{record['ref']['pid']}/cmdline").read_bytes().decode()
    assert redact_args(cmdline.split("\0")[:-1]) == runs["argv"]
    rc.down()
