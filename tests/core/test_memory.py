"""Memory-aware placement, priorities and preemption: the pure half, table-driven.

Each case is planner inputs -> the exact (action, name) list and a phrase each
reason must contain; the properties check invariant 1 with memory (no device over
its memory, a whole lease never shares) and that preemption only ever goes down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from strategies import (
    GI,
    NOW,
    Scenario,
    desired,
    entry,
    memory_scenarios,
    observed,
    probe,
    record,
    view,
)

from controller.core.actions import (
    Action,
    Hold,
    MarkReady,
    Preempt,
    Release,
    Restart,
    Start,
    Stop,
    Update,
)
from controller.core.devices.inventory import Device, GpuMemory, Inventory, parse_static
from controller.core.devices.placement import Ledger, Unplaced, place_devices
from controller.core.devices.victims import Victim, choose_victims
from controller.core.engines.share import fraction, share_args
from controller.core.manifest.quantity import format_bytes, parse_quantity
from controller.core.manifest.specs import Entry, spec_document
from controller.core.plan import Desired, plan
from controller.core.render import render
from controller.core.state import Observed, Phase, RecordView
from controller.errors import ConfigError
from controller.host import devices
from controller.reconciler.memwait import STOPPED, MemoryGate
from controller.store.sources.manifests import load

TWO_80 = parse_static("nvidia:0=80Gi,nvidia:1=80Gi")
ONE_80 = parse_static("nvidia:0=80Gi")


def mem(size: str, priority: int = 0, count: int = 1, **devices: object) -> dict[str, object]:
    return {
        "devices": {"count": count, "kind": "nvidia", "memory": size, **devices},
        "priority": priority,
    }


def whole(priority: int = 0, **devices: object) -> dict[str, object]:
    return {"devices": {"count": 1, "kind": "nvidia", **devices}, "priority": priority}


def running(e: Entry, *devices: str, age: int = 60, phase: Phase = Phase.READY) -> RecordView:
    spec = e.deployment.spec
    rec = record(
        e.name,
        spec=e,
        phase=phase,
        devices=devices,
        memory=spec.devices.memory,
        priority=spec.priority,
        started_at=NOW - timedelta(seconds=age),
        port=9000 + sum(map(ord, e.name)) % 500,
    )
    return view(rec, alive=True)


@dataclass(frozen=True)
class Case:
    want: Desired
    seen: Observed = field(default_factory=Observed)
    expect: tuple[tuple[type[Action], str, str], ...] = ()
    inv: Inventory = TWO_80


def got(case: Case) -> list[Action]:
    return list(plan(case.want, case.seen, case.inv, NOW))


a40, b40, c40, d40, e40 = (entry(n, **mem("40Gi")) for n in "abcde")
low, mid = entry("low", **mem("40Gi", 0)), entry("mid", **mem("40Gi", 5))
high = entry("high", **mem("40Gi", 10))

CASES = [
    pytest.param(
        Case(desired(a40, b40, c40, d40, e40)),
        (
            # One start at a time per shared device (tests/core/test_plan_health.py plays the
            # passes on to a, b on nvidia:0, c, d on nvidia:1 and e without capacity).
            (Start, "a", "nvidia:0,"),
            (Hold, "b", "waiting for a to be Ready on nvidia:0"),
            (Hold, "c", "waiting for a to be Ready on nvidia:0"),
            (Hold, "d", "waiting for a to be Ready on nvidia:0"),
            (Hold, "e", "waiting for a to be Ready on nvidia:0"),
        ),
        id="four-40Gi-pack-two-per-80Gi-device-start-in-turn",
    ),
    pytest.param(
        Case(
            desired(
                entry("x", **mem("20Gi")), entry("y", **mem("20Gi")), entry("z", **mem("60Gi"))
            ),
            observed(
                running(entry("y", **mem("20Gi")), "nvidia:0"),
                running(entry("z", **mem("60Gi")), "nvidia:1"),
            ),
        ),
        ((Start, "x", "nvidia:1,"),),
        id="best-fit-takes-the-tightest-device-not-the-first",
    ),
    pytest.param(
        Case(
            desired(entry("w", **whole()), a40),
            observed(running(entry("w", **whole()), "nvidia:0")),
        ),
        ((Start, "a", "nvidia:1,"),),
        id="memory-request-never-joins-a-whole-lease",
    ),
    pytest.param(
        Case(desired(a40, entry("w", **whole())), observed(running(a40, "nvidia:0"))),
        ((Start, "w", "nvidia:1,"),),
        id="whole-lease-never-joins-memory-requests",
    ),
    pytest.param(
        Case(
            desired(a40, c40, entry("w", **whole())),
            observed(running(a40, "nvidia:0"), running(c40, "nvidia:1")),
        ),
        ((Hold, "w", "no capacity"),),
        id="whole-lease-waits-while-every-device-is-shared",
    ),
    pytest.param(
        Case(desired(a40, entry("u", **whole(shareable=True))), observed(running(a40, "nvidia:0"))),
        ((Start, "u", "nvidia:1,"),),
        id="unified-memory-shareable-stays-apart-from-memory-requests",
    ),
    pytest.param(
        Case(desired(a40, entry("w", **whole())), inv=parse_static("nvidia:0")),
        ((Start, "w", "nvidia:0,"), (Hold, "a", "declare it (--devices nvidia:0=80Gi)")),
        id="unknown-memory-takes-whole-leases-only-and-says-how-to-declare",
    ),
    pytest.param(
        Case(desired(entry("big", **mem("100Gi")))),
        ((Hold, "big", "models.yaml:1: spec.devices.memory 100Gi is more than"),),
        id="more-than-any-device-names-file-line-field",
    ),
    pytest.param(
        Case(
            desired(entry("tp", **mem("50Gi", count=2))),
            observed(),
            inv=parse_static("nvidia:0=80Gi,nvidia:1=24Gi"),
        ),
        ((Hold, "tp", "the largest has 80Gi"),),
        id="count-2-needs-two-devices-big-enough",
    ),
    pytest.param(
        Case(desired(entry("tp", **mem("1Gi", count=3)))),
        ((Hold, "tp", "needs 3 nvidia devices, 2 free — the node has only 2: lower devices"),),
        id="count-past-the-inventory-says-so-not-that-the-memory-is-too-big",
    ),
    pytest.param(
        Case(
            desired(high, low, mid),
            observed(running(low, "nvidia:0"), running(mid, "nvidia:0")),
            inv=ONE_80,
        ),
        (
            (Preempt, "low", "preempted by high (priority 10)"),
            (Start, "high", "preempting low"),
        ),
        id="preempts-the-lowest-priority",
    ),
    pytest.param(
        Case(
            desired(high, a40, b40),
            observed(running(a40, "nvidia:0", age=300), running(b40, "nvidia:0", age=30)),
            inv=ONE_80,
        ),
        ((Preempt, "b", "preempted by high (priority 10)"), (Start, "high", "preempting b")),
        id="ties-go-to-the-most-recently-started",
    ),
    pytest.param(
        Case(
            desired(entry("new", **mem("40Gi", 0)), a40, b40),
            observed(running(a40, "nvidia:0"), running(b40, "nvidia:0")),
            inv=ONE_80,
        ),
        ((Hold, "new", "no capacity"),),
        id="equal-priorities-never-preempt",
    ),
    pytest.param(
        Case(
            desired(
                entry("top", **mem("40Gi", 10)),
                entry("s", **mem("10Gi", 0)),
                entry("m", **mem("40Gi", 1)),
                entry("t", **mem("30Gi", 5)),
            ),
            observed(
                running(entry("s", **mem("10Gi", 0)), "nvidia:0"),
                running(entry("m", **mem("40Gi", 1)), "nvidia:0"),
                running(entry("t", **mem("30Gi", 5)), "nvidia:0"),
            ),
            inv=ONE_80,
        ),
        ((Preempt, "m", "preempted by top"), (Start, "top", "preempting m")),
        id="fewest-before-lowest-one-victim-when-one-suffices",
    ),
    pytest.param(
        Case(
            desired(
                entry("top", **mem("80Gi", 10)),
                entry("s", **mem("30Gi", 0)),
                entry("m", **mem("50Gi", 1)),
            ),
            observed(
                running(entry("s", **mem("30Gi", 0)), "nvidia:0"),
                running(entry("m", **mem("50Gi", 1)), "nvidia:0"),
            ),
            inv=ONE_80,
        ),
        (
            (Preempt, "m", "preempted by top"),
            (Preempt, "s", "preempted by top"),
            (Start, "top", "preempting s, m"),
        ),
        id="two-victims-when-one-cannot-make-room",
    ),
    pytest.param(
        Case(
            desired(high, a40, b40),
            observed(
                running(a40, "nvidia:0", age=300), running(b40, "nvidia:0", phase=Phase.STARTING)
            ),
            inv=ONE_80,
        ),
        ((Preempt, "b", "preempted by high"), (Start, "high", "preempting b")),
        id="a-starting-engine-is-preempted-before-older-ready-ones",
    ),
    pytest.param(
        Case(
            desired(high, a40),
            observed(running(a40, "nvidia:0"), running(b40, "nvidia:0")),
            inv=ONE_80,
        ),
        # b's file (the one every entry here names) is still there: removed from it; high
        # waits for that stop, which makes its room (not "no capacity": nothing needs you)
        ((Stop, "b", "removed from"), (Hold, "high", "waiting for b to stop, which makes room")),
        id="room-freed-this-round-preempts-nobody",
    ),
    pytest.param(
        Case(
            desired(entry("w", **whole(priority=0)), entry("hw", **whole(priority=3))),
            observed(running(entry("w", **whole(priority=0)), "nvidia:0")),
            inv=ONE_80,
        ),
        ((Preempt, "w", "preempted by hw (priority 3)"), (Start, "hw", "preempting w")),
        id="whole-leases-preempt-too",
    ),
    pytest.param(
        Case(
            desired(
                entry("a", **mem("40Gi", 3)),
                entry("b", **mem("40Gi", 1)),
                entry("c", **mem("40Gi", 2)),
            ),
            inv=parse_static("nvidia:0=40Gi,nvidia:1=40Gi"),  # unpacked: no start waits its turn
        ),
        ((Start, "a", "nvidia:0"), (Start, "c", "nvidia:1"), (Hold, "b", "no capacity")),
        id="new-deployments-are-placed-highest-priority-first",
    ),
]


@pytest.mark.parametrize(("case", "expect"), CASES)
def test_memory_plan(case: Case, expect: Sequence[tuple[type[Action], str, str]]) -> None:
    actions = got(case)
    assert [(type(a), a.name) for a in actions] == [(t, n) for t, n, _ in expect], actions
    for action, (_, _, phrase) in zip(actions, expect, strict=True):
        assert phrase in action.reason, action.reason


def _crashed(e: Entry, *devices: str) -> RecordView:
    """``e`` in BackOff on ``devices``, its restart due now."""
    spec = e.deployment.spec
    rec = record(
        e.name,
        spec=e,
        phase=Phase.BACKOFF,
        devices=devices,
        memory=spec.devices.memory,
        backoff_until=NOW,
        port=9100,
    )
    return view(rec, alive=False)


@pytest.mark.parametrize(
    ("inv", "expect"),
    [
        pytest.param(TWO_80, (Restart, "back-off over"), id="its-card-as-declared-restarts-there"),
        pytest.param(
            parse_static("nvidia:0=40Gi,nvidia:1=80Gi"),
            (Release, "nvidia:0 has 40Gi, less than its holders ask: placing it afresh"),
            id="its-card-declared-smaller-since-places-afresh",
        ),
    ],
)
def test_a_restart_never_goes_back_onto_a_card_its_holders_overfill(
    inv: Inventory, expect: tuple[type[Action], str]
) -> None:
    """A card's declared size lowered under running engines (they run on): a crashed one's
    restart went back onto it, 50Gi asked of a 40Gi card. It is placed afresh instead."""
    big = entry("big", **mem("50Gi"))
    (action,) = plan(desired(big), observed(_crashed(big, "nvidia:0")), inv, NOW)
    assert (type(action), action.name) == (expect[0], "big") and expect[1] in action.reason


def test_preempted_record_loses_its_other_actions() -> None:
    b = running(b40, "nvidia:0", phase=Phase.STARTING)
    b_ready = RecordView(record=b.record, alive=True, probe=probe(True))
    actions = got(
        Case(
            desired(high, a40, b40),
            observed(running(a40, "nvidia:0", age=300), b_ready),
            inv=ONE_80,
        )
    )
    assert not any(isinstance(a, MarkReady) for a in actions)
    assert any(isinstance(a, Preempt) and a.name == "b" for a in actions)


def preempted(e: Entry, by: str = "high (priority 10)") -> RecordView:
    rec = record(e.name, spec=e, phase=Phase.PENDING, port=None, message=f"preempted by {by}")
    return view(rec)


def test_chain_high_preempts_mid_then_mid_preempts_low() -> None:
    top = entry("top", **mem("80Gi", 10, candidates=["0"]))
    mid80, low80 = entry("mid", **mem("80Gi", 5)), entry("low", **mem("80Gi", 0))
    first = got(
        Case(
            desired(top, mid80, low80),
            observed(running(mid80, "nvidia:0"), running(low80, "nvidia:1")),
        )
    )
    assert [(type(a), a.name) for a in first] == [(Preempt, "mid"), (Start, "top")]
    after = observed(running(top, "nvidia:0"), preempted(mid80), running(low80, "nvidia:1"))
    second = got(Case(desired(top, mid80, low80), after))
    assert [(type(a), a.name) for a in second] == [(Preempt, "low"), (Start, "mid")]
    assert second[0].reason == "preempted by mid (priority 5)"


def test_no_flap_a_preempted_deployment_waits_and_says_why() -> None:
    after = observed(running(high, "nvidia:0"), running(a40, "nvidia:0"), preempted(b40))
    actions = got(Case(desired(high, a40, b40), after, inv=ONE_80))
    assert [(type(a), a.name) for a in actions] == [(Hold, "b")]
    assert actions[0].reason.startswith("preempted by high (priority 10); waiting for room: ")


def test_preempted_deployment_returns_when_room_returns() -> None:
    actions = got(
        Case(desired(a40, b40), observed(running(a40, "nvidia:0"), preempted(b40)), inv=ONE_80)
    )
    assert [(type(a), a.name) for a in actions] == [(Start, "b")]


def test_foreign_and_invalid_records_are_never_preempted() -> None:
    other = record(
        "o", owner="/elsewhere", spec=a40, devices=("nvidia:0",), memory=80 * GI, port=9100
    )
    actions = got(Case(desired(high), observed(view(other, alive=True)), inv=ONE_80))
    assert [(type(a), a.name) for a in actions] == [(Hold, "high")]


@pytest.mark.parametrize(
    ("wanted", "theirs", "memory"),
    [
        pytest.param(high, a40, 80 * GI, id="memory-request"),
        pytest.param(entry("high", **whole(10)), entry("o", **whole()), None, id="whole-device"),
    ],
)
def test_a_wait_on_another_sets_lower_priority_engine_names_it_and_why(
    wanted: Entry, theirs: Entry, memory: int | None
) -> None:
    """Priority preempts only within one manifest set (README; a pass acts only on what
    its set owns, invariant 8). A deployment kept waiting by another set's engine of lower
    priority said only that no GPU was free (its next move "raise spec.priority" could
    not help): it names that engine, its file, and why it stays."""
    other = record(
        "o", owner="/elsewhere", spec=theirs, devices=("nvidia:0",), memory=memory, port=9100
    )
    (hold,) = got(Case(desired(wanted), observed(view(other, alive=True)), inv=ONE_80))
    assert isinstance(hold, Hold) and hold.name == "high"
    said = "; not preempted, as priority preempts only within one manifest set: o (priority 0, "
    assert f"{said}from {theirs.source}); stop it in its set" in hold.reason, hold.reason
    assert "(`reconcile down o` with that set's -f) to make room" in hold.reason
    # Of no lower priority it would not be preempted in one set either: nothing to add.
    same = replace(other, priority=10)
    (hold,) = got(Case(desired(wanted), observed(view(same, alive=True)), inv=ONE_80))
    assert isinstance(hold, Hold) and "manifest set" not in hold.reason, hold.reason


def test_plan_shows_a_preemption_as_a_destroy() -> None:
    assert Preempt.plan_class == "destroy"


def test_user_share_flag_wins_and_plan_says_so() -> None:
    e = entry(
        "v",
        engine="vllm",
        model="m",
        command=None,
        args=["--gpu-memory-utilization", "0.5"],
        **mem("20Gi"),
    )
    (start,) = got(Case(desired(e), inv=ONE_80))
    assert isinstance(start, Start)
    assert (
        "spec.args sets --gpu-memory-utilization: the user's value wins over the computed 0.25"
        in start.reason
    )


@pytest.mark.parametrize(
    ("engine", "args", "said"),
    [
        ("vllm", ["--gpu_memory_utilization", "0.5"], "--gpu_memory_utilization (read as"),
        ("vllm", ["--gpu-memory_utilization=0.5"], "--gpu-memory_utilization (read as"),
        ("vllm", ["--gpu-memory-util", "0.5"], "--gpu-memory-util (read as"),
        ("sglang", ["--mem-fraction", "0.5"], "--mem-fraction (read as --mem-fraction-static)"),
    ],
    ids=["vllm-underscores", "vllm-mixed", "vllm-begun", "sglang-begun"],
)
def test_every_spelling_the_engine_reads_as_the_share_flag_is_the_users(
    engine: str, args: list[str], said: str
) -> None:
    """plan said nothing of `--gpu_memory_utilization 0.5`, which vLLM reads as
    `--gpu-memory-utilization` (and so does `--gpu-memory-util`, argparse taking a
    beginning for the flag): the user's value won without a word."""
    e = entry("v", engine=engine, model="m", command=None, args=args, **mem("20Gi"))
    (start,) = got(Case(desired(e), inv=ONE_80))
    assert isinstance(start, Start)
    assert f"spec.args sets {said}" in start.reason, start.reason
    assert "the user's value wins over the computed 0.25" in start.reason
    argv = render(e, devices=ONE_80.devices, port=9000, extra_ports=(9001,)).argv
    assert "0.25" not in argv  # not ours first and theirs after: theirs alone


def test_a_spelling_the_engine_does_not_read_as_the_flag_is_no_users_share() -> None:
    """SGLang's argparse has no underscore spelling: `--mem_fraction_static` is no
    `--mem-fraction-static` there, so the computed share is passed and said as such."""
    args = ["--mem_fraction_static", "0.5"]
    e = entry("s", engine="sglang", model="m", command=None, args=args, **mem("20Gi"))
    (start,) = got(Case(desired(e), inv=ONE_80))
    assert isinstance(start, Start) and "user's value" not in start.reason


# -- the pieces -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("20Gi", 20 * GI),
        ("512Mi", 512 << 20),
        ("1Ti", 1 << 40),
        ("80G", 80 * 10**9),
        ("1.5Gi", 3 * GI // 2),
        (1 << 20, 1 << 20),
        ("1048576", 1 << 20),
    ],
)
def test_quantities(text: str | int, size: int) -> None:
    assert parse_quantity(text) == size


@pytest.mark.parametrize(
    ("text", "phrase"),
    [
        ("0", "is zero"),
        ("-1Gi", "negative"),
        ("20GB", "unknown unit 'GB': write 20Gi \\(GiB, powers of 1024\\) or 20G \\(powers"),
        ("16g", "unknown unit 'g': write 16Gi \\(GiB, powers of 1024\\) or 16G"),
        ("512MiB", "unknown unit 'MiB': write 512Mi \\(units"),
        ("16", "no unit, so it is 16 bytes, surely not meant: write 16Gi \\(GiB\\) or 16G"),
        (16, "no unit, so it is 16 bytes"),
        ("1048575", "no unit"),
        ("lots", "not a quantity"),
        ("", "not a quantity"),
    ],
)
def test_bad_quantities_say_what_is_wrong(text: str | int, phrase: str) -> None:
    """`16GB`, `16g` (docker's) and a bare `16` (16 bytes, as Kubernetes reads it, which
    packed engines onto a device for free) each say the spelling meant."""
    with pytest.raises(ValueError, match=phrase):
        parse_quantity(text)


def test_format_bytes() -> None:
    assert [format_bytes(n) for n in (20 * GI, 3 * GI // 2, 512 << 20, 10)] == [
        "20Gi",
        "1.5Gi",
        "512Mi",
        "10B",
    ]


@pytest.mark.parametrize(
    ("memory", "sizes", "want"),
    [
        (20 * GI, [80 * GI], "0.25"),
        (30 * GI, [80 * GI], "0.37"),
        (40 * GI, [80 * GI, 40 * GI], "1.00"),
        (1, [80 * GI], "0.01"),
    ],
)
def test_fraction_rounds_down_against_the_smallest_device(
    memory: int, sizes: list[int], want: str
) -> None:
    devices = [Device(kind="nvidia", id=str(i), memory=s) for i, s in enumerate(sizes)]
    assert fraction(memory, devices) == want


def test_share_args() -> None:
    dev = (Device(kind="nvidia", id="0", memory=80 * GI),)
    assert share_args("vllm", 20 * GI, dev, ()) == ("--gpu-memory-utilization", "0.25")
    assert share_args("sglang", 20 * GI, dev, ()) == ("--mem-fraction-static", "0.25")
    assert share_args("vllm", 20 * GI, dev, ("--gpu-memory-utilization=0.5",)) == ()
    assert share_args("llama-cpp", 20 * GI, dev, ()) == ()
    assert share_args("vllm", None, dev, ()) == ()
    assert share_args("vllm", 20 * GI, (Device(kind="nvidia", id="0"),), ()) == ()


def test_ledger_release_and_room() -> None:
    ledger = Ledger()
    dev = Device(kind="nvidia", id="0", memory=80 * GI)
    ledger.take("a", ("nvidia:0",), (9000,), False, 30 * GI)
    ledger.take("b", ("nvidia:0",), (9001,), False, 30 * GI)
    assert ledger.room(dev) == 20 * GI and not ledger.fits(dev, 30 * GI)
    ledger.release("a")
    assert ledger.room(dev) == 50 * GI and ledger.ports == {9001: "b"}
    assert not ledger.free_for("nvidia:0", True)  # unified memory never joins requests


def test_choose_victims_never_takes_equal_or_higher() -> None:
    spec = entry("x", **mem("80Gi", 1)).deployment.spec
    ledger = Ledger()
    ledger.take("same", ("nvidia:0",), (), False, 40 * GI)
    ledger.take("lower", ("nvidia:0",), (), False, 40 * GI)
    cands = [Victim("same", 1), Victim("lower", 0)]
    fits = lambda gone: not isinstance(place_devices(spec, ONE_80, ledger.without(gone)), Unplaced)  # noqa: E731
    assert choose_victims(spec.priority, cands, fits) is None
    assert place_devices(spec, ONE_80, ledger) != ("nvidia:0",)


# -- properties (invariant 1 with memory) -----------------------------------------------------


def _after(scenario: Scenario, actions: list[Action]) -> dict[str, list[tuple[str, int | None]]]:
    """Device -> [(holder, memory)] once the plan is applied (preempted and stopped gone)."""
    gone = {a.name for a in actions if isinstance(a, Preempt | Stop)}
    held: dict[str, list[tuple[str, int | None]]] = {}
    for name, v in scenario.observed.records.items():
        if v.record.holds and name not in gone:
            for key in v.record.devices:
                held.setdefault(key, []).append((name, v.record.memory))
    for a in actions:
        if isinstance(a, Start):
            memory = a.entry.deployment.spec.devices.memory
            for key in a.devices:
                held.setdefault(key, []).append((a.name, memory))
    return held


def _no_device_over_its_memory_and_whole_never_shares(
    scenario: Scenario, actions: list[Action]
) -> None:
    sizes = {d.key: d.memory for d in scenario.inventory.devices}
    for key, holders in _after(scenario, actions).items():
        if not any(isinstance(a, Start) and key in a.devices for a in actions):
            continue  # nothing new there: pre-existing state is not this plan's doing
        memories = [m for _, m in holders]
        if None in memories:
            unified = all(
                scenario.desired.entries[n].deployment.spec.devices.shareable for n, _ in holders
            )
            assert len(holders) == 1 or (unified and all(m is None for m in memories)), (
                key,
                holders,
            )
        else:
            total = sizes[key]
            assert total is not None and sum(m for m in memories if m) <= total, (key, holders)


def _preempts_only_strictly_lower_priority(scenario: Scenario, actions: list[Action]) -> None:
    entries = scenario.desired.entries
    for a in actions:
        if isinstance(a, Preempt):
            assert (
                entries[a.name].deployment.spec.priority
                < a.priority
                == entries[a.by].deployment.spec.priority
            )
            assert any(isinstance(s, Start) and s.name == a.by for s in actions)


@settings(max_examples=300)
@given(memory_scenarios())
def test_property_a_memory_plan_never_overbooks_preempts_only_lower_and_is_deterministic(
    scenario: Scenario,
) -> None:
    """The memory properties on the same 300 draws (a draw is most of an example's cost):
    each failing assertion is still shrunk and reported on its own line."""
    actions = plan(scenario.desired, scenario.observed, scenario.inventory, NOW)
    _no_device_over_its_memory_and_whole_never_shares(scenario, actions)
    _preempts_only_strictly_lower_priority(scenario, actions)
    assert actions == plan(scenario.desired, scenario.observed, scenario.inventory, NOW)


# -- bad input: file, line and field (through the manifest loader) ---------------------------

MANIFEST = """apiVersion: reconcile/v1
kind: Deployment
metadata:
  name: a
spec:
  engine: command
  command: [serve, "{{port}}"]
{extra}"""


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            "  devices: {count: 1, memory: 0}\n",
            "bad.yaml:8: spec.devices.memory: memory '0' is zero",
        ),
        (
            "  devices: {count: 1, memory: -4Gi}\n",
            "bad.yaml:8: spec.devices.memory: memory '-4Gi' is negative",
        ),
        (
            "  devices: {count: 1, memory: 20GB}\n",
            "spec.devices.memory: memory '20GB' has an unknown unit 'GB'",
        ),
        (
            "  devices: {count: 0, memory: 20Gi}\n",
            "bad.yaml:8: spec.devices: devices.memory is the share of each device, but "
            "devices.count is 0",
        ),
        (
            "  priority: 2000000000\n",
            "bad.yaml:8: spec.priority: Input should be less than or equal to 1000000000",
        ),
        ("  priority: high\n", "bad.yaml:8: spec.priority: Input should be a valid integer"),
    ],
    ids=["zero", "negative", "unknown-unit", "count-0", "priority-too-high", "priority-not-int"],
)
def test_bad_memory_and_priority_name_file_line_field(
    tmp_path: Path, extra: str, expected: str
) -> None:
    (tmp_path / "bad.yaml").write_text(MANIFEST.format(extra=extra))
    result = load([tmp_path])
    (error,) = result.errors
    assert expected in str(error), str(error)
    assert str(error).startswith(str(tmp_path / "bad.yaml"))


def test_new_fields_at_their_defaults_keep_the_spec_hash() -> None:
    """Upgrading reconcile must restart no engine: old hashes stay valid."""
    doc = spec_document(entry("a").deployment.spec)
    assert "priority" not in doc and "memory" not in doc["devices"]
    assert "priority" in spec_document(entry("a", priority=3).deployment.spec)


def test_a_priority_change_is_in_place() -> None:
    old, new = entry("a", **mem("20Gi", 0)), entry("a", **mem("20Gi", 7))
    (update,) = got(Case(desired(new), observed(running(old, "nvidia:0")), inv=ONE_80))
    assert isinstance(update, Update) and update.fields == ("priority",)


# -- the static inventory ---------------------------------------------------------------------


def test_static_inventory_with_memory() -> None:
    inv = parse_static("nvidia:0=80Gi, nvidia:1=24Gi,cpu:0")
    assert [(d.key, d.memory) for d in inv.devices] == [
        ("nvidia:0", 80 * GI),
        ("nvidia:1", 24 * GI),
        ("cpu:0", None),
    ]


@pytest.mark.parametrize("text", ["nvidia:0=80Gx", "nvidia:0=", "nvidia:0=0", "nvidia:0=-1Gi"])
def test_static_inventory_bad_quantity_names_it(text: str) -> None:
    with pytest.raises(
        ConfigError, match=r"device inventory entry nvidia:0=.*--devices nvidia:0=80Gi"
    ):
        parse_static(text)


def test_nvidia_smi_fills_memory_in_bytes() -> None:
    (gpu,) = devices.parse_nvidia_smi("0, GPU-abc, H100, 81559, 80000\n")
    assert gpu.memory == 81559 << 20 and gpu.uuid == "GPU-abc"


# -- the NVML gate before a start (fake NVML: the seam is MemoryGate.read) ---------------------


def gate(*frees: int, holders: tuple[tuple[int, int], ...] = ()) -> tuple[MemoryGate, list[float]]:
    """A gate whose NVML reads return ``frees`` in turn (the last one repeats)."""
    reads = list(frees)
    clock = [0.0]

    def read(uuids: tuple[str, ...]) -> dict[str, GpuMemory]:
        free = reads.pop(0) if len(reads) > 1 else reads[0]
        return {u: GpuMemory(u, free, holders) for u in uuids}

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    g = MemoryGate(read=read, timeout=5, period=1, sleep=sleep, clock=lambda: clock[0])
    g.owner_of = lambda pid: "other-model" if pid == 7 else None
    return g, clock


GPU_REC = record(
    "v", phase=Phase.RESERVED, devices=("nvidia:0",), device_uuids=("GPU-0",), memory=20 * GI
)


def test_gate_passes_when_memory_is_free() -> None:
    g, clock = gate(70 * GI)
    assert g.wait(GPU_REC, lambda why: None) is None and clock[0] == 0


def test_gate_waits_until_the_driver_frees_it_and_reports() -> None:
    g, clock = gate(5 * GI, 5 * GI, 30 * GI)
    said: list[str] = []
    assert g.wait(GPU_REC, said.append) is None
    assert clock[0] == 2 and said == [
        "nvidia:0 has 5Gi free, needs 20Gi (held by unknown); waiting up to 5s"
    ]


def test_gate_gives_up_naming_a_process_that_is_not_ours() -> None:
    g, _ = gate(5 * GI, holders=((4242, 60 * GI), (7, 15 * GI)))
    why = g.wait(GPU_REC, lambda why: None)
    assert why is not None
    assert "nvidia:0 has 5Gi free, needs 20Gi" in why
    assert "pid 4242 60Gi (not managed by reconcile)" in why
    assert "pid 7 15Gi (deployment other-model)" in why


def test_gate_ends_at_once_when_a_stop_is_asked() -> None:
    g, clock = gate(5 * GI)
    g.interrupted = lambda: clock[0] >= 1  # the daemon's SIGTERM, one poll into the wait
    said: list[str] = []
    assert g.wait(GPU_REC, said.append) is STOPPED
    assert clock[0] == 1 and len(said) == 1  # not the 5 s timeout
    free, _ = gate(70 * GI)
    free.interrupted = lambda: True  # the memory is there: no wait, the start goes on
    assert free.wait(GPU_REC, said.append) is None


def test_gate_asks_by_device_key_where_the_fake_source_reads() -> None:
    asked: list[tuple[str, ...]] = []

    def read(ids: tuple[str, ...]) -> dict[str, GpuMemory]:
        asked.append(ids)
        return {i: GpuMemory(i, 70 * GI, ()) for i in ids}

    no_uuid = replace(GPU_REC, device_uuids=(None,))
    assert MemoryGate(read=read, by_key=True).wait(no_uuid, print) is None
    assert asked == [("nvidia:0",)]


def test_gate_is_silent_without_nvml_or_uuids() -> None:
    g = MemoryGate(read=lambda uuids: None)
    assert g.wait(GPU_REC, lambda why: None) is None
    no_uuid = replace(GPU_REC, device_uuids=(None,))
    assert MemoryGate(read=lambda u: pytest.fail("no NVML read")).wait(no_uuid, print) is None
