"""A gateway's drain waits for the proof that the engine it drains is ours to stop.

An engine whose /proc/PID/environ the daemon's user may not read (not dumpable) cannot be
proven reconcile's: its teardown is refused and its record kept (test_unreadable_engine).
A recreate drained it first: the gateway keeps a drained instance out of its rotation
while its record stays, so every request to the engine that ran on waited for one that
never came. The daemon here runs in a user namespace (`unshare -U`: not root, as
tests/reconciler/test_unreadable_engine.py does it) and adopts an engine its `--once`
started (its own child would be its own, whatever its environment says); the engine
makes itself not dumpable (``PR_SET_DUMPABLE`` 0, what a file capability does at exec).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any

import missing
from procs import alive

if TYPE_CHECKING:
    from conftest import Reconcile

# The demo engine, not dumpable from its start on: only root outside any user namespace
# reads its environment, where the marker that proves it the node's engine is.
NOT_DUMPABLE = (
    "import ctypes, runpy, sys\n"
    "ctypes.CDLL(None).prctl(4, 0)  # PR_SET_DUMPABLE\n"
    "runpy.run_module('controller.demo.engine', run_name='__main__')\n"
)
# In the one user namespace: `--once` (argv[1], JSON) starts the engine, then the daemon
# (the rest) takes this process's place, so the gateway fixture's signals reach it.
ONCE_THEN_DAEMON = (
    "import json, os, subprocess, sys\n"
    "subprocess.run(json.loads(sys.argv[1]), check=True, stdin=subprocess.DEVNULL)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def test_an_engine_whose_stop_is_refused_stays_in_the_rotation(
    reconcile: Reconcile, gateway: Any
) -> None:
    rc = reconcile
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        missing.skip("root and unshare (a user namespace)", "run as root")
    command = [sys.executable, "-c", NOT_DUMPABLE, "--port", "{port}", "--model", "{name}"]
    rc.write("kept", command=command)
    once = json.dumps(rc.argv("--once"))
    g = gateway(prefix=["unshare", "-U", sys.executable, "-c", ONCE_THEN_DAEMON, once], wait=False)
    # Two cold starts (`--once`, then the daemon) before the gateway's: more than its 30 s
    rc.wait_for(lambda: _up(g), timeout=90, what="gateway /healthz")
    before = g.post("kept", timeout=60)  # it waits for the daemon's Ready
    assert before.status == 200, before
    pid = rc.pids("kept")
    assert pid, rc.record("kept")
    ref = (rc.record("kept") or {})["ref"]

    # A recreate, refused: nothing signalled, nothing drained. The engine serves on.
    rc.write("kept", command=command, env={"CHANGED": "1"})
    rc.wait_for(
        lambda: "not stopped: " in ((rc.record("kept") or {}).get("message") or ""),
        timeout=60, what="the recreate refused",
    )  # fmt: skip
    after = g.post("kept", timeout=20)
    assert after.status == 200, (after, g.text()[-3000:])
    kept = rc.record("kept")
    assert kept is not None and kept["ref"] == ref, kept
    assert rc.pids("kept") == pid and all(alive(p) for p in pid), pid

    g.finish()  # root proves it ours: `down --gateway` stops it
    assert not any(alive(p) for p in pid) and rc.record("kept") is None


def _up(g: Any) -> bool:
    assert g.proc.poll() is None, f"daemon exited {g.proc.returncode}:\n{g.text()[-3000:]}"
    try:
        return bool(g.request("GET", "/healthz", timeout=2).status == 200)
    except OSError:
        return False
