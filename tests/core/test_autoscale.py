"""The autoscaler's rule (core/scaling/autoscale.py) and its load figures
(core/scaling/inflight.py): each case is (policy, stored state, load, now) -> the next
state and its event."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import entry, record

from controller.core.manifest.specs import Autoscale
from controller.core.scaling.autoscale import Decision, Load, Scale, decide, wanted
from controller.core.scaling.inflight import Inflight, Sample, average, recent
from controller.core.state import Activation, Phase
from controller.reconciler.autoscaling import Autoscaler
from controller.store.instances.events import Journal
from controller.store.side import activation, inflight, scale

POLICY = Autoscale(min=1, max=4, targetInflight=4, scaleDownDelay=60)
ZERO = Autoscale(min=0, max=3, targetInflight=4, scaleDownDelay=30)
T = 1_000_000.0


@pytest.mark.parametrize(
    ("load", "count"),
    [(0.0, 1), (0.5, 1), (4.0, 1), (4.01, 2), (8.0, 2), (11.2, 3), (16.0, 4), (100.0, 4)],
)
def test_wanted_is_ceil_of_load_over_target_within_min_and_max(load: float, count: int) -> None:
    assert wanted(POLICY, load) == count


def test_up_as_soon_as_the_average_exceeds_the_target() -> None:
    got = decide(POLICY, Scale(count=1), Load(average=11.2, recent=11.2), 1, T)
    assert got.scale.count == 3
    assert got.change == "scaled 1→3: 11.2 in flight on 1 Ready replica, target 4"
    assert got.scale.changed_at == T


def test_at_the_target_nothing_changes() -> None:
    got = decide(POLICY, Scale(count=2), Load(average=8.0, recent=8.0), 2, T)
    assert got == Decision(Scale(count=2))


def test_a_load_step_is_seen_before_the_ten_second_mean_catches_up() -> None:
    # 12 in flight for the last second: the 10-s mean is 1.2, the quick look 12 (>= 2x4x1)
    got = decide(POLICY, Scale(count=1), Load(average=1.2, recent=12.0), 1, T)
    assert got.scale.count == 3
    assert got.change is not None and got.change.startswith("scaled 1→3: 12.0 in flight")


def test_a_small_rise_waits_for_the_ten_second_mean() -> None:
    # 6 in flight lately on 1 replica: under twice the target, the mean decides (1.2 < 4)
    got = decide(POLICY, Scale(count=1), Load(average=1.2, recent=6.0), 1, T)
    assert got.scale.count == 1 and got.change is None


def test_down_only_after_the_delay_to_the_most_wanted_meanwhile() -> None:
    scale = Scale(count=4, changed_at=T - 500)
    first = decide(POLICY, scale, Load(average=2.0, recent=2.0), 4, T)
    assert first.change is None
    assert first.scale == Scale(count=4, low_since=T, low_wants=1, changed_at=T - 500)
    mid = decide(POLICY, first.scale, Load(average=9.0, recent=9.0), 4, T + 30)
    assert mid.change is None and mid.scale.low_wants == 3  # 9 in flight wants 3
    end = decide(POLICY, mid.scale, Load(average=1.0, recent=1.0), 4, T + 60)
    assert end.scale.count == 3  # the most the load asked for during the delay
    assert end.change is not None and end.change.startswith("scaled 4→3: 1.0 in flight")
    assert "60s (scaleDownDelay)" in end.change


def test_load_back_at_the_count_restarts_the_delay() -> None:
    low = Scale(count=3, low_since=T - 50, low_wants=1)
    back = decide(POLICY, low, Load(average=12.0, recent=12.0), 3, T)
    assert back.scale == Scale(count=3)  # no lower load since: the delay starts anew


def test_never_below_min_nor_above_max() -> None:
    idle = decide(POLICY, Scale(count=1, low_since=T - 999), Load(0.0, 0.0), 1, T)
    assert idle.scale.count == 1 and idle.change is None
    flood = decide(POLICY, Scale(count=4), Load(1000.0, 1000.0), 4, T)
    assert flood.scale.count == 4 and flood.change is None


def test_a_narrowed_policy_moves_the_count_inside_it() -> None:
    narrow = Autoscale(min=1, max=2, targetInflight=4)
    got = decide(narrow, Scale(count=4), Load(0.0, 0.0), 4, T)
    assert got.scale.count == 2
    assert got.change == "scaled 4→2: autoscale is now min 1, max 2"


def test_scale_to_zero_after_the_delay_and_back_on_a_waiting_request() -> None:
    quiet = decide(ZERO, Scale(count=1), Load(0.0, 0.0), 1, T)
    gone = decide(ZERO, quiet.scale, Load(0.0, 0.0), 1, T + 30)
    assert gone.scale.count == 0 and gone.change is not None
    assert "fewer than 1 replica's worth" in gone.change, gone.change  # not "1 replicas'"
    asleep = decide(ZERO, gone.scale, Load(0.0, 0.0), 0, T + 100)
    assert asleep.scale.count == 0 and asleep.change is None
    woken = decide(ZERO, gone.scale, Load(0.0, 0.0, waiting=True), 0, T + 101)
    assert woken.scale.count == 1
    assert woken.change == "scaled 0→1: a request waits for it"


@given(
    count=st.integers(1, 4),
    average=st.floats(0, 200, allow_nan=False),
    recent=st.floats(0, 200, allow_nan=False),
    since=st.one_of(st.none(), st.floats(T - 1000, T)),
)
def test_the_count_stays_within_bounds_and_only_an_event_changes_it(
    count: int, average: float, recent: float, since: float | None
) -> None:
    scale = Scale(count=count, low_since=since, low_wants=1 if since else 0)
    got = decide(POLICY, scale, Load(average, recent), count, T)
    assert POLICY.min <= got.scale.count <= POLICY.max
    assert (got.change is not None) == (got.scale.count != count)
    if got.scale.count < count:  # down only once the delay has passed
        assert since is not None and T - since >= POLICY.scale_down_delay


def _figure(writer: str, *samples: tuple[float, float, float]) -> Inflight:
    return Inflight(
        "web", writer, tuple(Sample(at, secs, mean, int(mean)) for at, secs, mean in samples)
    )


def test_the_quick_look_counts_only_covered_time_and_sums_gateways() -> None:
    one = _figure("a", (T - 0.5, 1.0, 12.0))  # one busy second, just reported
    assert average([one], "web", T, 10.0) == pytest.approx(1.2)
    assert recent([one], "web", T, 2.0) == pytest.approx(12.0)
    two = _figure("b", (T - 0.2, 1.0, 3.0))  # a second gateway (a hand-over) adds its own
    assert recent([one, two], "web", T, 2.0) == pytest.approx(15.0)
    old = _figure("c", (T - 5.0, 1.0, 50.0))  # outside the quick window
    assert recent([old], "web", T, 2.0) == 0.0
    assert recent([one], "other", T, 2.0) == 0.0


# -- the edge: counts kept in <state>/scale/ ------------------------------------------------


def _scaler(tmp_path: Path) -> Autoscaler:
    return Autoscaler(tmp_path, Journal(tmp_path))


def test_a_decided_count_is_kept_with_its_event_and_plan_writes_nothing(tmp_path: Path) -> None:
    web = entry("web", autoscale={"min": 1, "max": 3})
    inflight.write(tmp_path, Inflight("web", "g1", (Sample(T - 0.5, 1.0, 12.0, 12),)))
    seen = [record("web", spec=web)]
    assert _scaler(tmp_path).counts({"web": web}, lambda: seen, T, write=False) == {"web": 3}
    assert scale.read_all(tmp_path) == {}  # `plan`: nothing kept
    assert Journal(tmp_path).read("web") == []
    assert _scaler(tmp_path).counts({"web": web}, lambda: seen, T, write=True) == {"web": 3}
    assert scale.read_all(tmp_path)["web"].count == 3
    (event,) = Journal(tmp_path).read("web")
    assert event["action"] == "Scale" and event["reason"].startswith("scaled 1→3: 12.0")


def test_a_broken_manifest_keeps_its_count_a_gone_deployment_loses_it(tmp_path: Path) -> None:
    web = entry("web", autoscale={"min": 1, "max": 3})
    scale.write(tmp_path, "web", Scale(count=3))
    running = [record("web", spec=web), record("web@1", spec=web)]
    _scaler(tmp_path).counts({}, lambda: running, T, write=True)  # its file fails to load
    assert scale.read_all(tmp_path)["web"].count == 3
    plain = entry("web")  # autoscale taken out of a valid manifest: the count is no one's
    _scaler(tmp_path).counts({"web": plain}, lambda: running, T, write=True)
    assert scale.read_all(tmp_path) == {}
    scale.write(tmp_path, "web", Scale(count=3))
    _scaler(tmp_path).counts({}, lambda: [], T, write=True)  # deleted, its records gone
    assert scale.read_all(tmp_path) == {}


def _asked(tmp_path: Path, at: float, inflight: int) -> None:
    """The gateway's activation of ``nap``: its last request at ``at``, ``inflight`` now."""
    stamp = datetime.fromtimestamp(at, UTC)
    activation.write(tmp_path, "nap", Activation(last_request_at=stamp, inflight=inflight))


def test_the_request_that_woke_a_deployment_holds_it_until_the_window_has_seen_it(
    tmp_path: Path,
) -> None:
    """Woken from zero (0→1) by a request, the deployment's in-flight figures say nothing
    of it while it waits for the engine's Ready (the gateway counts a request once an
    engine takes it), nor until the next sample lands after its answer: its count fell
    back to 0 after scaleDownDelay meanwhile, and the request's sample, landing then,
    woke it once more, "scaled 0→1: a request waits for it" with no request sent (a CI
    run of tests/gateway/test_autoscaling.py). The request's activation holds it at 1
    while in flight and for the window after it ended; then the delay, then zero."""
    nap = entry("nap", autoscale={"min": 0, "max": 2, "scaleDownDelay": "1s"})
    woke = Scale(count=1, changed_at=T, reason="scaled 0→1: a request waits for it")
    scale.write(tmp_path, "nap", woke)
    seen = [record("nap", spec=nap, phase=Phase.STARTING)]
    scaler = _scaler(tmp_path)
    for now in (T + 1.0, T + 2.5):  # the delay would start, then be over: the engine starts
        _asked(tmp_path, now - 0.4, inflight=1)  # the gateway's heartbeat while it waits
        assert scaler.counts({"nap": nap}, lambda: seen, now, write=True) == {"nap": 1}
    _asked(tmp_path, T + 3.0, inflight=0)  # answered; its sample is not written yet
    for now in (T + 3.5, T + 5.0, T + 12.9):
        assert scaler.counts({"nap": nap}, lambda: seen, now, write=True) == {"nap": 1}
    assert Journal(tmp_path).read("nap") == []
    for now in (T + 13.1, T + 14.2):  # the window is past it: the delay, then zero
        got = scaler.counts({"nap": nap}, lambda: seen, now, write=True)
    assert got == {"nap": 0}
    (event,) = Journal(tmp_path).read("nap")
    assert event["reason"].startswith("scaled 1→0: 0.0 in flight, fewer than 1 replica's")


# -- autoscale.metric: the engines' own figures ---------------------------------------------

WAITING = Autoscale(min=1, max=4, metric="waiting", target=2, scaleDownDelay=60)
KV = Autoscale(min=1, max=4, metric="kvCache", target=0.5, scaleDownDelay=60)


@pytest.mark.parametrize(
    ("policy", "metric", "load", "count", "change"),
    [
        # load: the figure summed over the Ready replicas; target: per replica
        (WAITING, "waiting", 5.0, 3, "scaled 1→3: 5.0 waiting on 1 Ready replica, target 2"),
        (WAITING, "waiting", 2.0, 1, None),  # at the target
        (WAITING, "waiting", 100.0, 4, "scaled 1→4: 100.0 waiting on 1 Ready replica, target 2"),
        (KV, "kvCache", 0.9, 2, "scaled 1→2: KV cache 0.90 used on 1 Ready replica, target 0.5"),
        (KV, "kvCache", 0.4, 1, None),
        # engines that state nothing: the edge falls back to in flight, targetInflight's aim
        (WAITING, "inflight", 5.0, 2, "scaled 1→2: 5.0 in flight on 1 Ready replica, target 4"),
    ],
)
def test_each_metric_is_aimed_at_its_own_target(
    policy: Autoscale, metric: str, load: float, count: int, change: str | None
) -> None:
    got = decide(policy, Scale(count=1), Load(load, load, metric=metric), 1, T)
    assert (got.scale.count, got.change) == (count, change)


def test_an_engine_metric_scales_down_after_the_delay_in_its_words() -> None:
    scale = Scale(count=3, low_since=T - 61, low_wants=1)
    got = decide(KV, scale, Load(0.3, 0.3, metric="kvCache"), 3, T)
    assert got.scale.count == 1
    assert got.change == (
        "scaled 3→1: KV cache 0.10 used, fewer than 3 replicas' worth for 60s "
        "(scaleDownDelay), target 0.5"
    )


@given(
    count=st.integers(1, 4),
    figure=st.floats(0, 50, allow_nan=False),
    metric=st.sampled_from(["inflight", "waiting", "kvCache"]),
    since=st.one_of(st.none(), st.floats(T - 1000, T)),
)
def test_every_metric_keeps_the_bounds_and_the_delay(
    count: int, figure: float, metric: str, since: float | None
) -> None:
    policy = {"inflight": POLICY, "waiting": WAITING, "kvCache": KV}[metric]
    scale = Scale(count=count, low_since=since, low_wants=1 if since else 0)
    got = decide(policy, scale, Load(figure, figure, metric=metric), count, T)
    assert policy.min <= got.scale.count <= policy.max
    assert (got.change is not None) == (got.scale.count != count)
    if got.scale.count < count:
        assert since is not None and T - since >= policy.scale_down_delay


def test_the_edge_reads_the_engines_figures_for_their_metric(tmp_path: Path) -> None:
    web = entry("web", autoscale={"min": 1, "max": 4, "metric": "waiting", "target": 2})
    seen = [record("web", spec=web), record("web@1", spec=web)]
    # 6 in flight would ask for 2 (target 4); the engines' 3 waiting each (mean per
    # instance) on 2 Ready replicas ask for 3. Two gateways read the same engines: once.
    inflight.write(tmp_path, Inflight("web", "g1", (Sample(T - 0.5, 1.0, 6.0, 6),)))
    for writer in ("g1", "g2"):
        figure = Inflight("web", writer, (Sample(T - 1.0, 5.0, 3.0, 3),))
        inflight.write(tmp_path, figure, "waiting")
    assert (tmp_path / "engineload" / "waiting" / "web.g1.json").is_file()
    assert _scaler(tmp_path).counts({"web": web}, lambda: seen, T, write=True) == {"web": 3}
    (event,) = Journal(tmp_path).read("web")  # no count kept: the 2 replicas running are it
    assert event["reason"] == "scaled 2→3: 6.0 waiting on 2 Ready replicas, target 2"


def test_engines_that_state_nothing_keep_inflight(tmp_path: Path) -> None:
    web = entry("web", autoscale={"min": 1, "max": 4, "metric": "kvCache"})
    inflight.write(tmp_path, Inflight("web", "g1", (Sample(T - 0.5, 1.0, 12.0, 12),)))
    old = Inflight("web", "g1", (Sample(T - 60, 5.0, 1.0, 1),))  # outside the window
    inflight.write(tmp_path, old, "kvCache")
    seen = [record("web", spec=web)]
    assert _scaler(tmp_path).counts({"web": web}, lambda: seen, T, write=False) == {"web": 3}
