"""Control characters an engine, a drain's reason or an upstream wrote reach no terminal
as themselves (issue 34, item 11): every view shows them escaped (`\\x1b[2J`, `\\x00`).

`logs` is the one view of an engine's own bytes: into a pipe or a file they go as the
engine wrote them (as `kubectl logs`), on a terminal escaped (as journalctl does).
"""

from __future__ import annotations

import os
import pty
from typing import Any

HOSTILE = "import sys; sys.stdout.write('\\x1b[2J\\x00boom\\u202e\\n'); sys.exit(3)"
RAW = "\x1b[2J\x00boom\u202e"
SHOWN = "\\x1b[2J\\x00boom\\u202e"


def _failed(rc: Any) -> bool:
    rc.once(check=None)
    return (rc.record("hostile") or {}).get("phase") == "Failed"


def _on_a_terminal(rc: Any, *args: str) -> str:
    """What ``reconcile ARGS`` writes to stdout when stdout is a terminal (a pty)."""
    leader, follower = pty.openpty()
    try:
        proc = rc.spawn(rc.argv(*args), stdout=follower)
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the writer is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
        proc.wait(timeout=30)
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    return b"".join(chunks).decode()


def test_no_view_sends_an_engine_s_control_characters_to_a_terminal(reconcile: Any) -> None:
    rc = reconcile
    rc.write(
        "hostile",
        command=["python3", "-c", HOSTILE],
        readiness={"tcpSocket": {}, "deadlineSeconds": 60},
        restartPolicy="Never",
    )
    rc.wait_for(lambda: _failed(rc), timeout=60, what="hostile Failed")
    drained = rc("drain", "--reason", "\x1b[2Jmaintenance", check=0)
    views = {
        "drain": drained,
        "status": rc("status", check=0),
        "status wide": rc("status", "-o", "wide", check=0),
        "describe": rc("describe", "hostile", check=0),
        "events": rc("events", check=0),
        "uncordon": rc("uncordon", check=0),
    }
    for view, result in views.items():
        for text in (result.out, result.err):
            assert "\x1b" not in text and "\x00" not in text and "\u202e" not in text, view
    assert "\\x1b[2Jmaintenance" in drained.out, drained
    assert SHOWN in views["describe"].out, views["describe"]  # the last exit's log lines
    piped = rc("logs", "hostile", check=0).out  # a pipe: the engine's bytes as written
    assert RAW in piped, piped
    shown = _on_a_terminal(rc, "logs", "hostile")  # a terminal: escaped
    assert SHOWN in shown and "\x1b" not in shown and "\x00" not in shown, shown
    rc.down()
