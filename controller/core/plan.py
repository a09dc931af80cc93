"""The planner: (desired, observed, inventory, now) -> ordered actions. Pure.

No clock, no I/O: ``now`` and every observation come in as arguments, so the
same inputs always give the same plan (kubelet's computePodActions, pip-tools'
diff). Each action carries the reason `reconcile plan` prints.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from controller.core import limits as limits_mod
from controller.core.actions import (
    Action,
    Adopt,
    AnyAction,
    Conflict,
    Fail,
    Hold,
    MarkReady,
    MarkSpec,
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
from controller.core.inventory import Inventory
from controller.core.limits import Limits
from controller.core.placement import Unplaced, ledger_for, place
from controller.core.specs import Entry, changed_fields, spec_document
from controller.core.state import MarkedProcess, Observed, Phase, Record, RecordView

BACKOFF_FIRST = 10.0
BACKOFF_MAX = 300.0
BACKOFF_RESET = 600.0  # seconds Ready after which a crash counts as the first again
# Spec fields a running engine never sees: a change to only these updates the record.
IN_PLACE = ("readiness", "restartPolicy", "stopGracePeriodSeconds")

ORDER: tuple[type[Action], ...] = (
    Reap,
    Release,
    Adopt,
    Resync,
    Replace,
    Stop,
    Fail,
    MarkSpec,
    Update,
    MarkReady,
    Restart,
    Start,
    Hold,
    Reject,
    Conflict,
)


@dataclass(frozen=True, kw_only=True)
class Desired:
    owner: str
    entries: Mapping[str, Entry] = field(default_factory=dict)
    invalid: Mapping[str, str] = field(default_factory=dict)  # name -> error
    broken_sources: frozenset[str] = frozenset()
    source_errors: Mapping[str, str] = field(default_factory=dict)  # broken file -> its error
    prune: bool = True  # False: a folder is missing or empty (invariant 5)


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
    actions = list(planner.run())
    return sorted(actions, key=lambda a: (ORDER.index(type(a)), a.name))


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
            if v.record.holds
        }
        drain = observed.drain
        self.drain = drain if drain is not None and drain.active(now) else None

    def run(self) -> Iterator[AnyAction]:
        yield from self._orphans()
        names = set(self.desired.entries) | set(self.observed.records) | set(self.desired.invalid)
        for name in sorted(names):
            entry = self.desired.entries.get(name)
            view = self.observed.records.get(name)
            if view is None:
                if name in self.observed.unreadable:
                    continue  # never over an unknown version
                if entry is not None:
                    yield self._start(entry, "new deployment")
                else:  # every deployment a pass has seen gets a record, so status shows it
                    error = self.desired.invalid[name]
                    yield Reject(name=name, reason=f"spec invalid (not started): {error}")
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
        if entry is None:
            yield from self._undeclared(view)
            return
        if not rec.spec_valid:
            yield MarkSpec(name=rec.name, reason="manifest is valid again", valid=True)
        if rec.spec_hash != entry.hash:
            yield self._changed(view, entry)
            return
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

    def _changed(self, view: RecordView, entry: Entry) -> AnyAction:
        rec = view.record
        fields = tuple(changed_fields(rec.spec, spec_document(entry.deployment.spec)))
        shown = ", ".join(f"spec.{f}" for f in fields) or "spec"
        if view.alive and fields and all(f.split(".")[0] in IN_PLACE for f in fields):
            return Update(name=rec.name, reason=f"{shown} changed", entry=entry, fields=fields)
        if view.alive or view.markers or rec.holds:
            return Replace(name=rec.name, reason=f"{shown} changed", fields=fields)
        return Release(name=rec.name, reason=f"{shown} changed", nonce=rec.nonce)

    def _lifecycle(self, view: RecordView, entry: Entry) -> Iterator[AnyAction]:
        rec = view.record
        if rec.phase is Phase.PENDING:
            yield self._start(entry, "retrying placement")
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
        if rec.restart_policy == "Never" or (rec.restart_policy == "OnFailure" and code == 0):
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

    def _start(self, entry: Entry, why: str) -> AnyAction:
        spec = entry.deployment.spec
        if self.drain is not None:
            return Hold(name=entry.name, reason=self._drain_text(), entry=entry)
        want = spec.devices
        room = limits_mod.room(
            count=want.count,
            kind=want.kind,
            inventory=self.inventory,
            instances=self.instances,
            limits=self.limits,
        )
        if isinstance(room, str):
            return Hold(name=entry.name, reason=room, entry=entry)
        placed = place(spec, room, self.ledger, self.extra_ports.get(spec.engine, 0))
        if isinstance(placed, Unplaced):
            reason = limits_mod.explain(placed.reason, self.inventory, room, self.limits)
            return Hold(name=entry.name, reason=reason, entry=entry)
        self.ledger.take(entry.name, placed.devices, placed.ports, spec.devices.shareable)
        self.instances[entry.name] = limits_mod.kinds_of(placed.devices)
        where = ",".join(placed.devices) or "no devices"
        return Start(
            name=entry.name,
            reason=f"{why}: {where}, port {placed.port}",
            entry=entry,
            devices=placed.devices,
            port=placed.port,
            extra_ports=placed.extra_ports,
        )

    def _drain_text(self) -> str:
        drain = self.drain
        assert drain is not None
        by = f" by {drain.by}" if drain.by else ""
        why = f" ({drain.reason})" if drain.reason else ""
        until = drain.until.strftime("%Y-%m-%d %H:%M:%S %Z").strip()
        return f"node drained{by} until {until}{why}: run `reconcile uncordon` or wait"


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


def _pid(rec: Record) -> str:
    return str(rec.reserved_by.pid) if rec.reserved_by else "?"
