"""An OnDemand engine's idleTimeout counts on the boot clock: a real daemon and gateway
whose wall clock steps an hour forward (libfaketime) right after a request park nothing
early; the engine parks its idleTimeout after that request, as it would unstepped. And a
step back after the park does not keep the next request from waking it, though that
request's wall time is before the park's (docs/design.md, "Clock steps")."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import faketime
import pytest

# seconds: the engine's idleTimeout. It must hold the span from the request to the witness
# Ready (the passes on the stepped clock): no CLI runs in it, ~1.3 s at load 6 (two busy
# loops beside other suites); 30 s was waited out for nothing but that room.
IDLE = 10.0


@pytest.fixture(scope="module")
def preload(tmp_path_factory: pytest.TempPathFactory) -> str:
    return faketime.preload(tmp_path_factory.mktemp("faketime"))


def test_a_forward_step_parks_no_on_demand_engine(
    reconcile: Any, gateway: Any, preload: str
) -> None:
    clock = reconcile.tmp / "clock"
    reconcile.env.update(faketime.env(preload, clock))  # the daemon, its gateway, the CLI
    reconcile.write("lazy", activation="OnDemand", idleTimeout=f"{IDLE:g}s")
    g = gateway()
    g.wait_phase("lazy", "Idle")
    assert g.post("lazy").status == 200
    answered = time.monotonic()
    g.wait_phase("lazy", "Ready", timeout=10)
    before = reconcile.record("lazy")
    clock.write_text("+1h\n")
    reconcile.write("witness")  # Ready once the daemon has run passes on the new clock
    g.wait_phase("witness", "Ready")
    assert time.monotonic() - answered < IDLE  # the passes came within its idleTimeout
    lazy, witness = reconcile.record("lazy"), reconcile.record("witness")
    assert lazy is not None and witness is not None and before is not None
    assert lazy["phase"] == "Ready", lazy
    assert lazy["ref"] == before["ref"], (lazy, before)  # the same engine, never parked
    stepped = _at(witness["started_at"]) - _at(lazy["started_at"])
    assert stepped > timedelta(minutes=50), stepped  # the step took

    # Parked its idleTimeout after the request by the boot clock: the daemon's timer too.
    g.wait_phase("lazy", "Idle", timeout=IDLE + 30)
    assert time.monotonic() - answered >= IDLE - 1  # the request ended just before `answered`
    g.finish()


def test_a_request_after_a_step_back_wakes_a_parked_engine(
    reconcile: Any, gateway: Any, preload: str
) -> None:
    clock = reconcile.tmp / "clock"
    reconcile.env.update(faketime.env(preload, clock))
    reconcile.write("lazy", activation="OnDemand", idleTimeout="2s")
    g = gateway()
    g.wait_phase("lazy", "Idle")
    # An engine answering is the wake; its Ready lasts only the 2 s idleTimeout after the
    # request, shorter than a status poll (a CLI run) on a loaded box: wait for what stays.
    assert g.post("lazy").status == 200
    g.wait_phase("lazy", "Idle", timeout=30)  # parked 2 s after the request
    parked = reconcile.record("lazy")
    assert parked is not None and parked["idle_boot"] is not None, parked
    assert len(_starts(reconcile)) == 1
    clock.write_text("-1h\n")
    # Its wall time is an hour before the park's: by the boot clock it came after.
    assert g.post("lazy").status == 200
    woken = reconcile.wait_for(lambda: _starts(reconcile)[1:], what="a second start")[0]
    assert _at(woken["time"]) < _at(parked["idle_since"]), (woken, parked)  # the step
    g.finish()


def _starts(reconcile: Any) -> list[dict[str, Any]]:
    return [e for e in reconcile.events("lazy") if e.get("action") == "start"]


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)
