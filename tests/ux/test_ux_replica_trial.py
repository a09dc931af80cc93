"""An operator's trial of replicas, rollouts and priorities through the real CLI: what a
Kubernetes user expects of a Deployment's edge values and of the words after each step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROLLING = {"replicas": 2, "strategy": "RollingUpdate", "devices": {"count": 1, "kind": "nvidia"}}


def _edit(path: Path, **spec: Any) -> None:
    """Set ``spec`` fields in the manifest at ``path`` as a user's editor would, values a
    manifest model would refuse included."""
    doc = yaml.safe_load(path.read_text())
    doc["spec"].update(spec)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_a_rolling_bound_that_is_no_count_is_refused_and_the_replicas_serve_on(
    reconcile: Any,
) -> None:
    """maxSurge "abc" or -1 is refused as Kubernetes refuses it (file, line, field), never
    a traceback from the rollout that reads it; the running replicas keep serving."""
    rc = reconcile
    path = rc.write("web", **ROLLING)
    rc.converge()
    pids = {name: rc.status()[name]["pid"] for name in ("web", "web@1")}
    for bound, words in (("abc", "'abc' is not a percentage"), (-1, "-1 is below 0")):
        _edit(path, rollingUpdate={"maxSurge": bound}, args=["--chunks", "4"])
        for verb in (("validate",), ("plan",), ("--once",)):
            said = rc(*verb, check=1)
            text = said.out + said.err
            assert "Traceback" not in text, said
            assert f"{path}:" in text and "spec.rollingUpdate.maxSurge" in text, said
            assert words in text, said
    status = rc.status()
    assert {name: status[name]["pid"] for name in pids} == pids  # invariant 4: untouched
    assert all(status[name]["phase"] == "Ready" for name in pids), status
    rc.down()


def test_describe_says_no_last_exit_of_an_engine_a_rolled_back_update_left_alone(
    reconcile: Any,
) -> None:
    """A rolling update whose new version crashed, then fixed: the engine the fix rolled
    in never exited, and `describe` says so (kubectl's Last State of a new Pod is empty).
    It showed the abandoned `@next`'s crash and log lines as this engine's last exit."""
    rc = reconcile
    rc.write("web", strategy="RollingUpdate")
    rc.converge()
    rc.write("web", strategy="RollingUpdate", args=["--load-seconds", "bad"])

    def crashed() -> bool:
        rc.once(check=None)
        return any(
            e.get("action") == "fail" and e.get("instance") == "web@next" for e in rc.events("web")
        )

    rc.wait_for(crashed, timeout=60, what="the bad version's crash")
    rc.write("web", strategy="RollingUpdate", args=["--chunks", "4"])
    rc.converge()
    fixed = rc.status()["web"]
    assert fixed["phase"] == "Ready" and fixed["restarts"] == 0, fixed
    text = rc("describe", "web", check=0).out
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Last exit:"))
    assert lines[at] == "Last exit:    -", text
    assert "its last log lines" not in lines[at + 1], text  # the crash's are not its own
    assert " fail " in text, text  # the crash stays in the events, where it belongs
    rc.down()


def test_max_unavailable_100_percent_replaces_every_replica_at_once_and_plan_says_so(
    reconcile: Any,
) -> None:
    """maxSurge 0, maxUnavailable 100%: Kubernetes replaces every replica at once, and
    `plan` says that path. It said "one at a time in place, at most 3 down" of it."""
    rc = reconcile
    rc.devices = "nvidia:0,nvidia:1,nvidia:2"
    bounds = {"maxSurge": 0, "maxUnavailable": "100%"}
    spec = {**ROLLING, "replicas": 3, "rollingUpdate": bounds}
    rc.write("web", **spec)
    rc.converge()
    names = ("web", "web@1", "web@2")
    before = {name: rc.status()[name]["pid"] for name in names}
    rc.write("web", **spec, args=["--chunks", "4"])
    plan = rc("plan", check=2).out
    assert plan.count("no surge: up to 3 at a time in place, at most 3 down") == 3, plan
    assert "one at a time" not in plan, plan
    rc.converge()
    after = rc.status()
    assert all(after[name]["phase"] == "Ready" for name in names), after
    assert all(after[name]["pid"] != before[name] for name in names), (before, after)
    rc.down()


def test_a_replica_name_no_record_has_is_no_deployment_to_status_or_describe(
    reconcile: Any,
) -> None:
    """`status web@1` and `describe web@1` show web (a record's own name picks its
    deployment); `web@7` of a 2-replica web is nothing, exit 1 as kubectl's NotFound,
    as `restart` and `down` say already. It showed all of web, exit 0."""
    rc = reconcile
    rc.write("web", replicas=2, devices={"count": 1, "kind": "nvidia"})
    rc.converge()
    for verb in ("status", "describe"):
        shown = rc(verb, "web@1", check=0)
        assert "web" in shown.out, shown
        missing = rc(verb, "web@7", check=1)
        assert "no deployment named 'web@7'" in missing.err, missing
        assert "did you mean 'web'?" in missing.err and missing.out == "", missing
    rc.down()


def test_plan_during_a_rolling_update_says_it_is_under_way_not_in_sync(reconcile: Any) -> None:
    """Mid-rollout (a new instance Starting beside the old ones), `plan` said "In sync: a
    pass would change nothing" of replicas serving their old spec, "unchanged". Kubernetes'
    `rollout status` says it waits for the rollout: so does `plan` now (exit 0, as no pass
    has anything to do that the rollout does not do by itself)."""
    rc = reconcile
    rc.devices = "nvidia:0,nvidia:1,nvidia:2"
    rc.write("web", **ROLLING)
    rc.converge()
    rc.write("web", **ROLLING, args=["--load-seconds", "600"])  # Starting while we look
    rc.once()
    assert rc.status()["web@next"]["phase"] == "Starting", rc.status()
    plan = rc("plan", check=0).out
    old = "unchanged  Ready, on its old spec: the rolling update replaces it in turn"
    assert plan.count(old) == 2, plan  # web and web@1
    assert "Rolling: a pass would change nothing now" in plan, plan
    assert "In sync" not in plan, plan
    rc.down()
