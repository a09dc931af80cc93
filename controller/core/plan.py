"""The planner: (desired, observed, inventory, now) -> ordered actions. Pure.

No clock, no I/O: ``now`` and every observation come in as arguments, so the
same inputs always give the same plan (kubelet's computePodActions, pip-tools'
diff). Each action carries the reason `reconcile plan` prints.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from controller.core import limits as limits_mod
from controller.core.actions import (
    Adopt,
    AnyAction,
    Conflict,
    Fail,
    Hold,
    MarkReady,
    MarkSpec,
    Park,
    Preempt,
    Promote,
    Reap,
    Reject,
    Release,
    Replace,
    Restart,
    Resync,
    Start,
    Stop,
    Update,
)
from controller.core.engines.share import user_share
from controller.core.inventory import Inventory
from controller.core.limits import Limits
from controller.core.placement import Placed, Unplaced, ledger_for, place, place_devices
from controller.core.preempt import Candidate, choose_victims
from controller.core.specs import (
    DeploymentSpec,
    Entry,
    base_name,
    changed_fields,
    is_next,
    next_name,
    spec_document,
)
from controller.core.state import Activation, MarkedProcess, Observed, Phase, Record, RecordView

BACKOFF_FIRST = 10.0
BACKOFF_MAX = 300.0
BACKOFF_RESET = 600.0  # seconds Ready after which a crash counts as the first again
# Spec fields a running engine never sees: a change to only these updates the record.
IN_PLACE = ("readiness", "restartPolicy", "stopGracePeriodSeconds", "priority")
PREEMPTED = "preempted by "  # a Pending record's message: it keeps saying why while it waits
PREEMPTIBLE = (Phase.STARTING, Phase.READY, Phase.BACKOFF)


@dataclass(frozen=True, kw_only=True, slots=True)
class Desired:
    owner: str
    entries: Mapping[str, Entry] = field(default_factory=dict)
    invalid: Mapping[str, str] = field(default_factory=dict)  # name -> error
    broken_sources: frozenset[str] = frozenset()
    source_errors: Mapping[str, str] = field(default_factory=dict)  # broken file -> its error
    prune: bool = True  # False: a folder is missing or empty (invariant 5)
    # OnDemand deployments the gateway asked for: name -> last request (and in flight).
    activations: Mapping[str, Activation] = field(default_factory=dict)


def restarts_after(policy: str, code: int | None) -> bool:
    """Whether ``restartPolicy`` restarts an engine that exited with ``code`` (None: unknown)."""
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def backoff(restarts: int) -> float:
    """Delay before restart number ``restarts + 1``: 0, 10, 20, 40 ... 300 s."""
    if restarts <= 0:
        return 0.0
    return float(min(BACKOFF_FIRST * 2.0 ** (restarts - 1), BACKOFF_MAX))


def plan(
    desired: Desired,
    observed: Observed,
    inventory: Inventory,
    now: datetime,
    *,
    extra_ports: Mapping[str, int] | None = None,
    limits: Limits | None = None,
) -> list[AnyAction]:
    planner = _Planner(desired, observed, inventory, now, extra_ports or {}, limits or Limits())
    actions = planner.actions()
    return sorted(actions, key=lambda a: (a.order, a.name))


class _Planner:
    def __init__(
        self,
        desired: Desired,
        observed: Observed,
        inventory: Inventory,
        now: datetime,
        extra_ports: Mapping[str, int],
        limits: Limits,
    ) -> None:
        self.desired = desired
        self.observed = observed
        self.inventory = inventory
        self.now = now
        self.extra_ports = extra_ports
        self.ledger = ledger_for((v.record for v in observed.records.values()), observed)
        self.limits = limits
        self.instances = {  # what counts against maxInstances, updated as starts are planned
            n: limits_mod.kinds_of(v.record.devices)
            for n, v in observed.records.items()
            if v.record.holds and not v.record.elsewhere(observed.node)
        }
        drain = observed.drain
        self.drain = drain if drain is not None and drain.active(now) else None
        # Starts wait until every record has been judged, then go highest priority first.
        self.wanted: list[tuple[Entry, str]] = []
        self.preempted: set[str] = set()
        self.candidates: list[Candidate] = []

    def actions(self) -> list[AnyAction]:
        found = list(self.run())
        leaving = frozenset(a.name for a in found if a.frees_now())
        found += self._placements(leaving)
        # A preempted record's own action (ready, restart...) gives way to its preemption.
        return [a for a in found if a.name not in self.preempted or isinstance(a, Preempt | Reap)]

    def run(self) -> Iterator[AnyAction]:
        yield from self._orphans()
        names = set(self.desired.entries) | set(self.observed.records) | set(self.desired.invalid)
        for name in sorted(names):
            entry = self.desired.entries.get(name)
            view = self.observed.records.get(name)
            if view is None:
                if name in self.observed.unreadable or next_name(name) in self.observed.records:
                    continue  # never over an unknown version; a `@next` takes the name
                if entry is not None and self._parked(entry, None):
                    yield Park(name=name, reason="OnDemand: idle until a request", entry=entry)
                elif entry is not None:
                    self.wanted.append((entry, "new deployment"))
                else:  # every deployment a pass has seen gets a record, so status shows it
                    error = self.desired.invalid[name]
                    yield Reject(name=name, reason=f"spec invalid (not started): {error}")
            elif view.record.elsewhere(self.observed.node):
                continue  # another node's record: only that node may act on it
            elif view.record.owner != self.desired.owner:
                yield from self._foreign(view, entry)
            else:
                yield from self._own(view, entry)

    # -- records of other manifest sets ----------------------------------------

    def _foreign(self, view: RecordView, entry: Entry | None) -> Iterator[AnyAction]:
        rec = view.record
        if rec.phase is Phase.RESERVED and not view.maker_alive:
            yield self._resolve_reservation(view)  # invariant 3 binds every pass
        elif entry is not None:
            yield Conflict(
                name=rec.name,
                reason=f"name {rec.name!r} is owned by another manifest set ({rec.owner}, "
                f"from {rec.source}): rename one of them",
            )

    # -- our records -------------------------------------------------------------

    def _own(self, view: RecordView, entry: Entry | None) -> Iterator[AnyAction]:
        rec = view.record
        if rec.phase is Phase.RESERVED:
            if not view.maker_alive:
                yield self._resolve_reservation(view)
            return
        if rec.phase is Phase.TERMINATING:
            yield Stop(name=rec.name, reason="finishing an interrupted teardown")
            return
        if is_next(rec.name):
            yield from self._next(view)
            return
        if entry is None:
            yield from self._undeclared(view)
            return
        if not rec.spec_valid:
            yield MarkSpec(name=rec.name, reason="manifest is valid again", valid=True)
        if self._parked(entry, rec):
            if rec.phase is not Phase.IDLE or rec.spec_hash != entry.hash:
                yield Park(name=rec.name, reason=self._idle_reason(entry, rec), entry=entry)
            return
        if rec.phase is Phase.IDLE:
            self.wanted.append((entry, "requested through the gateway"))
            return
        if rec.spec_hash != entry.hash:
            yield from self._changed(view, entry)
            return
        labels = entry.deployment.metadata.labels
        if view.alive and rec.port is not None and rec.labels != labels:  # no restart: no spec
            yield Update(name=rec.name, reason="metadata.labels changed", entry=entry)
        yield from self._lifecycle(view, entry)

    def _undeclared(self, view: RecordView) -> Iterator[AnyAction]:
        rec = view.record
        error = self.desired.invalid.get(rec.name)
        if error is None and rec.source in self.desired.broken_sources:
            error = self.desired.source_errors.get(rec.source, f"{rec.source} could not be loaded")
        if error is not None:  # invariant 4: keep it running, say why
            if rec.phase in (Phase.STARTING, Phase.READY) and not view.alive:
                # Its engine died meanwhile: record that (no restart without a valid spec).
                exit_text = str(view.exit) if view.exit else "exited"
                reason = f"engine {exit_text}; no restart until its manifest is valid"
                yield Fail(
                    name=rec.name,
                    reason=reason,
                    phase=Phase.BACKOFF,
                    restarts=rec.restarts,
                    exit=view.exit,
                )
                return
            message = f"spec invalid ({_engine_state(view)}): {error}"
            if rec.spec_valid or rec.message != message:
                yield MarkSpec(name=rec.name, reason=message, valid=False)
            return
        if not self.desired.prune:
            return  # invariant 5: an empty or missing folder prunes nothing
        if view.alive or view.markers or rec.holds:
            yield Stop(name=rec.name, reason=f"manifest removed (was {rec.source})")
        else:
            yield Release(name=rec.name, reason="manifest removed", nonce=rec.nonce)

    def _changed(self, view: RecordView, entry: Entry) -> Iterator[AnyAction]:
        rec = view.record
        fields = tuple(changed_fields(rec.spec, spec_document(entry.deployment.spec)))
        shown = ", ".join(f"spec.{f}" for f in fields) or "spec"
        if view.alive and fields and all(f.split(".")[0] in IN_PLACE for f in fields):
            yield Update(name=rec.name, reason=f"{shown} changed", entry=entry, fields=fields)
        elif view.alive and next_name(rec.name) in self.observed.records:
            yield from self._running(view)  # rolling: the old one serves until the new is Ready
        elif _rolling(entry) and view.alive and rec.phase is Phase.READY:
            yield self._roll(entry, f"{shown} changed", fields)
        elif view.alive or view.markers or rec.holds:
            yield Replace(name=rec.name, reason=f"{shown} changed", fields=fields)
        else:
            yield Release(name=rec.name, reason=f"{shown} changed", nonce=rec.nonce)

    # -- RollingUpdate: the new instance beside the old ------------------------------------

    def _roll(self, entry: Entry, why: str, fields: tuple[str, ...]) -> AnyAction:
        """Start ``<name>@next`` beside the Ready old instance, or recreate if no room."""
        nxt = next_name(entry.name)
        placed = self._start(entry, f"rolling update ({why}): {nxt} beside the old", record=nxt)
        if isinstance(placed, Start):
            return placed
        reason = f"{why}; no room for both: recreating ({placed.reason})"
        return Replace(name=entry.name, reason=reason, fields=fields)

    def _next(self, view: RecordView) -> Iterator[AnyAction]:
        """A RollingUpdate's new instance: its own lifecycle until Ready, then promoted."""
        rec = view.record  # ours, neither Reserved nor Terminating: `_own` saw to those
        base = base_name(rec.name)
        entry = self.desired.entries.get(base)
        old = self.observed.records.get(base)
        if entry is None or not _rolling(entry) or rec.spec_hash != entry.hash:
            yield from self._abandon(view, entry)
        elif old is None or old.record.nonce == rec.nonce:
            # The old record is gone (stopped, or a promote interrupted after its rename).
            yield Promote(name=base, reason=f"{rec.name} takes the name {base}")
        elif old.record.phase is Phase.TERMINATING:
            return  # the old one's teardown is finished first (its Stop); then the rename
        elif view.alive and rec.phase is Phase.READY:
            yield Promote(name=base, reason=f"rolling update: {rec.name} is Ready; old drains")
        elif rec.phase in (Phase.PENDING, Phase.IDLE):
            yield Release(name=rec.name, reason="not a rolling update's state", nonce=rec.nonce)
        else:  # Starting, crashed, backing off, failed: the old instance keeps serving
            yield from self._lifecycle(view, entry)

    def _abandon(self, view: RecordView, entry: Entry | None) -> Iterator[AnyAction]:
        """The new instance is no longer wanted: stop it (the old one is untouched)."""
        rec = view.record
        base = base_name(rec.name)
        if entry is None:
            broken = base in self.desired.invalid or rec.source in self.desired.broken_sources
            if broken or not self.desired.prune:
                return  # invariants 4 and 5: a broken or missing manifest stops nothing
            why = "manifest removed"
        elif not _rolling(entry):
            why = "strategy is no longer RollingUpdate"
        else:
            why = "the spec changed again: a fresh rolling update follows"
        if view.alive or view.markers or rec.holds:
            yield Stop(name=rec.name, reason=f"rolling update abandoned: {why}")
        else:
            yield Release(name=rec.name, reason=f"rolling update abandoned: {why}", nonce=rec.nonce)

    def _lifecycle(self, view: RecordView, entry: Entry) -> Iterator[AnyAction]:
        rec = view.record
        if rec.phase is Phase.PENDING:
            self.wanted.append((entry, "retrying placement"))
        elif rec.phase in (Phase.FAILED, Phase.SUCCEEDED):
            return  # terminal until the spec changes
        elif view.alive and _moved(view):
            yield _resync(view)
        elif view.alive:
            yield from self._running(view)
        elif rec.phase is Phase.BACKOFF:
            yield from self._backoff_due(view, entry)
        else:
            yield self._exited(view)

    def _running(self, view: RecordView) -> Iterator[AnyAction]:
        rec = view.record
        if self.drain is not None and self.drain.evict:
            yield Stop(name=rec.name, reason=f"evicted: {self._drain_text()}")
        elif rec.phase is Phase.STARTING:
            if view.probe is not None and view.probe.ready:
                yield MarkReady(name=rec.name, reason=view.probe.detail)
            elif rec.ready_deadline_at is not None and self.now >= rec.ready_deadline_at:
                last = f" (last probe: {view.probe.detail})" if view.probe else ""
                yield self._retry(rec, f"not ready by its readiness deadline{last}")

    def _backoff_due(self, view: RecordView, entry: Entry) -> Iterator[AnyAction]:
        rec = view.record
        if rec.backoff_until is not None and self.now < rec.backoff_until:
            return
        if self.drain is not None:
            return  # nothing restarts while the node is drained
        taken = [p for p in rec.ports if p in self.observed.listening]
        if taken:  # a restart there would only crash-loop: release, place afresh next round
            reason = f"port {taken[0]} was taken by another process while the engine was down"
            yield Release(name=rec.name, reason=reason, nonce=rec.nonce)
            return
        yield Restart(
            name=rec.name,
            reason=f"back-off over (restart {rec.restarts + 1})",
            entry=entry,
            restarts=rec.restarts + 1,
        )

    def _exited(self, view: RecordView) -> AnyAction:
        rec = view.record
        exit_text = str(view.exit) if view.exit else "exited"
        code = view.exit.code if view.exit else None
        if not restarts_after(rec.restart_policy, code):
            phase = Phase.SUCCEEDED if code == 0 else Phase.FAILED
            reason = f"engine {exit_text}; restartPolicy {rec.restart_policy}"
            return Fail(name=rec.name, reason=reason, phase=phase, exit=view.exit)
        return self._retry(rec, f"engine {exit_text}", view)

    def _retry(self, rec: Record, why: str, view: RecordView | None = None) -> Fail:
        restarts = rec.restarts
        if rec.ready_at is not None and (self.now - rec.ready_at).total_seconds() >= BACKOFF_RESET:
            restarts = 0  # it ran fine for 10 minutes: this crash counts as the first
        if rec.restart_policy == "Never":
            return Fail(name=rec.name, reason=f"{why}; restartPolicy Never", phase=Phase.FAILED)
        delay = backoff(restarts)
        retry_at = self.now + timedelta(seconds=delay)
        when = "now" if delay == 0 else f"in {delay:g}s"
        return Fail(
            name=rec.name,
            reason=f"{why}; restart {when}",
            phase=Phase.BACKOFF,
            retry_at=retry_at,
            restarts=restarts,
            exit=view.exit if view else None,
        )

    # -- reservations and orphans ----------------------------------------------------

    def _resolve_reservation(self, view: RecordView) -> AnyAction:
        rec = view.record
        leader = _leader(view.markers)
        if leader is not None:
            return Adopt(
                name=rec.name,
                reason=f"its maker (pid {_pid(rec)}) is gone; engine pid {leader.ref.pid} runs",
                ref=leader.ref,
            )
        return Release(
            name=rec.name,
            reason=f"reservation's maker (pid {_pid(rec)}) is gone and no engine was spawned",
            nonce=rec.nonce,
        )

    def _orphans(self) -> Iterator[AnyAction]:
        by_nonce: dict[str, list[MarkedProcess]] = {}
        for proc in self.observed.orphans:
            by_nonce.setdefault(proc.nonce, []).append(proc)
        for nonce, procs in sorted(by_nonce.items()):
            pids = ", ".join(str(p.ref.pid) for p in procs)
            yield Reap(
                name=procs[0].name,
                reason=f"engine processes ({pids}) of instance {nonce} have no record",
                processes=tuple(procs),
            )

    # -- placement ---------------------------------------------------------------------

    def _start(self, entry: Entry, why: str, *, record: str | None = None) -> Start | Hold:
        """Start ``entry`` as record ``record`` (default: its own name), or Hold saying why."""
        name = record or entry.name
        spec = entry.deployment.spec
        if self.drain is not None:
            return Hold(name=entry.name, reason=self._drain_text(), entry=entry)
        room = self._room(spec)
        if isinstance(room, str):
            return Hold(name=entry.name, reason=room, entry=entry)
        placed = place(spec, room, self.ledger, self.extra_ports.get(spec.engine, 0))
        if isinstance(placed, Unplaced):
            reason = limits_mod.explain(placed.reason, self.inventory, room, self.limits)
            if placed.field is not None:  # no pass can place it: point at the manifest
                reason = f"{entry.source}:{entry.line}: {reason}"
            return Hold(name=entry.name, reason=reason, entry=entry)
        self.ledger.take(
            name, placed.devices, placed.ports, spec.devices.shareable, spec.devices.memory
        )
        self.instances[name] = limits_mod.kinds_of(placed.devices)
        where = ",".join(placed.devices) or "no devices"
        keyed = self.inventory.by_key()
        note = user_share(spec, tuple(keyed[d] for d in placed.devices if d in keyed))
        return Start(
            name=name,
            reason=f"{why}: {where}, port {placed.port}{note}",
            entry=entry,
            devices=placed.devices,
            port=placed.port,
            extra_ports=placed.extra_ports,
        )

    def _room(self, spec: DeploymentSpec) -> Inventory | str:
        """The devices ``spec`` may use under the node's limits, or why none."""
        return limits_mod.room(
            count=spec.devices.count,
            kind=spec.devices.kind,
            inventory=self.inventory,
            instances=self.instances,
            limits=self.limits,
        )

    # -- OnDemand (the gateway) --------------------------------------------------------

    def _parked(self, entry: Entry, rec: Record | None) -> bool:
        """An OnDemand deployment nobody asked for within its idleTimeout stays Idle.

        The gateway refreshes ``last_request_at`` while requests are in flight, so a
        stale activation (a crashed daemon's) expires by itself.
        """
        spec = entry.deployment.spec
        if spec.activation != "OnDemand":
            return False
        act = self.desired.activations.get(entry.name)
        if act is None:
            return True
        since = rec.idle_since if rec is not None and rec.phase is Phase.IDLE else None
        if since is not None and act.last_request_at <= since:
            return True  # parked (idle or swapped out) after its last request
        return (self.now - act.last_request_at).total_seconds() >= spec.idle_timeout

    def _idle_reason(self, entry: Entry, rec: Record) -> str:
        if rec.phase in (Phase.PENDING, Phase.IDLE) or not rec.holds:
            return "OnDemand: idle until a request"
        return f"idle: no request for {entry.deployment.spec.idle_timeout:g}s (idleTimeout)"

    def _busy(self, name: str) -> bool:
        act = self.desired.activations.get(name)
        return act is not None and act.inflight > 0

    def _last_request(self, name: str) -> float:
        act = self.desired.activations.get(name)
        return act.last_request_at.timestamp() if act is not None else 0.0

    def _swap(self, entry: Entry) -> list[AnyAction]:
        """Park idle OnDemand engines of no higher priority, LRU first, to make room.

        Empty when no such set makes room; else the Parks and a Hold that the next
        round (the room freed) turns into the Start.
        """
        if self.drain is not None:
            return []
        room = self._room(entry.deployment.spec)
        if isinstance(room, str):
            return []
        victims = self._swap_victims(entry, room)
        if not victims:
            return []
        reason = f"swapped out for {entry.name} (idle OnDemand, least recently used)"
        parks: list[AnyAction] = [
            Park(name=v, reason=reason, entry=self.desired.entries[v]) for v in victims
        ]
        hold = Hold(
            name=entry.name, reason=f"making room: stopping idle {', '.join(victims)}", entry=entry
        )
        return [*parks, hold]

    def _swap_victims(self, entry: Entry, room: Inventory) -> list[str]:
        spec = entry.deployment.spec
        candidates = []
        for name, view in self.observed.records.items():
            other = self.desired.entries.get(name)
            rec = view.record
            if name == entry.name or other is None or rec.owner != self.desired.owner:
                continue
            if other.deployment.spec.activation != "OnDemand" or rec.phase is not Phase.READY:
                continue
            if other.deployment.spec.priority <= spec.priority and not self._busy(name):
                candidates.append(name)
        candidates.sort(key=self._last_request)
        extra = self.extra_ports.get(spec.engine, 0)
        chosen: list[str] = []
        for name in candidates:
            chosen.append(name)
            if isinstance(place(spec, room, self.ledger.without(chosen), extra), Placed):
                return chosen
        return []

    # -- priority and preemption ---------------------------------------------------------

    def _placements(self, leaving: frozenset[str]) -> list[AnyAction]:
        out: list[AnyAction] = []
        self.candidates = self._candidates(leaving)  # once: a big plan stays linear
        for entry, why in sorted(self.wanted, key=_by_priority):
            action = self._start(entry, why)
            if not isinstance(action, Hold):
                out.append(action)
            elif entry.deployment.spec.activation == "OnDemand" and (swap := self._swap(entry)):
                out += swap
            else:
                out += self._preempt(entry, why, action, leaving)
        return out

    def _preempt(
        self, entry: Entry, why: str, hold: Hold, leaving: frozenset[str]
    ) -> list[AnyAction]:
        """Start ``entry`` by stopping lower priorities, or keep it waiting (one Hold)."""
        spec = entry.deployment.spec
        lower = [
            c
            for c in self.candidates
            if c.priority < spec.priority and c.name not in self.preempted
        ]
        if not lower or spec.devices.count == 0 or self.drain is not None:
            return [self._waiting(entry, hold)]
        soon = self.ledger.without(leaving) if leaving else self.ledger
        if not isinstance(place_devices(spec, self.inventory, soon), Unplaced):
            return [hold]  # this round's teardowns make room: wait, preempt nobody
        victims = choose_victims(spec, self.inventory, self.ledger, lower)
        if not victims:
            return [self._waiting(entry, hold)]
        saved, instances = self.ledger.copy(), dict(self.instances)
        for name in victims:
            self.ledger.release(name)
            self.instances.pop(name, None)
        start = self._start(entry, why)
        if not isinstance(start, Start):  # a port or a limit still refuses: stop nobody
            self.ledger, self.instances = saved, instances
            return [self._waiting(entry, hold)]
        self.preempted.update(victims)
        reason = f"{PREEMPTED}{entry.name} (priority {spec.priority})"
        stops: list[AnyAction] = [
            Preempt(name=v, reason=reason, by=entry.name, priority=spec.priority) for v in victims
        ]
        return [replace(start, reason=f"{start.reason}; preempting {', '.join(victims)}"), *stops]

    def _candidates(self, leaving: frozenset[str]) -> list[Candidate]:
        """Our running deployments with a valid manifest that no other action moves."""
        out = []
        for name, view in self.observed.records.items():
            rec, entry = view.record, self.desired.entries.get(name)
            if (
                entry is None
                or rec.owner != self.desired.owner
                or rec.phase not in PREEMPTIBLE
                or not rec.spec_valid
                or rec.spec_hash != entry.hash
                or name in leaving
            ):
                continue
            out.append(Candidate(name, entry.deployment.spec.priority, rec.started_at))
        return out

    def _waiting(self, entry: Entry, hold: Hold) -> Hold:
        """A preempted deployment's Pending message keeps saying who displaced it."""
        view = self.observed.records.get(entry.name)
        message = view.record.message if view is not None else ""
        if (
            view is None
            or view.record.phase is not Phase.PENDING
            or not message.startswith(PREEMPTED)
        ):
            return hold
        first = message.split("; waiting for room: ")[0]
        return replace(hold, reason=f"{first}; waiting for room: {hold.reason}")

    def _drain_text(self) -> str:
        drain = self.drain
        assert drain is not None
        by = f" by {drain.by}" if drain.by else ""
        why = f" ({drain.reason})" if drain.reason else ""
        until = drain.until.strftime("%Y-%m-%d %H:%M:%S %Z").strip()
        return f"node drained{by} until {until}{why}: run `reconcile uncordon` or wait"


def _by_priority(wanted: tuple[Entry, str]) -> tuple[int, str]:
    return (-wanted[0].deployment.spec.priority, wanted[0].name)


def _moved(view: RecordView) -> bool:
    """The backend reports the instance elsewhere (node, host, port, devices, engine)."""
    now, rec = view.instance, view.record
    if now is None:
        return False
    if now.ref is None:  # being brought (back) up: say so once
        return rec.phase is not Phase.STARTING or rec.message != now.message
    where = (rec.node, rec.host, rec.port, rec.devices)
    return where != (now.node, now.host, now.port, now.devices) or rec.ref != now.ref


def _resync(view: RecordView) -> Resync:
    now, rec = view.instance, view.record
    assert now is not None
    # Counted when the new engine shows up; while it comes back the record keeps the old ref.
    restarted = rec.ref is not None and now.ref is not None and now.ref != rec.ref
    if now.ref is None:
        reason = now.message or "the backend is restarting the engine"
    elif rec.node != now.node:
        reason = f"the backend moved it to node {now.node[:12]} ({now.host}:{now.port})"
    elif restarted:
        reason = f"the backend restarted the engine (pid {now.ref.pid})"
    else:
        reason = f"the engine runs at {now.host}:{now.port}"
    return Resync(name=rec.name, reason=reason, instance=now, restarted=restarted)


def _engine_state(view: RecordView) -> str:
    if view.alive:
        return "engine left running"
    return "not started" if view.record.phase is Phase.PENDING else "engine not running"


def _leader(markers: tuple[MarkedProcess, ...]) -> MarkedProcess | None:
    """The engine itself: the marker process whose parent is not one of them."""
    pids = {m.ref.pid for m in markers}
    roots = sorted((m for m in markers if m.ppid not in pids), key=lambda m: m.ref.start_time)
    return roots[0] if roots else None


def _rolling(entry: Entry) -> bool:
    return entry.deployment.spec.strategy == "RollingUpdate"


def _pid(rec: Record) -> str:
    return str(rec.reserved_by.pid) if rec.reserved_by else "?"
