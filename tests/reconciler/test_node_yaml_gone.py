"""A node.yaml read before and missing now keeps its labels: a disk not mounted (or a
removal by mistake) stops no deployment with a nodeSelector.

With cron alone (`--once`, no daemon), the next run read no labels and stopped every
such deployment as another node's; the daemon stopped them too at its next reload.
Every reader now takes the labels a pass last read in the file (``node-labels.json``),
with a warning naming the file and the moves, until the file says otherwise.
"""

from __future__ import annotations

from typing import Any

SELECTED = {"gpu": "h100"}


def _node_of_h100s(rc: Any) -> None:
    rc.state.mkdir(mode=0o700, exist_ok=True)
    (rc.state / "node.yaml").write_text("labels: {gpu: h100}\n")
    rc.write("picky", basePort=rc.port, nodeSelector=SELECTED)
    rc.write("plain", basePort=rc.port + 2)
    rc.converge()


def test_once_keeps_the_labels_of_a_node_yaml_gone_missing(reconcile: Any) -> None:
    rc = reconcile
    _node_of_h100s(rc)
    record = rc.record("picky")
    assert record is not None and record["phase"] == "Ready", record
    pid = record["ref"]["pid"]
    node_yaml = rc.state / "node.yaml"
    node_yaml.unlink()

    planned = rc("plan", "-o", "json", check=0)
    assert planned.json()["changes"] == [], planned  # nothing to destroy
    done = rc.once(check=0)
    assert f"warning: {node_yaml} is missing, though a pass read it before" in done.err, done
    assert "its last labels (gpu=h100) are kept" in done.err, done
    assert "write `labels: {}` in it to mean no labels" in done.err, done
    kept = rc.record("picky")
    assert kept is not None and kept["phase"] == "Ready" and kept["ref"]["pid"] == pid, kept
    assert "gpu=h100" in rc("status", check=0).err  # every reader says it

    # Said so in the file: no labels now, and the deployment goes as another node's.
    node_yaml.write_text("labels: {}\n")
    gone = rc.once(check=0)
    assert "is missing" not in gone.err, gone
    assert rc.record("picky") is None
    plain = rc.record("plain")
    assert plain is not None and plain["phase"] == "Ready", plain
    node_yaml.unlink()  # none read now: no warning, nothing kept
    quiet = rc.once(check=0)
    assert "is missing" not in quiet.err, quiet
    rc.down()
