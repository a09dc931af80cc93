"""Spawn notes (``<state>/spawnnotes/<nonce>.json``) are removed where their engine ends.

A note is written at every spawn; one whose process is gone is nothing, and a teardown
removes it (``LocalBackend.sweep``). An engine that crashes once an hour for weeks is
restarted hundreds of times: the folder must hold one note per engine that runs (and at
most one more, of an engine a pass has not yet seen gone), never one per spawn.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from procs import wait_gone

if TYPE_CHECKING:
    from conftest import Reconcile

READY = {"periodSeconds": 0.2}  # no probe: Ready once spawned
CRASHES = 4


def notes(rc: Reconcile) -> set[str]:
    """The nonces the state dir has a spawn note of."""
    return {p.stem for p in (rc.state / "spawnnotes").glob("*.json")}


def nonces(rc: Reconcile, *names: str) -> set[str]:
    """The nonces of the named deployments' records (those that have one)."""
    return {rec["nonce"] for name in names if (rec := rc.record(name)) is not None}


def ready_an_hour(rc: Reconcile, name: str) -> None:
    """``name``'s record says Ready since an hour ago (wall clock alone): its next crash
    counts as the first (restarted at once, no back-off), as one an hour apart does."""
    path = rc.record_path(name)
    rec = json.loads(path.read_text())
    then = datetime.now(UTC) - timedelta(hours=1)
    rec |= {"ready_at": then.isoformat(), "ready_boot": None}
    path.write_text(json.dumps(rec))


def test_restarts_of_a_crashing_engine_leave_one_note_per_live_engine(
    reconcile: Reconcile,
) -> None:
    rc = reconcile
    rc.write("crashy", command=["sleep", "600"], readiness=READY)
    rc.write("steady", command=["sleep", "600"], readiness=READY, basePort=rc.port + 4)
    rc.once()
    assert notes(rc) == nonces(rc, "crashy", "steady") and len(notes(rc)) == 2
    spawned = set(notes(rc))
    for crash in range(CRASHES):
        rec = rc.record("crashy")
        assert rec is not None and rec["phase"] == "Ready", rec
        ready_an_hour(rc, "crashy")
        os.kill(rec["ref"]["pid"], signal.SIGKILL)
        wait_gone(rec["ref"]["pid"])
        assert notes(rc) == spawned  # its note stays until a pass sees it gone
        rc.once()
        after = rc.record("crashy")
        assert after is not None and after["restarts"] == 1, (crash, after)
        assert after["nonce"] != rec["nonce"], after  # a new engine, a new note
        assert notes(rc) == nonces(rc, "crashy", "steady"), (crash, notes(rc))
        spawned = notes(rc)

    # A stop (its manifest gone) and `down` remove theirs too.
    (rc.manifests / "steady.yaml").unlink()
    rc.once()
    assert rc.record("steady") is None and notes(rc) == nonces(rc, "crashy"), notes(rc)
    rc.down()
    assert rc.record("crashy") is None and notes(rc) == set()
