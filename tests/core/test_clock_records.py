"""Wall-clock steps against the times a record and the autoscaler keep, table-driven
(docs/design.md, "Clock steps").

A record keeps the boot clock beside ``idle_since`` (the park) and ``ready_at`` (version
3). So an hour's step back neither keeps a parked engine from waking on the next request
(its wall time is before the park's) nor keeps a crash of an engine Ready for 10 minutes
from counting as the first. A version-2 record has no such stamp: the wall clock decides,
as it did. The autoscaler keeps wall-clock times only: a time of its own "in the future" is
one the clock went back past, and counts as now.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from strategies import NOW, desired, entry, inventory, observed, record, view

from controller.core.actions import Fail, Start
from controller.core.elapsed import BootClock, later
from controller.core.manifest.specs import Autoscale
from controller.core.plan import BACKOFF_RESET, plan
from controller.core.scaling.autoscale import Load, Scale, decide
from controller.core.state import Activation, Phase
from controller.reconciler.autoscaling import _waits
from controller.store.instances import recordjson
from controller.store.instances.records import RecordStore

HOUR = timedelta(hours=1)
PARKED = 1000.0  # the boot clock (seconds since boot) when the engine parked
ON_DEMAND = entry("a", activation="OnDemand", idleTimeout="60s")


def boot(seconds: float, boot_id: str = "boot-1") -> BootClock:
    return BootClock(boot_id=boot_id, seconds=seconds)


def s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


# -- later: which of two stamped events came after -------------------------------------

# (event, its stamp, the other, its stamp, the boot clock now, the first is later?)
LATER = [
    pytest.param(NOW, boot(20), NOW + HOUR, boot(10), boot(30), True, id="same-boot-boot-clock"),
    pytest.param(NOW, boot(10), NOW - HOUR, boot(20), boot(30), False, id="same-boot-earlier"),
    pytest.param(NOW, boot(5), NOW + HOUR, boot(9, "b0"), boot(30), True, id="this-boot-is-later"),
    pytest.param(NOW + HOUR, boot(9, "b0"), NOW, boot(5), boot(30), False, id="other-boot-before"),
    pytest.param(NOW, boot(5, "b0"), NOW - HOUR, boot(9, "b9"), boot(30), True, id="two-old-wall"),
    pytest.param(NOW, None, NOW - s(1), boot(9), boot(30), True, id="no-stamp-wall-later"),
    pytest.param(NOW, boot(20), NOW + s(1), None, boot(30), False, id="no-stamp-wall-earlier"),
    pytest.param(NOW, boot(20), NOW, boot(20), boot(30), False, id="the-same-moment-not-later"),
]


@pytest.mark.parametrize(("at", "stamp", "than", "than_stamp", "clock", "expected"), LATER)
def test_later_orders_two_events_by_the_boot_clock_where_both_have_it(
    at: datetime,
    stamp: BootClock | None,
    than: datetime,
    than_stamp: BootClock | None,
    clock: BootClock,
    expected: bool,
) -> None:
    assert later(at, stamp, than, than_stamp, clock) is expected


# -- an OnDemand engine parked, then a request ------------------------------------------


def starts(idle_since: datetime, idle_boot: BootClock | None, act: Activation) -> bool:
    """Does a pass start the parked engine for this activation?"""
    rec = record("a", spec=ON_DEMAND, phase=Phase.IDLE, idle_since=idle_since, idle_boot=idle_boot)
    want = desired(ON_DEMAND, activations={"a": act})
    actions = plan(want, observed(view(rec), boot=boot(PARKED + 30)), inventory(), NOW)
    return Start in [type(a) for a in actions]


def asked(at: datetime, stamp: BootClock | None) -> Activation:
    return Activation(last_request_at=at, boot=stamp)


# (the park's wall time and stamp, the request's, starts?)
WAKES = [
    pytest.param(
        NOW + HOUR - s(20),
        boot(PARKED),
        asked(NOW, boot(PARKED + 30)),
        True,
        id="back-step-request-after-the-park-wakes",
    ),
    pytest.param(
        NOW + HOUR - s(20),
        boot(PARKED),
        asked(NOW + HOUR - s(40), boot(PARKED - 20)),
        False,
        id="back-step-the-request-before-the-park-does-not",
    ),
    pytest.param(
        NOW - HOUR - s(20),
        boot(PARKED),
        asked(NOW - HOUR - s(40), boot(PARKED - 20)),
        False,
        id="forward-step-the-request-before-the-park-does-not",
    ),
    pytest.param(
        NOW - s(20), boot(PARKED), asked(NOW, boot(PARKED + 30)), True, id="no-step-wakes"
    ),
    pytest.param(
        NOW + HOUR - s(20),
        None,
        asked(NOW, boot(PARKED + 30)),
        False,
        id="version-2-record-back-step-wall-clock-as-before",
    ),
    pytest.param(
        NOW - s(20), None, asked(NOW, boot(PARKED + 30)), True, id="version-2-record-no-step"
    ),
]


@pytest.mark.parametrize(("idle_since", "idle_boot", "act", "expected"), WAKES)
def test_a_request_after_the_park_wakes_it_by_the_boot_clock(
    idle_since: datetime, idle_boot: BootClock | None, act: Activation, expected: bool
) -> None:
    assert starts(idle_since, idle_boot, act) is expected


# -- the back-off's reset after 10 minutes Ready -----------------------------------------


def restarts_after_crash(ready_at: datetime, ready_boot: BootClock | None, clock: BootClock) -> int:
    """The restart count a crash now is given (5 restarts before it)."""
    rec = record("a", restarts=5, ready_at=ready_at, ready_boot=ready_boot)
    (fail,) = plan(desired(entry("a")), observed(view(rec), boot=clock), inventory(), NOW)
    assert isinstance(fail, Fail) and fail.phase is Phase.BACKOFF, fail
    return fail.restarts


READY = 5000.0  # the boot clock when it became Ready
RESETS = [
    pytest.param(
        NOW + HOUR - s(BACKOFF_RESET),
        boot(READY),
        boot(READY + BACKOFF_RESET),
        0,
        id="back-step-10min-ready-resets",
    ),
    pytest.param(
        NOW - HOUR - s(30), boot(READY), boot(READY + 30), 5, id="forward-step-30s-ready-keeps"
    ),
    pytest.param(
        NOW - s(BACKOFF_RESET), boot(READY), boot(READY + BACKOFF_RESET), 0, id="no-step-resets"
    ),
    pytest.param(
        NOW + HOUR - s(BACKOFF_RESET),
        None,
        boot(READY + BACKOFF_RESET),
        5,
        id="version-2-record-back-step-wall-clock-as-before",
    ),
]


@pytest.mark.parametrize(("ready_at", "ready_boot", "clock", "expected"), RESETS)
def test_the_backoff_resets_after_ten_minutes_ready_by_the_boot_clock(
    ready_at: datetime, ready_boot: BootClock | None, clock: BootClock, expected: int
) -> None:
    assert restarts_after_crash(ready_at, ready_boot, clock) == expected


# -- the records: version 3 keeps the stamps, version 2 is still read ------------------


def test_a_record_keeps_its_boot_stamps_and_a_version_2_file_reads_without(
    tmp_path: Path,
) -> None:
    store = RecordStore(tmp_path)
    store.ensure()
    rec = record("a", ready_at=NOW, ready_boot=boot(READY), idle_since=NOW, idle_boot=boot(1.5))
    store.write(rec)
    written = json.loads(store.path("a").read_text())
    assert written["version"] == 3
    assert written["idle_boot"] == {"boot_id": "boot-1", "seconds": 1.5}
    assert store.read("a") == rec
    old = {k: v for k, v in written.items() if k not in ("idle_boot", "ready_boot")}
    store.path("a").write_text(json.dumps({**old, "version": 2}))
    upgraded = store.read("a")
    assert upgraded is not None and upgraded.idle_boot is None and upgraded.ready_boot is None
    assert upgraded.idle_since == NOW and upgraded.version == 3


def test_a_version_2_file_with_a_boot_stamp_was_not_written_by_version_2() -> None:
    doc = json.loads(recordjson.to_json(record("a", idle_boot=boot(1.0))))
    del doc["ready_boot"]
    with pytest.raises(recordjson.RecordInvalid, match="idle_boot: unknown field"):
        recordjson.from_json(json.dumps({**doc, "version": 2}))
    doc["idle_boot"] = {"boot_id": "boot-1", "seconds": "soon"}
    with pytest.raises(recordjson.RecordInvalid, match=r"idle_boot.seconds: should be float"):
        recordjson.from_json(json.dumps(doc))


# -- the autoscaler's times --------------------------------------------------------------

POLICY = Autoscale(min=1, max=4, targetInflight=4, scaleDownDelay=60)
T = 1_000_000.0  # Unix seconds: the autoscaler's `now`


def test_a_scale_down_delay_begun_before_a_step_back_starts_again_not_an_hour_later() -> None:
    low = Scale(count=3, low_since=T + 3600 - 30, low_wants=2)  # 30 s in, then an hour back
    again = decide(POLICY, low, Load(average=1.0, recent=1.0), 3, T)
    assert again.change is None and again.scale.low_since == T and again.scale.low_wants == 2
    end = decide(POLICY, again.scale, Load(average=1.0, recent=1.0), 3, T + 60)
    assert end.scale.count == 2, end  # scaleDownDelay after the step, to the most asked


def _at(unix: float) -> datetime:
    return datetime.fromtimestamp(unix, UTC)


# (when it went to zero, the activation, wakes?)
ZERO_WAKES = [
    pytest.param(T - 100, asked(_at(T - 2), None), True, id="no-step-a-request-since-wakes"),
    pytest.param(T + 3600, asked(_at(T - 2), None), True, id="back-step-a-new-request-wakes"),
    pytest.param(
        T + 3600, asked(_at(T + 3590), None), False, id="back-step-the-request-before-does-not"
    ),
    pytest.param(T - 100, asked(_at(T - 200), None), False, id="no-step-the-one-before-does-not"),
    pytest.param(T + 3600, asked(_at(T - 60), None), False, id="back-step-an-old-request-does-not"),
]


@pytest.mark.parametrize(("changed_at", "act", "expected"), ZERO_WAKES)
def test_a_request_wakes_a_deployment_at_zero_after_a_step_back(
    changed_at: float, act: Activation, expected: bool
) -> None:
    assert _waits(act, Scale(count=0, changed_at=changed_at), T) is expected
