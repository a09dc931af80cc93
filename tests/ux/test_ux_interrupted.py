"""Ctrl-C cutting a verb that tears engines down: said at once, and what it left, in words."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# An engine that outlives its SIGTERM (a server finishing long requests): it listens (the
# tcpSocket probe) until the test's release file appears, so `down` waits out its grace.
STUBBORN = """
import os, signal, socket, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
"""

WAIT = 120.0  # seconds: generous for a cold CLI on a box at load 20+


def _default_sigint() -> None:
    # A shell's background job (`cmd &` without job control) ignores SIGINT, and a child
    # inherits that: the Ctrl-C under test must reach Python's own handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _line_with(proc: subprocess.Popen[bytes], text: str, seen: list[bytes]) -> None:
    """Read ``proc``'s stderr until a line holds ``text`` (fails with what it said)."""
    assert proc.stderr is not None
    deadline = time.monotonic() + WAIT
    while not any(text.encode() in line for line in seen):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stderr], [], [], max(left, 0))
        line = proc.stderr.readline() if ready else b""
        assert line, f"no {text!r} in {WAIT}s: {b''.join(seen).decode()}"
        seen.append(line)


def test_ctrl_c_twice_in_down_says_what_it_left_and_the_next_move(
    reconcile: Any, tmp_path: Path
) -> None:
    """A Ctrl-C while `down` waited out an engine's grace period said nothing, and a second
    one exited 130 without a word, the record left Terminating and its engine running. The
    first is answered at once (the teardown under way goes on), the second names what was
    left Terminating and the `down` that finishes it; the next `down` does."""
    rc = reconcile
    release = tmp_path / "release"
    rc.write(
        "slow",
        command=[sys.executable, "-c", STUBBORN, "{port}", str(release)],
        readiness={"tcpSocket": {}, "deadlineSeconds": 60, "periodSeconds": 0.2},
        stopGracePeriodSeconds=600,
    )
    try:
        rc.converge()
        pid = rc.status("slow")["slow"]["pid"]
        down = rc.popen("down", "slow", stderr=subprocess.PIPE, preexec_fn=_default_sigint)
        rc.wait_for(lambda: (rc.record("slow") or {}).get("phase") == "Terminating", WAIT)
        seen: list[bytes] = []
        down.send_signal(signal.SIGINT)
        _line_with(down, "finishing the teardown under way of slow", seen)
        down.send_signal(signal.SIGINT)
        _, rest = down.communicate(timeout=WAIT)
        said = (b"".join(seen) + rest).decode()
        assert down.returncode == 130, said
        assert "Traceback" not in said and "Exception ignored" not in said, said
        last = said.strip().splitlines()[-1]
        assert last.startswith("reconcile: interrupted: the teardown of slow was cut"), said
        assert "`reconcile down slow`" in last, said
        assert (rc.record("slow") or {}).get("phase") == "Terminating"
        os.kill(pid, 0)  # its engine runs on, as the line says it may
        release.touch()  # the engine may end now: the next `down` finishes the teardown
        assert rc.down("slow").out.strip() == "stopped slow"
        assert rc.record("slow") is None
    finally:
        release.touch()  # the engine ends now, whatever failed: nothing outlives the test


def _stopped(pid: int) -> bool:
    """The process is frozen (a failpoint's SIGSTOP): its state in /proc is T."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


def test_ctrl_c_mid_pass_says_the_next_once_finishes_it(reconcile: Any) -> None:
    """`--once` cut by Ctrl-C right after it started an engine exited 130 without a word;
    it says the pass stopped where it was, and the next `--once` takes the engine up."""
    rc = reconcile
    rc.write("web")
    env = {**rc.env, "RECONCILE_FAILPOINTS": "executor.spawn.after_record=stop"}
    cut = rc.popen("--once", stderr=subprocess.PIPE, env=env, preexec_fn=_default_sigint)
    try:
        rc.wait_for(lambda: _stopped(cut.pid), WAIT, "the pass held after the record")
        cut.send_signal(signal.SIGINT)  # pending while it is stopped: raised as it goes on
    finally:
        cut.send_signal(signal.SIGCONT)
    try:
        _, err = cut.communicate(timeout=WAIT)
        said = err.decode()
        assert cut.returncode == 130, said
        assert "Traceback" not in said and "Exception ignored" not in said, said
        last = (said.strip().splitlines() or [""])[-1]
        assert last.startswith("reconcile: interrupted: the pass stopped"), said
        pid = rc.status("web")["web"]["pid"]
        os.kill(pid, 0)  # the engine it started runs on, with its record
        rc.once()  # the next pass finishes it: exit 0, the engine Ready at last
        rc.converge()
        assert rc.status("web")["web"]["pid"] == pid  # taken up, not started again
    finally:
        rc.down()  # the engine the pass started, whatever failed
