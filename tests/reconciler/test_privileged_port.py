"""A port this user may never bind (`port: 80`, reconcile not root) is no crash loop.

The engine was started on it, died of "Permission denied", was restarted on it, and
`--once` even exited 0 the first time (an engine with no readiness probe is Ready at its
spawn). The lease now probes it: Pending, saying why and what to give instead, nothing
started. A user namespace (`unshare -U`) makes an unprivileged reconcile out of root's
test run: in it, a bind below the unprivileged range is refused in the host's network.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import yaml
from procs import kill_marked, marked_pids, unprivileged


def _unprivileged_start() -> int:
    start = int(Path("/proc/sys/net/ipv4/ip_unprivileged_port_start").read_text())
    assert start > 1, f"every port is unprivileged here (ip_unprivileged_port_start={start})"
    return start


def _reconcile(*args: str, state: Path, node: str) -> subprocess.CompletedProcess[str]:
    return unprivileged(*args, "--state-dir", str(state), "--node", node, "--devices", "")


def test_a_privileged_port_is_pending_not_a_crash_loop(tmp_path: Path) -> None:
    port = _unprivileged_start() - 1
    manifests, state = tmp_path / "manifests", tmp_path / "state"
    manifests.mkdir()
    doc = {
        "apiVersion": "reconcile/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"engine": "command", "command": [sys.executable, "-m", "http.server",
                 "{port}", "--bind", "127.0.0.1"], "port": port},
    }  # fmt: skip
    (manifests / "web.yaml").write_text(yaml.safe_dump(doc))
    node = f"t-{uuid.uuid4().hex[:12]}"
    planned = _reconcile("plan", "-f", str(manifests), state=state, node=node)
    assert planned.returncode == 1, planned  # as `--once` would: not 2, "a change"
    assert f"error: web: port {port} is below {port + 1}" in planned.stdout, planned
    try:
        for _ in range(2):  # the second pass says it again (the journal once), starts nothing
            once = _reconcile("--once", "-f", str(manifests), state=state, node=node)
            assert once.returncode == 1, once
            assert f"port {port} is below {port + 1} (net.ipv4.ip_unprivileged_port_start)" in (
                once.stderr
            ), once.stderr
            assert "CAP_NET_BIND_SERVICE" in once.stderr and "Traceback" not in once.stderr
            assert not marked_pids(f"{node}/"), "an engine was started on a port it cannot bind"
        status = _reconcile("status", "-o", "json", state=state, node=node)
        (web,) = json.loads(status.stdout)
        assert web["phase"] == "Pending" and web["restarts"] == 0, web
        assert f"give a port from {port + 1} up" in web["message"], web
        journal = _reconcile("events", "-o", "json", state=state, node=node).stdout
        said = [json.loads(line) for line in journal.splitlines()]
        assert len(said) == 1 and f"port {port} is below" in said[0].get("error", ""), said
    finally:
        kill_marked(f"{node}/")
