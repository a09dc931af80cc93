"""The planner's health rules: liveness failures in a row restart a Ready engine (never
twice during a back-off), and memory-packed engines start one at a time per device.

Each case is (desired, observed) -> the exact actions; the liveness answers and the
failures counted so far come in as observations and record facts (no clock, no I/O).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    GI,
    NOW,
    OTHER,
    Scenario,
    desired,
    entry,
    inventory,
    memory_scenarios,
    observed,
    record,
    ref,
    view,
)

from controller.core.actions import AnyAction, Fail, Hold, Probed, Restart, Start, Stop
from controller.core.devices.inventory import parse_static
from controller.core.manifest.specs import Entry
from controller.core.plan import plan
from controller.core.planner.turns import TURN
from controller.core.render import render
from controller.core.state import Drain, Phase, ProbeConfig, ProbeResult, Record, RecordView
from controller.daemon.loop import _next_due
from controller.errors import RecipeError

LIVE = ProbeConfig(http=(("/health", None),), period_seconds=1, failure_threshold=3)
FAILED = ProbeResult(False, "GET /health: no answer within 5s")
PASSED = ProbeResult(True, "GET /health -> 2xx")
WEB = entry("web")


def ready(failures: int = 0, **fields: Any) -> Record:
    return record("web", spec=WEB, liveness=LIVE, liveness_failures=failures, **fields)


def judged(
    rec: Record, answer: ProbeResult | tuple[ProbeResult, ...] | None, **seen: Any
) -> list[AnyAction]:
    answers = answer if isinstance(answer, tuple) else () if answer is None else (answer,)
    views = observed(view(rec, alive=rec.phase is not Phase.BACKOFF, liveness=answers), **seen)
    return list(plan(desired(WEB), views, inventory(), NOW))


def shape(actions: list[AnyAction]) -> list[tuple[str, str]]:
    return [(type(a).__name__, a.reason) for a in actions]


# -- liveness ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rec", "answer", "expect"),
    [
        pytest.param(
            ready(0),
            FAILED,
            [
                (
                    "Probed",
                    "liveness probe failed (1 of 3 in a row): GET /health: no answer within 5s",
                )
            ],
            id="a-first-failure-is-counted-not-acted-on",
        ),
        pytest.param(
            ready(1),
            FAILED,
            [
                (
                    "Probed",
                    "liveness probe failed (2 of 3 in a row): GET /health: no answer within 5s",
                )
            ],
            id="a-second-failure-is-counted",
        ),
        pytest.param(
            ready(2),
            FAILED,
            [
                (
                    "Fail",
                    "liveness probe GET /health failed 3 times in a row (last: GET /health: "
                    "no answer within 5s); restart now",
                )
            ],
            id="the-threshold-restarts-like-a-crash",
        ),
        pytest.param(
            ready(2),
            PASSED,
            [("Probed", "liveness probe passes again: GET /health -> 2xx")],
            id="an-answer-after-failures-resets-the-count",
        ),
        pytest.param(ready(0), PASSED, [], id="an-answer-with-no-failures-writes-nothing"),
        pytest.param(ready(2), None, [], id="no-new-answer-nothing-is-counted-twice"),
        pytest.param(
            ready(0),
            (FAILED, FAILED, FAILED),
            [
                (
                    "Fail",
                    "liveness probe GET /health failed 3 times in a row (last: GET /health: "
                    "no answer within 5s); restart now",
                )
            ],
            id="answers-piled-up-between-passes-count-each",
        ),
        pytest.param(ready(0), (FAILED, PASSED), [], id="a-failure-then-an-answer-is-no-run"),
        pytest.param(
            ready(2),
            (PASSED, FAILED),
            [
                (
                    "Probed",
                    "liveness probe failed (1 of 3 in a row): GET /health: no answer within 5s",
                )
            ],
            id="an-answer-breaks-the-run-the-next-failure-counts-from-one",
        ),
        pytest.param(
            replace(ready(2), restarts=1),
            FAILED,
            [
                (
                    "Fail",
                    "liveness probe GET /health failed 3 times in a row (last: GET /health: "
                    "no answer within 5s); restart in 10s",
                )
            ],
            id="a-second-liveness-restart-waits-out-the-back-off",
        ),
        pytest.param(
            replace(ready(2), restart_policy="Never"),
            FAILED,
            [
                (
                    "Fail",
                    "liveness probe GET /health failed 3 times in a row (last: GET /health: "
                    "no answer within 5s); restartPolicy Never",
                )
            ],
            id="restart-policy-never-fails-it",
        ),
        pytest.param(
            record("web", spec=WEB, phase=Phase.STARTING, liveness=LIVE, liveness_failures=2),
            FAILED,
            [],
            id="liveness-counts-only-once-ready",
        ),
        pytest.param(
            replace(ready(2), liveness=None),
            FAILED,
            [],
            id="no-liveness-probe-no-verdict",
        ),
    ],
)
def test_liveness(rec: Record, answer: ProbeResult | None, expect: list[tuple[str, str]]) -> None:
    assert shape(judged(rec, answer)) == expect


def test_the_restart_fail_keeps_the_lease_and_counts_nothing_new() -> None:
    (fail,) = judged(ready(2), FAILED)
    assert isinstance(fail, Fail) and fail.phase is Phase.BACKOFF and fail.retry_at == NOW
    assert fail.restarts == 0 and not fail.frees_now()  # BackOff keeps devices and port


def test_a_liveness_failure_during_back_off_never_restarts_twice() -> None:
    """The engine was stopped for its liveness; a late failing answer of the old engine
    (its probe was in flight) arrives while the record backs off: nothing happens until
    the back-off is over, and then exactly one Restart."""
    until = NOW + timedelta(seconds=10)
    backing = ready(0, phase=Phase.BACKOFF, restarts=1, backoff_until=until)
    assert judged(backing, FAILED) == []
    over = replace(backing, backoff_until=NOW - timedelta(seconds=1))
    actions = judged(over, FAILED)
    assert [type(a) for a in actions] == [Restart], actions


def test_a_drain_with_evict_stops_before_any_liveness_verdict() -> None:
    drain = Drain(until=NOW + timedelta(hours=1), evict=True)
    actions = judged(ready(2), FAILED, drain=drain)
    assert [type(a) for a in actions] == [Stop], actions


@given(st.lists(st.booleans(), max_size=30), st.integers(min_value=1, max_value=5))
def test_a_restart_comes_exactly_at_threshold_failures_in_a_row(
    answers: list[bool], threshold: int
) -> None:
    """Play answers through the planner, applying its Probed counts to the record: the
    first Fail comes at the first run of ``threshold`` failures, never before."""
    rec = record(
        "web", spec=WEB, liveness=replace(LIVE, failure_threshold=threshold), liveness_failures=0
    )
    run = 0
    for answer in answers:
        run = 0 if answer else run + 1
        actions = judged(rec, PASSED if answer else FAILED)
        if run >= threshold:
            assert [type(a) for a in actions] == [Fail], actions
            return
        assert all(isinstance(a, Probed) for a in actions), actions
        for probed in actions:
            assert isinstance(probed, Probed) and probed.failures == run
            rec = replace(rec, liveness_failures=probed.failures)
    assert run < threshold


# -- one start at a time per shared device -------------------------------------------------

PACKED: dict[str, Any] = {"devices": {"count": 1, "kind": "nvidia", "memory": "40Gi"}}
ONE = parse_static("nvidia:0=80Gi")
TWO = parse_static("nvidia:0=80Gi,nvidia:1=80Gi")
A, B = entry("llm-a", **PACKED), entry("llm-b", **PACKED)
WAIT_A = "waiting for llm-a to be Ready on nvidia:0 (one start at a time per device)"


def on_device(
    e: Entry, phase: Phase, *, alive: bool = True, maker_alive: bool = False, **fields: Any
) -> RecordView:
    rec = record(
        e.name,
        spec=e,
        phase=phase,
        devices=("nvidia:0",),
        memory=40 * GI,
        port=9000 + len(e.name),
        **fields,
    )
    return view(rec, alive=alive, maker_alive=maker_alive)


@pytest.mark.parametrize(
    ("seen", "expect"),
    [
        pytest.param(
            observed(on_device(A, Phase.STARTING)),
            [("Hold", "llm-b", WAIT_A)],
            id="the-second-waits-while-the-first-starts",
        ),
        pytest.param(
            observed(on_device(A, Phase.RESERVED, maker_alive=True)),
            [("Hold", "llm-b", WAIT_A)],
            id="a-reservation-is-starting-too",
        ),
        pytest.param(
            observed(on_device(A, Phase.READY)),
            [("Start", "llm-b", "new deployment: nvidia:0, port 8000")],
            id="the-second-starts-once-the-first-is-ready",
        ),
        pytest.param(
            observed(on_device(A, Phase.BACKOFF, alive=False, backoff_until=NOW)),
            [("Restart", "llm-a", "back-off over (restart 1)"), ("Hold", "llm-b", WAIT_A)],
            id="a-restart-takes-the-turn-too",
        ),
        pytest.param(
            observed(
                on_device(
                    A,
                    Phase.BACKOFF,
                    alive=False,
                    backoff_until=NOW + timedelta(seconds=5),
                    restarts=1,
                )
            ),
            [("Start", "llm-b", "new deployment: nvidia:0, port 8000")],
            id="a-first-that-is-gone-blocks-nothing",
        ),
        pytest.param(
            observed(on_device(A, Phase.STARTING, owner=OTHER)),
            [("Hold", "llm-b", WAIT_A)],
            id="another-manifest-sets-start-counts-too",
        ),
    ],
)
def test_packed_starts_wait_their_turn(seen: Any, expect: list[tuple[str, str, str]]) -> None:
    want = desired(B) if any(v.record.owner == OTHER for v in seen.records.values()) else None
    actions = plan(want or desired(A, B), seen, ONE, NOW)
    got = [(type(a).__name__, a.name, a.reason) for a in actions]
    assert [g[:2] for g in got] == [e[:2] for e in expect], got
    for (_, _, reason), (_, _, wanted) in zip(got, expect, strict=True):
        assert reason.startswith(wanted), got


def test_a_waiting_start_preempts_nobody() -> None:
    """A higher priority start that waits its turn is no shortage: nothing is preempted."""
    high = entry("high", devices=PACKED["devices"], priority=10)
    seen = observed(on_device(A, Phase.STARTING))
    actions = plan(desired(A, high), seen, ONE, NOW)
    assert [(type(a), a.name) for a in actions] == [(Hold, "high")], actions
    assert actions[0].reason == WAIT_A


def test_whole_leases_and_other_devices_never_wait() -> None:
    whole = entry("whole", devices={"count": 1, "kind": "nvidia"})
    seen = observed(on_device(A, Phase.STARTING))
    actions = plan(desired(A, B, whole), seen, TWO, NOW)
    got = {a.name: a for a in actions}
    assert isinstance(got["whole"], Start) and got["whole"].devices == ("nvidia:1",)
    assert isinstance(got["llm-b"], Hold) and got["llm-b"].reason == WAIT_A


def test_passes_bring_packed_engines_up_one_per_device_at_a_time() -> None:
    """Five 40Gi engines on two 80Gi devices, pass after pass, each start Ready by the
    next: never two starting on one device, and they end packed two per device."""
    entries = [entry(n, **PACKED) for n in ("a", "b", "c", "d", "e")]
    records: dict[str, Record] = {}
    order: list[tuple[str, tuple[str, ...]]] = []
    for _ in range(6):
        seen = observed(*(view(r, alive=True) for r in records.values()))
        actions = plan(desired(*entries), seen, TWO, NOW)
        starts = [a for a in actions if isinstance(a, Start)]
        devices = [d for s in starts for d in s.devices]
        assert len(devices) == len(set(devices)), starts  # one start per device per plan
        records = {n: replace(r, phase=Phase.READY) for n, r in records.items()}
        for s in starts:
            order.append((s.name, s.devices))
            records[s.name] = _started(s)
    assert order == [
        ("a", ("nvidia:0",)),
        ("b", ("nvidia:0",)),
        ("c", ("nvidia:1",)),
        ("d", ("nvidia:1",)),
    ]
    last = plan(
        desired(*entries), observed(*(view(r, alive=True) for r in records.values())), TWO, NOW
    )
    assert [(type(a), a.name) for a in last] == [(Hold, "e")]
    assert last[0].reason.startswith("no capacity"), last


def _started(start: Start) -> Record:
    return record(
        start.name,
        spec=start.entry,
        phase=Phase.STARTING,
        devices=start.devices,
        memory=start.entry.deployment.spec.devices.memory,
        port=start.port,
        ref=ref(300 + len(start.name)),
    )


def test_a_preempting_start_waits_its_turn_and_stops_nobody_meanwhile() -> None:
    """Found by the property below: two priority-1 engines on one 24Gi device, one fits
    beside a Ready priority-0 engine, the other needs it gone. The first starts; the second
    waits its turn without stopping the low one yet (it would start beside the first)."""
    gpu = parse_static("nvidia:0=24Gi")

    def packed(name: str, size: str, priority: int) -> Entry:
        devices = {"count": 1, "kind": "nvidia", "memory": size}
        return entry(name, devices=devices, priority=priority)

    low, first, big = packed("low", "8Gi", 0), packed("able", "8Gi", 1), packed("big", "16Gi", 1)
    held = record("low", spec=low, devices=("nvidia:0",), memory=8 * GI, port=9000, ref=ref(100))
    actions = plan(desired(low, first, big), observed(view(held, alive=True)), gpu, NOW)
    assert [(type(a).__name__, a.name) for a in actions] == [("Start", "able"), ("Hold", "big")]
    assert actions[1].reason == "waiting for able to be Ready on nvidia:0 (" + TURN + ")"


def test_a_preempted_start_gives_its_turn_up_with_its_devices() -> None:
    """Found by the property below (a scratch round of scripts/flakes): a packed engine
    starting on two devices is preempted for a whole-device start that needs one of them;
    the other device is free for a packed start in the same plan. The pass applies its
    teardowns, and waits for them, before any start (reconciler/run.py ``_execute``), so
    the preempted engine is gone before the packed one begins: no two start at once."""
    gpus = parse_static("nvidia:0=24Gi,nvidia:1=24Gi")
    starting = entry("starting", devices={"count": 2, "kind": "nvidia", "memory": "8Gi"})
    urgent = entry("urgent", devices={"count": 1, "kind": "nvidia"}, priority=1)
    packed = entry("packed", devices={"count": 1, "kind": "nvidia", "memory": "8Gi"})
    held = record(
        "starting",
        spec=starting,
        phase=Phase.STARTING,
        devices=("nvidia:0", "nvidia:1"),
        memory=8 * GI,
        port=9000,
        ref=ref(100),
    )
    actions = plan(desired(starting, urgent, packed), observed(view(held, alive=True)), gpus, NOW)
    got = {(type(a).__name__, a.name) for a in actions}
    assert got == {("Preempt", "starting"), ("Start", "urgent"), ("Start", "packed")}, actions
    devices = {a.name: a.devices for a in actions if isinstance(a, Start)}
    assert set(devices["urgent"]) | set(devices["packed"]) == {"nvidia:0", "nvidia:1"}, actions


@given(memory_scenarios())
def test_no_two_packed_engines_start_on_one_device_at_once(s: Scenario) -> None:
    """Whatever runs where: a plan's memory-packed starts (preemptions aside) never land on
    a device where one is starting, restarting or starting in the same plan. One this plan
    tears down (preempts, stops) is not starting any more when its starts begin: the pass
    applies teardowns first and waits for them."""
    actions = plan(s.desired, s.observed, s.inventory, NOW)
    views = s.observed.records
    gone = {a.name for a in actions if a.tears_down}
    busy = {
        d
        for v in views.values()
        if v.record.memory is not None
        and v.record.phase is Phase.STARTING
        and v.record.name not in gone
        for d in v.record.devices
    }
    busy |= {
        d
        for a in actions
        if isinstance(a, Restart) and views[a.name].record.memory is not None
        for d in views[a.name].record.devices
    }
    packed = [a for a in actions if isinstance(a, Start) and a.entry.deployment.spec.devices.memory]
    busy |= {d for a in packed if "preempting" in a.reason for d in a.devices}
    mine = [d for a in packed if "preempting" not in a.reason for d in a.devices]
    assert not busy & set(mine), actions
    assert len(mine) == len(set(mine)), actions


def test_a_liveness_probe_change_updates_in_place() -> None:
    live = entry("web", livenessProbe={"httpGet": {"path": "/live"}, "failureThreshold": 5})
    rec = record("web", spec=WEB, liveness=LIVE)  # made before the manifest set one
    actions = plan(desired(live), observed(view(rec, alive=True)), inventory(), NOW)
    assert [(type(a).__name__, a.reason) for a in actions] == [
        ("Update", "spec.livenessProbe changed")
    ], actions


# -- what the record is given ------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expect"),
    [
        pytest.param({}, None, id="command-has-no-default"),
        pytest.param(
            {"readiness": {"httpGet": {"path": "/ready"}}},
            ProbeConfig(
                http=(("/ready", None),), period_seconds=10, timeout_seconds=5, failure_threshold=3
            ),
            id="command-lives-by-its-readiness-get",
        ),
        pytest.param(
            {"readiness": {"httpGet": {"path": "/ready"}}, "livenessProbe": {"periodSeconds": 4}},
            ProbeConfig(
                http=(("/ready", None),), period_seconds=4, timeout_seconds=5, failure_threshold=3
            ),
            id="command-timing-alone-keeps-its-readiness-get",
        ),
        pytest.param(
            {"readiness": {"httpGet": {"path": "/ready"}}, "livenessProbe": {"enabled": False}},
            None,
            id="command-readiness-get-but-liveness-off",
        ),
        pytest.param({"readiness": {"tcpSocket": {}}}, None, id="command-tcp-readiness-no-default"),
        pytest.param(
            {"livenessProbe": {"tcpSocket": {}, "periodSeconds": 3}},
            ProbeConfig(tcp=True, period_seconds=3, timeout_seconds=5, failure_threshold=3),
            id="the-specs-own-check",
        ),
        pytest.param(
            {"livenessProbe": {"completion": {}, "timeoutSeconds": 20}, "model": "m"},
            ProbeConfig(
                completion="/v1/chat/completions",
                model="m",
                period_seconds=10,
                timeout_seconds=20,
                failure_threshold=3,
            ),
            id="a-completion-for-the-specs-model",
        ),
        pytest.param(
            {"engine": "llama-cpp", "model": "/m.gguf", "command": None},
            ProbeConfig(
                http=(("/health", None),), period_seconds=10, timeout_seconds=5, failure_threshold=3
            ),
            id="the-recipes-health-path-by-default",
        ),
        pytest.param(
            {
                "engine": "llama-cpp",
                "model": "/m.gguf",
                "command": None,
                "livenessProbe": {"failureThreshold": 1},
            },
            ProbeConfig(
                http=(("/health", None),), period_seconds=10, timeout_seconds=5, failure_threshold=1
            ),
            id="timing-alone-keeps-the-recipes-check",
        ),
        pytest.param(
            {
                "engine": "llama-cpp",
                "model": "/m.gguf",
                "command": None,
                "livenessProbe": {"enabled": False},
            },
            None,
            id="enabled-false-turns-it-off",
        ),
    ],
)
def test_the_rendered_liveness_probe(spec: dict[str, Any], expect: ProbeConfig | None) -> None:
    assert render(entry("web", **spec), devices=(), port=9000).liveness == expect


def test_a_command_liveness_probe_naming_no_check_is_an_error() -> None:
    with pytest.raises(RecipeError, match="names no check and engine 'command' has no health"):
        render(entry("web", livenessProbe={"periodSeconds": 5}), devices=(), port=9000)


def test_a_packed_restart_waits_while_another_starts_on_its_device() -> None:
    seen = observed(
        on_device(A, Phase.BACKOFF, alive=False, backoff_until=NOW),
        on_device(B, Phase.STARTING),
    )
    assert plan(desired(A, B), seen, ONE, NOW) == []


def test_of_two_packed_restarts_due_on_one_device_one_goes() -> None:
    seen = observed(
        on_device(A, Phase.BACKOFF, alive=False, backoff_until=NOW),
        on_device(B, Phase.BACKOFF, alive=False, backoff_until=NOW),
    )
    actions = plan(desired(A, B), seen, ONE, NOW)
    assert [(type(a), a.name) for a in actions] == [(Restart, "llm-a")], actions


def test_the_daemon_looks_again_each_second_at_a_back_off_held_over() -> None:
    held = on_device(A, Phase.BACKOFF, alive=False, backoff_until=NOW - timedelta(seconds=3))
    assert _next_due(held.record, NOW) == ("back-off held", 1.0)
    due = on_device(A, Phase.BACKOFF, alive=False, restarts=1, backoff_until=NOW + timedelta(5))
    assert _next_due(due.record, NOW) == ("back-off over", 10.005)
