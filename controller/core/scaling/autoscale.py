"""The autoscaler's rule (pure): a deployment's desired replica count from its load.

The load is the figure ``autoscale.metric`` names, summed over the deployment's Ready
replicas: the gateway's requests in flight (``core/scaling/inflight.py``), or the
engines' own requests waiting or KV cache use (their mean per instance, as the gateway
reads them, times the Ready replicas); its target is per replica
(``Autoscale.target_of``). The count:

- rises as soon as the 10-s average exceeds the target per replica
  (to ``ceil(average / target)``, at most ``max``);
- rises at once, without waiting for the 10-s average to catch up, when the last
  seconds' load is at least twice what the current count is meant for: Knative's
  "panic" window, so a load step is answered in about a second rather than after
  the several seconds a 10-s mean takes to cross the target;
- falls only after ``scaleDownDelay`` of lower load (by the mean and the last seconds
  both), to the most replicas that load asked for meanwhile (Kubernetes' HPA
  stabilisation window), never below ``min``;
- from 0 (``min: 0``, scale to zero), rises to 1 when a request waits: the gateway's
  activation, as for an OnDemand deployment; and falls back to 0 only once that
  request's end is a window old (``Load.waiting``): the in-flight figures count a
  request only once an engine took it and the gateway's next sample landed, so the
  woken engine's first request (waiting for its Ready, then answered) is in them late.

No clock and no I/O: ``now`` (Unix seconds) and the load come in; the stored
:class:`Scale` goes in and comes back, changed or not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the policy's type only: status reads Scale without loading pydantic
    from controller.core.manifest.specs import Autoscale

WINDOW = 10.0  # seconds the in-flight average is taken over
PANIC_WINDOW = 2.0  # seconds of the quick look at a load step
PANIC_FACTOR = 2.0  # the quick look acts once the load is this many times the target


@dataclass(frozen=True, slots=True)
class Load:
    average: float  # requests in flight over the last WINDOW seconds (idle time counts 0)
    recent: float  # ... over the last PANIC_WINDOW seconds the gateways reported
    # A request waits for the deployment while it runs nothing; above zero, the request
    # that woke it is in flight or ended within WINDOW: no scale to zero then.
    waiting: bool = False
    metric: str = "inflight"  # what average and recent count (inflight, waiting, kvCache)


@dataclass(frozen=True, slots=True)
class Scale:
    """The autoscaler's state of one deployment, kept in the state dir between passes."""

    count: int
    low_since: float | None = None  # the load has asked for fewer replicas since then
    low_wants: int = 0  # the most replicas it asked for meanwhile
    changed_at: float = 0.0  # the last change of ``count``
    reason: str = ""  # ... and why


@dataclass(frozen=True, slots=True)
class Decision:
    scale: Scale
    change: str | None = None  # the event's text when the count changed


def wanted(policy: Autoscale, load: float, metric: str = "inflight") -> int:
    """Replicas for ``load`` (of ``metric``, summed over the replicas), within min..max."""
    need = math.ceil(load / policy.target_of(metric) - 1e-9) if load > 0 else 0
    return max(policy.min, min(policy.max, need))


def decide(policy: Autoscale, scale: Scale, load: Load, ready: int, now: float) -> Decision:
    """The next state of ``scale`` given the load now; ``ready``: Ready replicas (for the
    event's words only)."""
    count = scale.count
    if not policy.min <= count <= policy.max:
        new = max(policy.min, min(policy.max, count))
        return _changed(scale, new, f"autoscale is now min {policy.min}, max {policy.max}", now)
    if count == 0 and (load.waiting or load.average > 0 or load.recent > 0):
        new = max(1, wanted(policy, max(load.average, load.recent), load.metric))
        return _changed(scale, new, "a request waits for it", now)
    target = policy.target_of(load.metric)
    up = wanted(policy, load.average, load.metric)
    if load.recent >= PANIC_FACTOR * target * max(count, 1):
        up = max(up, wanted(policy, load.recent, load.metric))
    if up > count:
        figure = max(load.average, load.recent)
        return _changed(scale, up, _why(figure, ready, policy, load.metric), now)
    # Lower only when the last seconds agree with the mean: after a quick rise the 10-s
    # mean lags behind the load for the rest of its window.
    down = wanted(policy, max(load.average, load.recent), load.metric)
    if load.waiting:  # the figures count a request once an engine took it and a sample
        down = max(down, 1)  # landed: the one that woke it is in them late, or not yet
    if down >= count:
        return Decision(replace(scale, low_since=None, low_wants=0))
    return _lower(policy, scale, down, load, now)


def _lower(policy: Autoscale, scale: Scale, wants: int, load: Load, now: float) -> Decision:
    """Fewer replicas would do: only after ``scaleDownDelay`` of it."""
    most = wants if scale.low_since is None else max(scale.low_wants, wants)
    if scale.low_since is None or scale.low_since > now:
        # It starts now; or it started "in the future", so the wall clock has gone back
        # since: the delay starts again from now, never an hour longer.
        return Decision(replace(scale, low_since=now, low_wants=most))
    if now - scale.low_since < policy.scale_down_delay:
        return Decision(replace(scale, low_wants=most))
    delay = f"{policy.scale_down_delay:g}s"
    why = (
        f"{_figure(load.average, scale.count, load.metric)}, fewer than "
        f"{_replicas_worth(scale.count)} for {delay} (scaleDownDelay), "
        f"target {policy.target_of(load.metric):g}"
    )
    return _changed(scale, most, why, now)


def _changed(scale: Scale, count: int, why: str, now: float) -> Decision:
    text = f"scaled {scale.count}→{count}: {why}"
    return Decision(Scale(count=count, changed_at=now, reason=text), text)


def _why(load: float, ready: int, policy: Autoscale, metric: str) -> str:
    replicas = "replica" if ready == 1 else "replicas"
    aim = policy.target_of(metric)
    return f"{_figure(load, ready, metric)} on {ready} Ready {replicas}, target {aim:g}"


def _figure(load: float, replicas: int, metric: str) -> str:
    """The load in the metric's words: kvCache's as the fill per replica, as its target."""
    if metric == "kvCache":
        return f"KV cache {load / max(replicas, 1):.2f} used"
    return f"{load:.1f} {'waiting' if metric == 'waiting' else 'in flight'}"


def _replicas_worth(n: int) -> str:
    return f"{n} replica's worth" if n == 1 else f"{n} replicas' worth"
