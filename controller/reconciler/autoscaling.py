"""The autoscaler's edge: reads the load, decides (``core/scaling/autoscale.py``), keeps the counts.

Each pass asks :meth:`Autoscaler.counts` for the desired count of every autoscaled
deployment: the gateways' in-flight files (or, for ``autoscale.metric: waiting |
kvCache``, the engines' figures the gateway wrote) and the activations are read, the pure rule
decides, and a changed count is written to ``<state>/scale/`` with an event saying why.
``reconcile plan`` asks too, with ``write=False``: it shows the count a pass would use
and changes nothing. Between passes the daemon asks :meth:`Autoscaler.due` (cheap: no
manifests, no probes) whether a pass would change a count, and runs one if so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from controller.core.manifest.names import base_name
from controller.core.manifest.specs import Autoscale, Entry
from controller.core.replicaset import group
from controller.core.scaling import inflight as rule_inflight
from controller.core.scaling.autoscale import PANIC_WINDOW, WINDOW, Load, Scale, decide
from controller.core.scaling.inflight import Inflight
from controller.core.state import Activation, Record
from controller.store import sidefiles
from controller.store.instances.events import Journal
from controller.store.side import activation, inflight, scale
from controller.store.statedir import StateDir


@dataclass(frozen=True, slots=True)
class Policy:
    autoscale: Autoscale
    initial: int  # the spec's count, before the autoscaler ever decided


class Autoscaler:
    def __init__(self, state_dir: Path, journal: Journal) -> None:
        self.state_dir = state_dir
        self.journal = journal
        self.policies: dict[str, Policy] = {}  # the last pass's autoscaled deployments
        # The last call's word per deployment: the change it made (or a pass would
        # make), else the stored reason of the count as it stands.
        self.notes: dict[str, str] = {}

    def counts(
        self,
        entries: Mapping[str, Entry],
        records: Callable[[], Iterable[Record]],
        now: float,
        *,
        write: bool,
    ) -> dict[str, int]:
        """Deployment -> its desired count, for every autoscaled deployment in ``entries``
        (``records`` is called only when there is one: most passes have none)."""
        self.policies = {
            name: Policy(spec.autoscale, spec.initial_replicas)
            for name, entry in entries.items()
            if (spec := entry.deployment.spec).autoscale is not None
        }
        stored = scale.read_all(self.state_dir, peek=not write)  # `plan` moves nothing
        once = functools.cache(lambda: list(records()))  # the store read at most once
        if write and set(stored) - set(self.policies):
            self._forget(stored, entries, once())
        if not self.policies:
            return {}
        decided = self._decide(stored, once(), now, peek=not write)
        self.notes = {name: change or after.reason for name, (_, after, change) in decided.items()}
        if write:
            for name, (before, after, change) in decided.items():
                if after != before:
                    self._keep(name, after)
                if change is not None:
                    count = f"{after.count} replica{'' if after.count == 1 else 's'}"
                    self.journal.append(name, "Scale", change, count)
        return {name: after.count for name, (_, after, _) in decided.items()}

    def _keep(self, name: str, after: Scale) -> None:
        try:
            scale.write(self.state_dir, name, after)
        except OSError as exc:  # not kept: this pass still uses the count, the next decides again
            sidefiles.warn(StateDir(self.state_dir).scale, f"count of {name} not kept: {exc}")

    def _forget(
        self, stored: Mapping[str, Scale], entries: Mapping[str, Entry], records: Iterable[Record]
    ) -> None:
        """Drop the counts no one will read: a deployment no longer autoscaled, or gone
        with its records. A manifest that is broken for now keeps its count (invariant 4:
        its engines run on, and fixing a typo must not scale them back to the spec's)."""
        running = {base_name(r.name) for r in records}
        for name in set(stored) - set(self.policies):
            if name in entries or name not in running:
                scale.forget(self.state_dir, name)

    def due(self, records: Iterable[Record], now: float) -> bool:
        """Would a pass now change a count (or note the start of a lower load)?"""
        if not self.policies:
            return False
        stored = scale.read_all(self.state_dir)
        return any(
            after != before for before, after, _ in self._decide(stored, records, now).values()
        )

    def _decide(
        self,
        stored: Mapping[str, Scale],
        records: Iterable[Record],
        now: float,
        *,
        peek: bool = False,
    ) -> dict[str, tuple[Scale, Scale, str | None]]:
        metrics = {p.autoscale.metric for p in self.policies.values()} | {"inflight"}
        figures = {m: inflight.read_all(self.state_dir, m, peek=peek) for m in metrics}
        demand = activation.read_all(self.state_dir, peek=peek)
        sets = group(records)
        ready = {rs.name: rs.ready for rs in sets}
        held = {rs.name: rs.desired for rs in sets}
        out: dict[str, tuple[Scale, Scale, str | None]] = {}
        for name, policy in self.policies.items():
            before = stored.get(name) or Scale(count=_counted(policy, held.get(name)))
            act = demand.get(name)
            waits = _waits(act, before, now) if before.count == 0 else _holds(act, now)
            metric = policy.autoscale.metric
            load = _engine_load(figures[metric], name, metric, ready.get(name, 0), now)
            if load is None:  # inflight, or engines that state nothing: the gateway's count
                load = Load(
                    average=rule_inflight.average(figures["inflight"], name, now, WINDOW),
                    recent=rule_inflight.recent(figures["inflight"], name, now, PANIC_WINDOW),
                )
            load = replace(load, waiting=waits)
            decision = decide(policy.autoscale, before, load, ready.get(name, 0), now)
            out[name] = (before, decision.scale, decision.change)
        return out


def _counted(policy: Policy, held: int | None) -> int:
    """The count to start from when none is kept: the replicas the records hold (inside
    min and max), else the spec's. A count lost (its file torn and quarantined, removed)
    started again from the spec's and stopped the replicas above it at once, healthy and
    under load, past scaleDownDelay; an HPA added to a Deployment starts from its replicas."""
    if held is None:
        return policy.initial
    return min(max(held, policy.autoscale.min), policy.autoscale.max)


def _engine_load(
    figures: Iterable[Inflight], name: str, metric: str, ready: int, now: float
) -> Load | None:
    """The engines' own figure for ``name`` over the window, summed over its Ready replicas
    (the gateway wrote the mean per instance); None for inflight, or when no engine of it
    stated the metric within the window. Their reads come every few seconds, so the mean
    is over the time samples cover (not with the rest as 0), and two gateways reading the
    same engines during a handover count once (the larger)."""
    if metric == "inflight":
        return None
    mine = [
        f for f in figures if f.deployment == name and any(s.at > now - WINDOW for s in f.samples)
    ]
    if not mine:
        return None
    per_replica = max(rule_inflight.recent([f], name, now, WINDOW) for f in mine)
    total = per_replica * max(ready, 1)
    return Load(average=total, recent=total, metric=metric)


def _holds(act: Activation | None, now: float) -> bool:
    """Woken from zero, the deployment's request (the gateway writes an activation for
    one that came while it was at zero) is in flight or ended within the window: its
    load is not in the in-flight figures yet (it waited for the engine's Ready, and its
    sample lands a second or so after its answer). The gateway refreshes the stamp while
    it is in flight, so a crashed gateway's ``inflight`` holds nothing past the window."""
    if act is None or act.released:  # unloaded from the web page: parked on purpose
        return False
    return abs(now - act.last_request_at.timestamp()) < WINDOW


def _waits(act: Activation | None, at_zero: Scale, now: float) -> bool:
    """A request came for a deployment scaled to zero: one in flight now, or one since it
    went to zero within the last window (an activation left from long ago wakes nothing)."""
    if act is None:
        return False
    if act.inflight > 0:
        return True
    last = act.last_request_at.timestamp()
    # A change "in the future" is one the wall clock has since gone back past: the wall
    # cannot order it against a request, so a request of the last window wakes it (one
    # from before the step lies in the future too, and is no request of the window).
    since = last > at_zero.changed_at or at_zero.changed_at > now
    return since and abs(now - last) < WINDOW  # either side: a gateway stamps after `now`
