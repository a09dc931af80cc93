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
