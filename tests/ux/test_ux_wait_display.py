"""`--once --wait` progress: redrawn in place on a terminal (tmux), one line per change off it."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
import uuid
from typing import Any

import pytest

STARTING = re.compile(r"web\s+Starting\s+\d+s/30s\s+last probe: GET /health -> 503")
READY = re.compile(r"✔ web\s+Ready\s+ready after \d+\.\ds")
ROW = re.compile(r"^[✔…✘] web\s")


def test_progress_is_redrawn_in_place_on_a_terminal(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web", command=rc.demo_command(load_seconds="2"))
    socket = f"ux-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-u", "-L", socket]
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in rc.env.items() if k in ("PATH", "HOME"))
    cli = shlex.join(rc.argv("--once", "--wait", "--timeout", "30s"))
    script = (
        f"cd {shlex.quote(str(rc.tmp))} && env LANG=C.UTF-8 {env} {cli}; echo EXIT=$?; sleep 60"
    )
    subprocess.run([*tmux, "new-session", "-d", "-x", "160", "-y", "40", script], check=True)
    screens: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            screen = subprocess.run(
                [*tmux, "capture-pane", "-p"], capture_output=True, text=True, check=True
            ).stdout
            screens.append(screen)
            if "EXIT=" in screen:
                break
            time.sleep(0.1)
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    final = screens[-1]
    assert "EXIT=0" in final, final
    assert any(STARTING.search(s) for s in screens), "\n---\n".join(screens[-5:])
    assert READY.search(final), final
    assert len([line for line in final.splitlines() if ROW.match(line)]) == 1, final  # in place
    elapsed = [int(m.group(1)) for s in screens for m in re.finditer(r"web\s+Starting\s+(\d+)s", s)]
    assert elapsed == sorted(elapsed) and len(set(elapsed)) >= 2  # the clock ticks between passes
    rc.down()


def test_off_a_terminal_each_change_is_one_log_line(reconcile: Any) -> None:
    rc = reconcile
    rc.write("web", command=rc.demo_command(load_seconds="1"))
    err = rc.converge().err
    progress = [json.loads(line) for line in err.splitlines() if '"event": "progress"' in line]
    seen = [(p["phase"], p.get("probe")) for p in progress if p["deployment"] == "web"]
    assert seen[-1] == ("Ready", None) and seen[0][0] == "Starting"
    assert len(seen) == len(set(seen))  # one line per change, never a repeat
    assert "\x1b[" not in err  # no cursor movement in a log file
    rc.down()


@pytest.fixture(autouse=True)
def _tmux_present() -> None:
    if subprocess.run(["tmux", "-V"], capture_output=True).returncode != 0:  # pragma: no cover
        pytest.fail("tmux is required for the terminal display test")


def test_ctrl_c_during_the_wait_says_the_engines_keep_running(reconcile: Any) -> None:
    """Ctrl-C during `--wait` ended it without a word (issue 34, item 23): the engine it
    started runs on, and the user is told so and what to run next."""
    rc = reconcile
    slow = ["python3", "-c", "import time; time.sleep(600)"]  # never Ready
    rc.write("slow", command=slow, readiness={"tcpSocket": {}, "deadlineSeconds": 600})
    waiting = rc.popen("--once", "--wait", stderr=subprocess.PIPE)
    rc.wait_for(lambda: (rc.record("slow") or {}).get("phase") == "Starting", timeout=60)
    waiting.send_signal(signal.SIGINT)
    _, err = waiting.communicate(timeout=30)
    said = err.decode()
    # 130, or death by SIGINT, which a shell shows as the same 130: CI once saw the
    # latter (the interrupt met at the interpreter's exit; not reproduced in 6 runs here)
    assert waiting.returncode in (130, -signal.SIGINT), (waiting.returncode, said)
    assert "Traceback" not in said, said
    assert "interrupted: the wait stopped, the engines keep running" in said, said
    assert "`reconcile down` stops them" in said
    assert rc.alive(rc.status()["slow"]["pid"])  # as said
    rc.down()
