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

import os
import signal
import subprocess
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
        assert f"gateway pid {first.ref.pid} re-read its key file" in reloaded.out, reloaded
        reconcile.wait_for(lambda: _status_with(g, NEW) == 200, timeout=WAIT, what="new key")
        assert g.serving().ref == first.ref

        # node.yaml changed: a new gateway with its settings takes the port over.
        node.write_text("logMaxBytes: 8192\nlogMaxFiles: 5\n")
        took = reconcile("gateway", "reload", check=0)
        assert f"took it over from pid {first.ref.pid}" in took.out, took
        assert "node.yaml changed its logMaxBytes, logMaxFiles" in took.out, took
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


def _hup_pending(pid: int) -> bool:
    """Whether SIGHUP waits, sent to the process and not taken yet (its ShdPnd mask)."""
    status = Path(f"/proc/{pid}/status").read_text()
    (pending,) = [line.split()[1] for line in status.splitlines() if line.startswith("ShdPnd:")]
    return bool(int(pending, 16) & (1 << (signal.SIGHUP - 1)))


def test_reload_exits_by_the_gateway_s_own_answer(reconcile: Any, gateway: Any) -> None:
    """`gateway reload` checked the key file, sent SIGHUP and exited 0: a file changed
    between that check and the gateway's own re-read was refused there (`gateway status`
    said so) while the verb had said it was taken. It waits for the gateway's answer and
    exits by it. The gateway is stopped (SIGSTOP) while the verb signals it, so the file
    changes exactly between the two reads."""
    keys = _keys(reconcile, OLD)
    g = gateway("--api-keys", str(keys))
    pid = g.serving().ref.pid
    assert g.stop() == 0  # the gateway serves on: no daemon watches it while it is stopped
    os.kill(pid, signal.SIGSTOP)
    try:
        argv = reconcile.argv("gateway", "reload")
        verb = reconcile.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        reconcile.wait_for(lambda: _hup_pending(pid), timeout=WAIT, what="the verb's SIGHUP")
        keys.write_text("# every key revoked\n")
    finally:
        os.kill(pid, signal.SIGCONT)
    out, err = (b.decode() for b in verb.communicate(timeout=WAIT))
    assert verb.returncode == 1, (out, err)
    assert f"gateway pid {pid} refused the reload (API keys): --api-keys {keys}" in err, err
    assert "holds no key" in err and "the gateway keeps the keys loaded before" in err, err
    assert "reload refused (API keys" in reconcile("gateway", "status", check=0).out
    _keys(reconcile, OLD, NEW)
    taken = reconcile("gateway", "reload", check=0)
    assert f"gateway pid {pid} re-read its key file and TLS pair" in taken.out, taken
    assert "reload refused" not in reconcile("gateway", "status", check=0).out
    g.finish()
