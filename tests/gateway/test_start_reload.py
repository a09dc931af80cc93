"""`reconcile gateway start` and `reconcile gateway reload`, the verbs an operator used to
systemctl reaches for beside stop, restart and status: a real daemon, gateway processes,
key files and node.yaml.

- ``reload`` re-reads node.yaml's gateway settings in the serving gateway: unchanged, the
  same process re-reads its key file (SIGHUP: a key added is let in, no hand-over);
  changed, a new gateway takes the port over with them; a node.yaml the checks refuse is
  refused with its file, line and field, and the serving gateway is untouched;
- ``start`` leaves one that serves as it is (said, exit 0) and starts one a
  `gateway stop` stopped (a bad node.yaml refused as restart refuses it); ``reload`` with
  none serving says so (exit 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

WAIT = 40.0
OLD, NEW = "sk-old-key-0123456789", "sk-new-key-0123456789"


def _keys(reconcile: Any, *keys: str) -> Path:
    path: Path = reconcile.tmp / "keys.txt"
    path.write_text("".join(f"{key}\n" for key in keys))
    path.chmod(0o600)
    return path


def _status_with(g: Any, key: str) -> int:
    status: int = g.post("alpha", headers={"Authorization": f"Bearer {key}"}).status
    return status


def test_reload_and_start_as_systemctl_has_them(reconcile: Any, gateway: Any) -> None:
    node = reconcile.tmp / "node.yaml"
    node.write_text("logMaxBytes: 4096\nlogMaxFiles: 2\n")
    keys = _keys(reconcile, OLD)
    reconcile.write("alpha")
    g = gateway("--node-config", str(node), "--api-keys", str(keys))
    try:
        g.wait_phase("alpha", "Ready")  # a pass: the daemon's start of its gateway is over
        first = g.serving()
        assert _status_with(g, NEW) == 401

        # node.yaml unchanged: the same gateway re-reads its key file.
        _keys(reconcile, OLD, NEW)
        reloaded = reconcile("gateway", "reload", check=0)
        assert f"gateway pid {first.ref.pid} re-reads its key file" in reloaded.out, reloaded
        reconcile.wait_for(lambda: _status_with(g, NEW) == 200, timeout=WAIT, what="new key")
        assert g.serving().ref == first.ref

        # node.yaml changed: a new gateway with its settings takes the port over.
        node.write_text("logMaxBytes: 8192\nlogMaxFiles: 5\n")
        took = reconcile("gateway", "reload", check=0)
        assert f"took it over from pid {first.ref.pid}" in took.out, took
        assert "node.yaml changed its log_max_bytes, log_keep" in took.out, took
        second = g.serving()
        assert second.ref != first.ref
        assert (second.settings["log_max_bytes"], second.settings["log_keep"]) == (8192, 5)
        assert _status_with(g, NEW) == 200

        # A slip in node.yaml: refused with where it is; the gateway serves on untouched.
        node.write_text("logMaxBytes: 8192\nlogMaxFile: 5\n")
        refused = reconcile("gateway", "reload", check=1)
        assert f"{node}:2: logMaxFile: unknown setting" in refused.err, refused
        assert f"pid {second.ref.pid} serves on as it was" in refused.err, refused
        assert "`reconcile gateway reload` again" in refused.err, refused
        assert g.serving().ref == second.ref
        node.write_text("logMaxBytes: 8192\nlogMaxFiles: 5\n")

        # start: one serves, so nothing starts, and that is no failure.
        started = reconcile("gateway", "start", check=0)
        assert f"gateway pid {second.ref.pid} serves" in started.out, started
        assert "already: nothing started" in started.out, started
        assert g.serving().ref == second.ref

        # Stopped, reload has nothing to reload and start starts it again.
        reconcile("gateway", "stop", check=0)
        nothing = reconcile("gateway", "reload", check=1)
        assert "nothing to reload: no gateway runs" in nothing.err, nothing
        node.write_text("logMaxBytes: 8192\nlogMaxFile: 5\n")
        refused = reconcile("gateway", "start", check=1)
        assert f"gateway not started: {node}:2: logMaxFile: unknown setting" in refused.err
        assert "nothing serves: fix that and run `reconcile gateway start` again" in refused.err
        node.write_text("logMaxBytes: 8192\nlogMaxFiles: 5\n")
        again = reconcile("gateway", "start", check=0)
        how = f"started again: pid {second.ref.pid} was stopped by `reconcile gateway stop`"
        assert how in again.out, again
        third = g.serving()
        assert third.ref != second.ref
        assert third.settings["log_max_bytes"] == 8192
        assert _status_with(g, NEW) == 200
    finally:
        g.finish()
