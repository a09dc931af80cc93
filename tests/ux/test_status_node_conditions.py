"""`status -o json` carries the node's conditions, as the lines around the table say them.

A person saw an unreadable node.yaml, a drain, the empty-folder guard above or below
`status`'s table; the JSON list had only deployments, so a script saw none of them.
Each item (DESIGN: a list) now has ``node_conditions``, Kubernetes' conditions shape.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

SHAPE = {"type", "status", "reason", "message", "lastTransitionTime"}


def _conditions(rc: Any) -> dict[str, dict[str, Any]]:
    """The node's conditions by type, the same in every item."""
    items = rc("status", "-o", "json", check=0).json()
    assert items, "no deployments listed"
    first = items[0]["node_conditions"]
    assert all(i["node_conditions"] == first for i in items), items
    assert all(set(c) == SHAPE for c in first), first
    return {c["type"]: c for c in first}


def test_status_json_says_the_node_config_and_drain_a_person_sees(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web", basePort=rc.port)
    rc.converge()
    fine = _conditions(rc)
    assert fine["NodeConfigReadable"]["status"] == "True", fine
    assert fine["Drained"]["status"] == "False" and fine["Drained"]["reason"] == "NotDrained"
    assert fine["DaemonStopped"] == {
        "type": "DaemonStopped",
        "status": "False",
        "reason": "NoDaemon",
        "message": "no daemon runs on this state dir",
        "lastTransitionTime": None,
    }

    node_yaml = rc.state / "node.yaml"
    node_yaml.write_text("labels: {gpu: h100\n")  # half-written
    broken = _conditions(rc)["NodeConfigReadable"]
    assert (broken["status"], broken["reason"]) == ("False", "Unreadable"), broken
    assert broken["message"].startswith(f"{node_yaml}:2: invalid YAML"), broken
    node_yaml.unlink()

    before = datetime.now(UTC).replace(microsecond=0)
    rc("drain", "--ttl", "1h", "--reason", "disk swap", check=0)
    drained = _conditions(rc)["Drained"]
    assert (drained["status"], drained["reason"]) == ("True", "Drained"), drained
    assert "(disk swap)" in drained["message"] and "reconcile uncordon" in drained["message"]
    assert datetime.fromisoformat(drained["lastTransitionTime"]) >= before, drained
    rc("uncordon", check=0)
    rc.down()


def test_status_json_says_the_empty_folder_guard(reconcile: Any) -> None:
    rc = reconcile
    manifest = rc.write("web", basePort=rc.port)
    rc.converge()
    manifest.unlink()  # the folder now holds no manifest: nothing is pruned
    rc.once(check=1)
    guard = _conditions(rc)["ManifestsRead"]
    assert (guard["status"], guard["reason"]) == ("False", "NothingPruned"), guard
    assert "nothing pruned" in guard["message"], guard
    rc.down("web")
