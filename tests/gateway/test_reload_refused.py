"""A reload's refusals are said where an operator looks, until a later reload takes the
file: real daemon, gateway process, key file and node.yaml, and the real CLI.

A SIGHUP whose key file, node.yaml or gateway settings are refused keeps what is in
force; the log said so and nothing else did, so `status` showed an edit as applied.
Now `status` (table and ``-o json``, on stderr: stdout stays a table or a list) and
`reconcile gateway status` (and its ``-o json``) name what was refused, why (file and
line), and since when; the reload that takes the file clears it. A TLS pair refused
at SIGHUP is said the same way (tests/gateway/test_tls.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

WAIT = 40.0


def _keyfile(path: Path, text: str) -> Path:
    path.write_text(text)
    os.chmod(path, 0o600)
    return path


def _said(reconcile: Any, subject: str) -> str | None:
    """Every view's words on ``subject``'s refusal, once all say it; None while one does not."""
    table = reconcile("status", check=0).err
    listed = reconcile("status", "-o", "json", check=0)
    gateway = reconcile("gateway", "status", check=0).out
    if all(f"reload refused ({subject}" in said for said in (table, listed.err, gateway)):
        assert isinstance(listed.json(), list), listed  # stdout: the list, as ever
        return table
    return None


def _cleared(reconcile: Any) -> bool:
    views = (reconcile("status", check=0).err, reconcile("gateway", "status").out)
    return not any(w in said for said in views for w in ("reload refused", "failed (gateway"))


def test_refusals_are_shown_with_where_and_since_then_cleared(reconcile: Any, gateway: Any) -> None:
    keys = _keyfile(reconcile.tmp / "keys.txt", "sk-first\n")
    node = reconcile.state / "node.yaml"
    reconcile.write("alpha")
    g = gateway("--api-keys", str(keys))
    try:
        g.wait_phase("alpha", "Ready")
        assert _cleared(reconcile)

        # A key file with a bad line: the old keys serve on, and every view says so.
        _keyfile(keys, "sk-first\nsk-second rpm=lots\n")
        g.proc.send_signal(signal.SIGHUP)
        table = reconcile.wait_for(
            lambda: _said(reconcile, "API keys"), timeout=WAIT, what="the keys' refusal"
        )
        assert f"{keys}" in table and "line 2" in table and "since " in table, table
        assert "keeps the keys loaded before" in table and "sk-second" not in table, table
        shown = reconcile("gateway", "status", "-o", "json", check=0).json()
        (entry,) = shown["refused"]
        assert entry["subject"] == "API keys" and entry["since"] <= entry["at"], entry
        assert shown["gateways"][0]["role"] == "serving", shown

        # The file fixed and reloaded: said no more.
        _keyfile(keys, "sk-first\nsk-second rpm=60\n")
        g.proc.send_signal(signal.SIGHUP)
        reconcile.wait_for(lambda: _cleared(reconcile), timeout=WAIT, what="keys cleared")

        # A node.yaml the daemon refuses: its file, line and field.
        node.write_text("logMaxBytes: 8192\nlogMaxFile: 5\n")
        g.proc.send_signal(signal.SIGHUP)
        table = reconcile.wait_for(
            lambda: _said(reconcile, "node config"), timeout=WAIT, what="node.yaml's refusal"
        )
        assert f"{node}:2: logMaxFile: unknown setting" in table, table

        # A node.yaml the daemon reads but whose TLS pair the gateway's checks refuse.
        node.write_text("tlsCert: missing-cert.pem\ntlsKey: missing-key.pem\n")
        g.proc.send_signal(signal.SIGHUP)
        table = reconcile.wait_for(
            lambda: _said(reconcile, "gateway settings"), timeout=WAIT, what="the settings'"
        )
        assert "missing-key.pem" in table and "serves on with its own settings" in table
        assert "reload refused (node config" not in table, table  # that one was taken

        node.write_text("logMaxBytes: 8192\n")
        g.proc.send_signal(signal.SIGHUP)
        reconcile.wait_for(lambda: _cleared(reconcile), timeout=WAIT, what="all cleared")
        assert g.post("alpha", {"Authorization": "Bearer sk-second"}).status == 200
    finally:
        g.finish()


def test_a_gateway_the_daemon_cannot_start_again_is_said(reconcile: Any, gateway: Any) -> None:
    """The gateway crashed and its key file is gone: the daemon tries again and again, and
    `gateway status` said only "no gateway runs" (the log alone said why). Now it says
    why and that the daemon tries again, until a start succeeds."""
    keys = _keyfile(reconcile.tmp / "keys.txt", "sk-first\n")
    reconcile.write("alpha")
    g = gateway("--api-keys", str(keys))
    try:
        g.wait_phase("alpha", "Ready")  # a pass: the daemon's start of its gateway is over
        first = g.serving()
        keys.rename(reconcile.tmp / "keys.away")
        os.kill(first.ref.pid, signal.SIGKILL)
        # Gone before `status` looks: a process SIGKILLed still runs while it exits (a
        # loaded box: `gateway status` once saw it serving, 0s old, and exited 0).
        reconcile.wait_for(lambda: not first.alive(), timeout=WAIT, what="the gateway gone")
        said = "failed (gateway start, by daemon pid"
        shown = reconcile.wait_for(
            lambda: (lambda out: out if said in out else "")(
                reconcile("gateway", "status", check=1).out
            ),
            timeout=WAIT,
            what="the failed start shown",
        )
        assert f"--api-keys {keys}: no such file" in shown and "tries again" in shown, shown
        assert said in reconcile("status", check=0).err
        (reconcile.tmp / "keys.away").rename(keys)
        g.proc.send_signal(signal.SIGHUP)  # no need to wait for the back-off
        reconcile.wait_for(lambda: _cleared(reconcile), timeout=WAIT, what="start cleared")
        assert g.serving().ref != first.ref
    finally:
        g.finish()
