"""The daemon and `--once` agree on a node.yaml gone missing: its last labels are kept.

The daemon kept the labels it loaded until its next reload, which then read none and
stopped every deployment with a nodeSelector (as cron's `--once` did at once). A reload
now takes the labels a pass last read in the file, as every reader does, and says so.
"""

from __future__ import annotations

import signal
from typing import Any

from daemon.test_daemon_loop import ready_pid, sleeper


def test_a_reload_keeps_the_labels_of_a_node_yaml_gone_missing(
    reconcile: Any, daemon: Any, finish: Any
) -> None:
    rc = reconcile
    rc.state.mkdir(mode=0o700, exist_ok=True)
    node_yaml = rc.state / "node.yaml"
    node_yaml.write_text("labels: {gpu: h100}\n")
    rc.write("picky", nodeSelector={"gpu": "h100"}, **sleeper())
    d = daemon()
    d.wait_pass()
    pid = d.wait(lambda: ready_pid(rc, "picky"), "picky Ready")
    node_yaml.unlink()
    d.proc.send_signal(signal.SIGHUP)
    d.wait_pass(trigger="sighup")  # logged once the pass after the reload is over
    (reloaded,) = d.lines("configuration reloaded")
    assert reloaded["labels"] == {"gpu": "h100"}, reloaded
    assert ready_pid(rc, "picky") == pid, rc.record("picky")
    # A `--once` beside it reads the same labels: it runs (no "labels differ" refusal).
    beside = rc.once(check=0)
    assert "its last labels (gpu=h100) are kept" in beside.err, beside
    assert ready_pid(rc, "picky") == pid, rc.record("picky")
    finish(d)
