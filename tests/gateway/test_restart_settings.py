"""`reconcile gateway restart` reads node.yaml again, as the daemon's start does (and as
`systemctl restart` reads the unit file): real daemons, gateway processes and files.

- the request log's rotation (node.yaml's ``logMaxBytes``/``logMaxFiles``) edited, then
  ``gateway restart``: the new gateway runs with the file's values, read from the
  daemon's ``--node-config`` (the CLI is not given it); restart once started a copy of
  the running gateway's own settings, so an edit applied only at a daemon restart;
- a node.yaml the checks refuse refuses the restart (exit 1, its file, line and field),
  and the gateway serving goes on serving, the same process;
- the daemon's keeper then restarts a crashed gateway with the settings the restart
  gave it, not with those of its own last look at node.yaml;
- a TLS pair named by a flag stays the flag's; node.yaml names one only for a daemon
  given none (``reread``);
- a gateway SIGKILLed with no daemon to start it again: `gateway status` says so, and
  ``gateway restart`` starts it again (as `systemctl restart` starts a failed unit; it
  said "no gateway runs"); ``gateway stop`` or ``down --gateway`` then makes it a stop,
  which ``gateway restart`` starts again too.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from controller.cli.gateway.gatewayflags import reread
from controller.gateway.settings import Settings

WAIT = 40.0


def test_restart_reads_node_yaml_again_and_refuses_a_bad_one(reconcile: Any, gateway: Any) -> None:
    node = reconcile.tmp / "etc" / "node.yaml"
    node.parent.mkdir()
    node.write_text("logMaxBytes: 4096\nlogMaxFiles: 2\n")
    reconcile.write("alpha")
    g = gateway("--node-config", str(node))
    try:
        g.wait_phase("alpha", "Ready")  # a pass: the daemon's start of its gateway is over
        first = g.serving()
        assert (first.settings["log_max_bytes"], first.settings["log_keep"]) == (4096, 2)
        node.write_text("logMaxBytes: 8192\nlogMaxFiles: 5\n")
        took = reconcile("gateway", "restart", check=0)
        assert f"took it over from pid {first.ref.pid}" in took.out, took
        second = g.serving()
        assert second.ref != first.ref
        assert (second.settings["log_max_bytes"], second.settings["log_keep"]) == (8192, 5)

        # A slip in the file: refused with where it is; the serving gateway is untouched.
        node.write_text("logMaxBytes: 8192\nlogMaxFile: 5\n")
        refused = reconcile("gateway", "restart", check=1)
        assert refused.err.count(f"{node}:2: logMaxFile: unknown setting") == 1, refused
        assert f"pid {second.ref.pid} serves on" in refused.err, refused
        assert g.serving().ref == second.ref
        assert g.request("GET", "/healthz").status == 200

        # The daemon restarts a crash with what the restart gave it, not its own look.
        node.write_text("logMaxBytes: 4096\nlogMaxFiles: 2\n")  # unread: no SIGHUP
        os.kill(second.ref.pid, signal.SIGKILL)
        third = reconcile.wait_for(
            lambda: (s := g.serving_or_none()) is not None and s.ref != second.ref and s,
            timeout=WAIT,
            what="the crashed gateway restarted",
        )
        assert (third.settings["log_max_bytes"], third.settings["log_keep"]) == (8192, 5)
    finally:
        g.finish()


def test_a_pair_named_by_a_flag_stays_node_yaml_names_one_otherwise(tmp_path: Path) -> None:
    (tmp_path / "node.yaml").write_text("tlsCert: n/cert.pem\ntlsKey: n/key.pem\n")
    flags = Path("/etc/flag/cert.pem"), Path("/etc/flag/key.pem")
    given = Settings(
        host="127.0.0.1", port=1, state_dir=tmp_path, tls_cert=flags[0], tls_key=flags[1]
    )
    assert (reread(given).tls_cert, reread(given).tls_key) == flags
    from_file = Settings(host="127.0.0.1", port=1, state_dir=tmp_path, node_tls=True)
    assert reread(from_file).tls_cert == tmp_path / "n" / "cert.pem"
    assert reread(from_file).tls_key == tmp_path / "n" / "key.pem"


def test_restart_starts_a_killed_gateway_no_daemon_watched(reconcile: Any, gateway: Any) -> None:
    reconcile.write("alpha")
    g = gateway()
    g.wait_phase("alpha", "Ready")
    first = g.serving()
    assert g.stop() == 0  # the daemon ends; its gateway serves on
    os.kill(first.ref.pid, signal.SIGKILL)
    reconcile.wait_for(lambda: g.serving_or_none() is None, timeout=WAIT, what="it gone")
    shown = reconcile("gateway", "status", check=1).out
    assert f"pid {first.ref.pid} ({first.address}), ended without stopping" in shown, shown
    took = reconcile("gateway", "restart", check=0)
    assert f"started again: pid {first.ref.pid} had ended without stopping" in took.out, took
    second = g.serving()
    assert second.ref != first.ref and second.port == g.port
    assert g.request("GET", "/healthz").status == 200
    assert g.post("alpha").status == 200
    # Killed again, then `gateway stop`: the crash is forgotten, a stop is in force, and
    # restart starts it again as it starts any stopped one (`systemctl restart`).
    os.kill(second.ref.pid, signal.SIGKILL)
    reconcile.wait_for(lambda: g.serving_or_none() is None, timeout=WAIT, what="it gone")
    reconcile("down", "--gateway", check=0)  # as `gateway stop` does
    shown = reconcile("gateway", "status", check=1).out
    assert "ended without stopping" not in shown and "stopped by `reconcile" in shown, shown
    took = reconcile("gateway", "restart", check=0)
    assert f"pid {second.ref.pid} was stopped by `reconcile gateway stop`" in took.out, took
    assert g.request("GET", "/healthz").status == 200  # (`down` took alpha away too)
    reconcile("down", "--gateway", check=0)
