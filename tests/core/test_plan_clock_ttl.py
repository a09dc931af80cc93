"""Wall-clock steps against a drain's ``--ttl`` and an OnDemand ``idleTimeout``, table-driven
(docs/design.md, "Clock steps").

Both count from an event written to a file (the drain, the gateway's activation) with its
wall-clock time and a reading of the boot clock. A pass observes the boot clock too
(``Observed.boot``); in the same boot it alone decides, so an hour's step either way
moves neither. Another boot: at least this boot's uptime has passed. No stamp (an old
file): the wall clock, as before.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from strategies import NOW, desired, entry, inventory, observed, record, view

from controller.core.actions import Park, Start
from controller.core.elapsed import BootClock
from controller.core.plan import plan
from controller.core.state import Activation, Drain, Phase
from controller.daemon.loop import SLACK, _idle_due

HOUR = timedelta(hours=1)
TTL = 60.0  # seconds: the drain's ttl and the idleTimeout of every case here
ASKED = 1000.0  # the boot clock (seconds since boot) when the drain or request was written
GPUS = inventory("nvidia:0")
ASKED_STAMP = BootClock(boot_id="boot-1", seconds=ASKED)
ON_DEMAND = entry("a", activation="OnDemand", idleTimeout="60s")


def boot(seconds: float, boot_id: str = "boot-1") -> BootClock:
    return BootClock(boot_id=boot_id, seconds=seconds)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


# -- drain --ttl -------------------------------------------------------------------------


def drain(asked_at: datetime, stamp: BootClock | None = ASKED_STAMP) -> Drain:
    """``reconcile drain --ttl 60s`` asked at ``asked_at`` on the wall clock."""
    return Drain.asked(asked_at, TTL, stamp, reason="kernel update", by="ops")


def drained(d: Drain, clock: BootClock | None) -> bool:
    """Does a pass with this drain and boot clock hold a start back?"""
    actions = plan(desired(entry("a")), observed(drain=d, boot=clock), GPUS, NOW)
    return Start not in [type(a) for a in actions]


# (the drain, the boot clock at the pass, still drained?)
DRAINS = [
    pytest.param(drain(NOW - s(30)), boot(ASKED + 30), True, id="no-step-30s-in-drained"),
    pytest.param(drain(NOW - s(61)), boot(ASKED + 61), False, id="no-step-61s-in-over"),
    pytest.param(drain(NOW + HOUR - s(61)), boot(ASKED + 61), False, id="back-step-61s-in-over"),
    pytest.param(drain(NOW + HOUR - s(30)), boot(ASKED + 30), True, id="back-step-30s-in-drained"),
    pytest.param(
        drain(NOW - HOUR - s(30)), boot(ASKED + 30), True, id="forward-step-30s-in-drained"
    ),
    pytest.param(drain(NOW - HOUR - s(61)), boot(ASKED + 61), False, id="forward-step-61s-in-over"),
    pytest.param(
        drain(NOW + HOUR, boot(ASKED, "boot-0")),
        boot(TTL + 1),
        False,
        id="other-boot-back-step-over-after-ttl-of-uptime",
    ),
    pytest.param(
        drain(NOW - s(10), boot(ASKED, "boot-0")),
        boot(5.0),
        True,
        id="other-boot-10s-ago-by-the-wall-clock-drained",
    ),
    pytest.param(
        drain(NOW - s(61), boot(ASKED, "boot-0")),
        boot(5.0),
        False,
        id="other-boot-61s-ago-by-the-wall-clock-over",
    ),
    pytest.param(
        Drain(until=NOW + HOUR), boot(ASKED), True, id="old-file-no-ttl-wall-clock-drained"
    ),
    pytest.param(Drain(until=NOW - s(1)), boot(ASKED), False, id="old-file-no-ttl-wall-clock-over"),
    pytest.param(drain(NOW - s(61), None), None, False, id="no-boot-clock-wall-clock-over"),
    pytest.param(drain(NOW + HOUR, None), None, True, id="no-boot-clock-future-stamp-drained"),
]


@pytest.mark.parametrize(("d", "clock", "expected"), DRAINS)
def test_a_drain_lasts_its_ttl_on_the_boot_clock(
    d: Drain, clock: BootClock | None, expected: bool
) -> None:
    assert drained(d, clock) is expected
    assert d.active(NOW, clock) is expected


@pytest.mark.parametrize(
    ("d", "clock"),
    [
        pytest.param(drain(NOW + HOUR - s(20)), boot(ASKED + 20), id="back-step"),
        pytest.param(drain(NOW - HOUR - s(20)), boot(ASKED + 20), id="forward-step"),
    ],
)
def test_a_drain_says_it_ends_when_the_boot_clock_ends_it(d: Drain, clock: BootClock) -> None:
    """Status and the plan's message show the end on today's wall clock, not ``until``."""
    assert d.ends(NOW, clock) == NOW + s(TTL - 20)
    actions = plan(desired(entry("a")), observed(drain=d, boot=clock), GPUS, NOW)
    assert any("until 2026-01-01 12:00:40" in a.reason for a in actions), actions


def test_a_drain_never_lasts_longer_than_its_ttl_from_now() -> None:
    """Whatever the stamps say (a step back with no boot clock to tell it)."""
    for d, clock in [(drain(NOW + HOUR, None), None), (drain(NOW + HOUR), boot(0.0, "boot-9"))]:
        assert d.ends(NOW, clock) <= NOW + s(TTL)


@pytest.mark.parametrize("skew", [0.0, 0.25, 0.5, 0.8, -0.5])
def test_a_drain_s_end_reads_the_same_whatever_the_skew_between_its_two_clocks(
    skew: float,
) -> None:
    """A pass reads the boot clock, then the wall clock: on a busy host a second can pass
    between them, and the end, computed from both, moved by it. Asked at 11:59:40.3 for
    60 s, it ends 12:00:40 whatever the skew: the message held a record's words; read
    12:00:41 on one pass and 12:00:40 on the next, it rewrote them (CI: FLAKY
    tests/ux/test_ux_drain.py::test_a_spec_change_on_a_drained_node_waits_and_the_engine_serves_on
    at load 14). A step of a second or more still moves it (the tests above)."""
    d = drain(NOW - s(19.7))
    clock = boot(ASKED + 19.7 - skew)  # read `skew` s before the wall clock's NOW
    assert d.ends(NOW, clock) == d.until == NOW + s(40.3)
    assert "until 2026-01-01 12:00:40 UTC (kernel update)" in d.said(NOW, clock)


# -- idleTimeout -------------------------------------------------------------------------


def request(at: datetime, stamp: BootClock | None = ASKED_STAMP) -> Activation:
    """The gateway's activation: the last request at ``at`` on the wall clock."""
    return Activation(last_request_at=at, boot=stamp)


def parked(act: Activation, clock: BootClock | None) -> bool:
    rec = record("a", spec=ON_DEMAND, phase=Phase.READY)
    want = desired(ON_DEMAND, activations={"a": act})
    actions = plan(want, observed(view(rec, alive=True), boot=clock), GPUS, NOW)
    return Park in [type(a) for a in actions]


# (the activation, the boot clock at the pass, parked?)
IDLES = [
    pytest.param(request(NOW - s(5)), boot(ASKED + 5), False, id="no-step-5s-idle-kept"),
    pytest.param(request(NOW - s(60)), boot(ASKED + 60), True, id="no-step-60s-idle-parked"),
    pytest.param(
        request(NOW - HOUR - s(5)), boot(ASKED + 5), False, id="forward-step-5s-idle-kept"
    ),
    pytest.param(
        request(NOW - HOUR - s(61)), boot(ASKED + 61), True, id="forward-step-61s-idle-parked"
    ),
    pytest.param(
        request(NOW + HOUR - s(61)), boot(ASKED + 61), True, id="back-step-61s-idle-parked"
    ),
    pytest.param(request(NOW + HOUR - s(5)), boot(ASKED + 5), False, id="back-step-5s-idle-kept"),
    pytest.param(
        request(NOW + HOUR, boot(ASKED, "boot-0")),
        boot(TTL),
        True,
        id="other-boot-back-step-parked-after-idle-timeout-of-uptime",
    ),
    pytest.param(
        request(NOW - s(5), boot(ASKED, "boot-0")),
        boot(3.0),
        False,
        id="other-boot-5s-ago-by-the-wall-clock-kept",
    ),
    pytest.param(request(NOW - s(61), None), boot(ASKED), True, id="old-file-wall-clock-parked"),
    pytest.param(request(NOW - s(5), None), boot(ASKED), False, id="old-file-wall-clock-kept"),
]


@pytest.mark.parametrize(("act", "clock", "expected"), IDLES)
def test_idle_timeout_counts_on_the_boot_clock(
    act: Activation, clock: BootClock | None, expected: bool
) -> None:
    assert parked(act, clock) is expected


def test_a_swap_takes_the_least_recently_used_by_the_boot_clock() -> None:
    """``b``'s request came later by the boot clock, though the wall clock went back an hour
    between them (its wall-clock time is the earlier): ``a`` is swapped out, not ``b``."""
    gpu: dict[str, Any] = {"activation": "OnDemand", "idleTimeout": "1h", "devices": {"count": 1}}
    a_entry, b_entry, c_entry = entry("a", **gpu), entry("b", **gpu), entry("c", **gpu)
    a = record("a", spec=a_entry, devices=("nvidia:0",), port=8000)
    b = record("b", spec=b_entry, devices=("nvidia:1",), port=8001)
    acts = {
        "a": request(NOW - s(20), boot(ASKED)),
        "b": request(NOW - HOUR, boot(ASKED + 10)),
        "c": request(NOW, boot(ASKED + 30)),
    }
    seen = observed(view(a, alive=True), view(b, alive=True), boot=boot(ASKED + 30))
    want = desired(a_entry, b_entry, c_entry, activations=acts)
    actions = plan(want, seen, inventory("nvidia:0", "nvidia:1"), NOW)
    assert [(type(x), x.name) for x in actions if isinstance(x, Park)] == [(Park, "a")], actions


@pytest.mark.parametrize(
    ("at", "clock", "left"),
    [
        pytest.param(NOW - HOUR - s(20), boot(ASKED + 20), TTL - 20, id="forward-step"),
        pytest.param(NOW + HOUR - s(20), boot(ASKED + 20), TTL - 20, id="back-step"),
    ],
)
def test_the_daemon_wakes_for_idle_timeout_by_the_boot_clock(
    at: datetime, clock: BootClock, left: float
) -> None:
    rec = record("a", spec=ON_DEMAND, phase=Phase.READY)
    due = _idle_due(rec, {"a": request(at)}, NOW, clock)
    assert due is not None and due[0] == "idle timeout", due
    assert due[1] == pytest.approx(left + SLACK), due


@pytest.mark.parametrize(
    "demand",
    [
        pytest.param({"a": request(NOW + HOUR - s(70))}, id="back-step-over"),
        pytest.param({}, id="no-demand"),
    ],
)
def test_no_idle_timer_once_the_pass_that_began_then_had_its_park(
    demand: dict[str, Activation],
) -> None:
    """The pass that began at NOW (its boot clock ASKED + 70) planned the park: a record
    it left holding is held (a broken manifest keeps it), and a timer at once looped
    (tests/gateway/test_idle.py, on-demand-held)."""
    rec = record("a", spec=ON_DEMAND, phase=Phase.READY)
    assert _idle_due(rec, demand, NOW, boot(ASKED + 70)) is None
