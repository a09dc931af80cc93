"""Applies a plan's actions; never decides. Writes the record after each step.

Every action appends an event to the deployment's journal and logs one line
(deployment, action, reason, outcome).
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, assert_never

from controller import failpoints
from controller.backends.base import Backend, Puller, StartRequest
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
    Probed,
    Promote,
    Pull,
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
from controller.core.manifest.names import instance_of, is_next
from controller.core.manifest.specs import Entry, base_name, next_name
from controller.core.plan import backoff
from controller.core.state import Phase, Record
from controller.errors import ContainerError, PullingFirst, SpawnError, Unplaceable
from controller.logsetup import get_logger
from controller.reconciler.leases import Lease, RecordMaker
from controller.reconciler.memwait import MemoryGate
from controller.redact import redact_args
from controller.store import diskspace
from controller.store.instances import logfiles
from controller.store.instances.events import Journal
from controller.store.instances.outbox import Notifications
from controller.store.instances.records import RecordStore

log = get_logger("reconcile")

# Before a RollingUpdate stops the old instance: (old, new) -> returns once the front door
# sends nothing more to the old one and its in-flight requests ended (bounded by the
# old one's grace period). The daemon injects the gateway's; without one, nothing waits.
GatewayDrain = Callable[[Record, Record | None], None]


def _no_drain(old: Record, new: Record | None) -> None:
    return None


# A round's starts reserved together under the placement lock, in the plan's order: each
# with its Lease, or the Pending record written instead (the reconciler's: it holds the
# lock, the inventory and the round's observations). Reserved starts only are returned.
Reserve = Callable[[Sequence[Start]], list[tuple[Start, Lease | Record]]]


def _no_reserve(starts: Sequence[Start]) -> list[tuple[Start, Lease | Record]]:
    raise RuntimeError("this executor was built without reservations: it cannot start")


@dataclass(kw_only=True)
class Executor:
    store: RecordStore
    backend: Backend
    journal: Journal
    maker: RecordMaker  # builds the records this executor writes
    log_max_bytes: int = logfiles.DEFAULT_MAX_BYTES
    log_keep: int = logfiles.DEFAULT_KEEP
    memory: MemoryGate = field(default_factory=MemoryGate)  # NVML's word before a start
    drain: GatewayDrain = _no_drain
    puller: Puller | None = None  # model pulls (spec.source); None: none are started
    reserve: Reserve = _no_reserve  # how a start takes its devices and port
    notify: Notifications | None = None  # node.yaml's hooks: queued here, sent off the pass
    _tally: Counter[tuple[str, str]] = field(default_factory=Counter)
    _tally_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.memory.owner_of = self._owner_of

    # -- the one entry point ------------------------------------------------------

    def apply(self, action: AnyAction) -> bool:
        """Apply one action; True when it changed anything."""
        match action:
            case Start():
                return bool(self.start([action]))
            case Restart():
                return self._restart(action)
            case Stop():  # and Replace: the old instance goes, the next round starts the new
                return self._stop(action)
            case Promote():
                return self._promote(action)
            case Park():
                return self._park(action)
            case Preempt():
                return self._preempt(action)
            case Update():
                return self._update(action)
            case Fail():
                return self._fail(action)
            case MarkReady():
                return self._markready(action)
            case Adopt():
                return self._adopt(action)
            case Resync():
                return self._resync(action)
            case Release():
                return self._release(action)
            case Reap():
                return self._reap(action)
            case Pull():
                return self._pull(action)
            case Hold():
                return self._hold(action)
            case Reject():
                return self._reject(action)
            case MarkSpec():
                return self._markspec(action)
            case Conflict():
                return self._conflict(action)
            case Probed():
                return self._probed(action)
            case _:
                assert_never(action)

    def now(self) -> datetime:
        return self.maker.now()

    def event(self, name: str, action: str, reason: str, outcome: str, **extra: Any) -> None:
        """Journal under the deployment's name: a `@next` record's steps are its too."""
        if name != base_name(name):
            extra["instance"] = name
        if self.maker.revision:  # the commit this action applies (DESIGN: events name it)
            extra.setdefault("revision", self.maker.revision)
        name = base_name(name)
        log.info("action", deployment=name, action=action, reason=reason, outcome=outcome, **extra)
        self.journal.append(name, action, reason, outcome, **extra)
        with self._tally_lock:  # teardowns report from their own threads
            self._tally[(action, "failed" if outcome == "failed" else "ok")] += 1

    def take_tally(self) -> dict[tuple[str, str], int]:
        """(action, outcome) -> how many since the last call: reconcile_actions_total."""
        with self._tally_lock:
            tally, self._tally = dict(self._tally), Counter()
        return tally

    # -- starting -----------------------------------------------------------------

    def start(self, starts: Sequence[Start]) -> list[Start]:
        """Start a round's starts as one batch: reserved together (one placement lock, the
        plan's order, so the plan's fits are reproduced), then spawned, concurrently up to
        the backend's launch concurrency. The starts that got a reservation or a Pending
        record are returned (the rest another pass placed meanwhile)."""
        reserved = self.reserve(starts)
        for start, taken in reserved:
            if is_next(start.name) and isinstance(taken, Lease):  # why a second one starts
                self.event(start.name, "roll", start.reason, "new instance beside the old")
        spawns = [(r, s.entry) for s, r in reserved if isinstance(r, Lease)]
        workers = min(self.backend.launch_concurrency, len(spawns))
        if workers <= 1:
            for lease, entry in spawns:
                self.spawn(lease, entry)
        else:  # each launch touches only its own record, log and journal
            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(lambda pair: self.spawn(*pair), spawns))
        return [start for start, _ in reserved]

    def spawn(self, lease: Lease, entry: Entry, verb: str = "start") -> bool:
        """Exec the engine of a reservation record and record its identity; what it runs
        was rendered once, when the lease was taken."""
        record, rendered = lease.record, lease.rendered
        assert record.port is not None and record.nonce is not None
        name = record.name  # each replica (and `@next`) has its own runtime dir
        self.store.runtime_dir(name).mkdir(mode=0o700, parents=True, exist_ok=True)
        # Each replica its own log; a `@next` appends to its instance's (its runs begin
        # with a marker line naming it), so the log follows the name through a promotion.
        log_path = self.store.log_path(instance_of(name))
        logfiles.rotate(log_path, self.log_max_bytes, self.log_keep)
        logfiles.write_marker(
            log_path,
            f"{verb} {name} instance {record.nonce}: {' '.join(redact_args(rendered.argv))}",
        )
        short = self.memory.wait(record, lambda why: self.event(name, verb, why, "waiting"))
        if short is not None:
            return self._no_memory(record, entry, verb, short)
        failpoints.hit("executor.spawn.before_exec")
        launch = StartRequest(entry=entry, record=record, rendered=rendered, log_path=log_path)
        try:
            where = self.backend.launch(launch)
        except Unplaceable as exc:  # the cluster has no room now: Pending, nothing held
            pending = self.maker.pending(entry, str(exc), name=name)
            outcome = "pending"
            if isinstance(exc, PullingFirst):  # on its way by itself: not the user's to fix
                pending, outcome = replace(pending, phase=Phase.PULLING), "pulling"
            self.store.write(pending)
            self.event(name, verb, "placement", outcome, error=str(exc))
            return True
        except SpawnError as exc:
            # A runtime's refusal says its own next move; a missing program has ours.
            hint = (
                ""
                if isinstance(exc, ContainerError)
                else ": install the engine or set spec.executable"
            )
            self._back_off(record, f"{exc}{hint}")
            self.event(name, verb, "spawn", "failed", error=str(exc))
            return True
        failpoints.hit("executor.spawn.before_record")
        now = self.now()
        ref = where.ref
        assert ref is not None
        started = replace(
            record,
            ref=ref,
            container=where.container,
            node=where.node,
            host=where.host,
            port=where.port,
            devices=where.devices,
            phase=Phase.STARTING,
            started_at=now,
            ready_deadline_at=now + timedelta(seconds=rendered.deadline_seconds),
            message="",
        )
        self.store.write(started)
        failpoints.hit("executor.spawn.after_record")
        if self.puller is not None:
            self.puller.used(entry, now)
        devices = ",".join(where.devices) or "none"
        place = f"devices {devices} port {where.port}"
        if self.backend.places_engines:
            place = f"node {where.node[:12]} ({where.host}) {place}"
        if where.container is not None and where.message:  # its image's pull ended: the digest
            kept = where.container
            self.event(name, "pull", where.message, "pulled", image=kept.image, digest=kept.digest)
        self.event(name, verb, place, f"spawned pid {ref.pid}")
        return True

    def _no_memory(self, record: Record, entry: Entry, verb: str, why: str) -> bool:
        """The GPU never freed the memory: back off (keeping the lease), never over-commit."""
        message = (
            f"GPU memory not free after {self.memory.timeout:g}s: {why}: "
            "stop the process holding it or lower spec.devices.memory"
        )
        self._back_off(record, message)
        self.event(record.name, verb, "gpu memory", "not started", error=message)
        return True

    def _back_off(self, record: Record, message: str) -> None:
        """Not started: BackOff until the next restart's delay is over, saying why."""
        delay = backoff(max(record.restarts, 1))
        until = self.now() + timedelta(seconds=delay)
        self.store.write(replace(record, phase=Phase.BACKOFF, backoff_until=until, message=message))

    def _terminate(self, rec: Record, reason: str, point: str | None = None) -> None:
        """Record Terminating, then tear down: a crash between them is finished by a later pass."""
        try:
            self.store.write(replace(rec, phase=Phase.TERMINATING, message=reason))
        except OSError as exc:
            if not diskspace.full(exc):
                raise
            # A full disk, its ballast spent: the stop matters more than the note of it
            # (a crash before the record goes leaves a dead engine's record: a later
            # pass handles that as any other).
        if point is not None:
            failpoints.hit(point)
        self.backend.teardown(rec)

    def _owner_of(self, pid: int) -> str | None:
        """The deployment whose engine (process group) ``pid`` belongs to, if any."""
        try:
            group = os.getpgid(pid)
        except OSError:
            group = pid
        for rec in self.store.load().records.values():
            if rec.ref is not None and rec.ref.pid in (pid, group):
                return rec.name
        return None

    # -- handlers, one per action type ------------------------------------------------

    def _restart(self, action: Restart) -> bool:
        rec = self.store.read(action.name)
        if rec is None:
            return False
        self.backend.sweep(rec.nonce, rec.ref if rec.ref else None)
        failpoints.hit("executor.restart.after_sweep")
        fresh = replace(
            rec,
            nonce=os.urandom(8).hex(),  # secrets.token_hex, without hmac + hashlib
            ref=None,
            container=None,
            reserved_by=self.maker.me,
            phase=Phase.RESERVED,
            restarts=action.restarts,
            backoff_until=None,
            ready_at=None,
            ready_boot=None,
            liveness_failures=0,
        )
        self.store.write(fresh)
        assert fresh.port is not None  # a Restart is planned only for a record holding its lease
        rendered = self.maker.render(
            action.entry, fresh.devices, fresh.port, fresh.extra_ports, name=fresh.name
        )
        return self.spawn(Lease(fresh, rendered), action.entry, verb="restart")

    def _stop(self, action: Stop) -> bool:
        rec = self.store.read(action.name)
        if rec is None:
            return False
        if isinstance(action, Replace) and rec.holds:
            self.drain(rec, None)  # a recreate: requests in flight end first, new ones wait
        self._terminate(rec, action.reason, "executor.stop.after_terminating")
        if isinstance(action, Replace):
            # The deployment stays known between the teardown and the next round's
            # reservation: a dropped record would make the gateway answer 404 to the
            # requests that should wait for the new engine. Pending holds nothing, and
            # the planner places a Pending record of a changed spec (planner/records).
            self.store.write(self._unplaced(rec, action.reason))
            self.event(action.name, action.verb, action.reason, "stopped; Pending for the new")
            return True
        self.store.delete(action.name)
        failpoints.hit("executor.stop.after_delete")
        self.event(action.name, action.verb, action.reason, "stopped; record dropped")
        return True

    @staticmethod
    def _unplaced(rec: Record, reason: str) -> Record:
        """``rec`` with its run and lease gone: Pending, no device, no port, no nonce."""
        return replace(
            rec.released(),
            phase=Phase.PENDING,
            ref=None,  # the run ends with its lease: a later start is a fresh one
            container=None,
            nonce=None,
            reserved_by=None,
            started_at=None,
            ready_at=None,
            ready_boot=None,
            ready_deadline_at=None,
            backoff_until=None,
            message=reason,
        )

    def _promote(self, action: Promote) -> bool:
        """GatewayDrain and stop the old instance, then rename ``<name>@next`` to ``<name>``.

        Crash-safe in every step: the old record goes Terminating before its teardown
        (a later pass finishes it), the rename is one atomic write of the new record
        under the old name (the same nonce in both tells a later pass to finish), and
        only then is ``@next`` deleted.
        """
        new = self.store.read(next_name(action.name))
        if new is None:
            return False
        old = self.store.read(action.name)
        if old is not None and old.nonce != new.nonce:
            self.drain(old, new)
            self._terminate(old, action.reason, "executor.promote.after_terminating")
        self.store.write(replace(new, name=action.name))
        failpoints.hit("executor.promote.after_rename")
        self.store.delete(new.name)
        pid = new.ref.pid if new.ref else "none"
        self.event(action.name, action.verb, action.reason, f"serving from pid {pid}")
        return True

    def _park(self, action: Park) -> bool:
        """Tear down what runs (if anything), then record the deployment Idle."""
        rec = self.store.read(action.name)
        if rec is not None and rec.holds and rec.phase is Phase.READY:
            # The plan saw no request in flight (planner/ondemand `_busy`), but the gateway
            # may have sent one since: it ends before the teardown, new ones wake it again.
            self.drain(rec, None)
        if rec is not None and (rec.holds or rec.ref is not None):
            self._terminate(rec, action.reason)
        self.store.write(self.maker.idle(action.entry, action.reason, name=action.name))
        self.event(action.name, action.verb, action.reason, "idle: holds nothing")
        return rec is None or rec.phase is not Phase.IDLE or rec.spec_hash != action.entry.hash

    def _preempt(self, action: Preempt) -> bool:
        """Stop the engine; the record stays Pending, holding nothing, saying who won."""
        rec = self.store.read(action.name)
        if rec is None:
            return False
        self.backend.teardown(rec)
        self.store.write(self._unplaced(rec, action.reason))
        self.event(action.name, action.verb, action.reason, "stopped; Pending until room returns")
        return True

    def _fail(self, action: Fail) -> bool:
        rec = self.store.read(action.name)
        if rec is None:
            return False
        self.backend.teardown(rec)
        failed = replace(
            rec,
            phase=action.phase,
            backoff_until=action.retry_at,
            restarts=action.restarts,
            message=action.reason,
            last_exit=rec.last_exit if action.exit is None else action.exit,
        )
        if not action.phase.holds_resources:  # Failed/Succeeded release their lease
            failed = failed.released()
        failpoints.hit("executor.fail.before_write")
        self.store.write(failed)
        self.event(action.name, action.verb, action.reason, str(action.phase), **self._why(action))
        self._notify_fail(rec, action)
        return True

    def _notify_fail(self, before: Record, action: Fail) -> None:
        """A deployment entering Failed or BackOff, for node.yaml's hooks: a crash loop is
        told once (its first failure), and again only when a run that had been Ready dies."""
        if self.notify is None or action.phase not in (Phase.FAILED, Phase.BACKOFF):
            return
        if action.phase is Phase.BACKOFF and before.restarts > 0 and before.ready_at is None:
            return  # still the same crash loop
        name, phase = base_name(action.name), str(action.phase)
        self.notify.emit(phase, f"{name} {phase}: {action.reason}",
                         revision=self.maker.revision, deployments=[name])  # fmt: skip

    def _why(self, action: Fail) -> dict[str, Any]:
        """What `describe` needs to tell the cause: exit code/signal, the run's last lines."""
        extra: dict[str, Any] = {}
        if action.exit is not None:
            extra.update(exit_code=action.exit.code, signal=action.exit.signal)
        if action.retry_at is not None:
            extra["retry_in"] = round(max((action.retry_at - self.now()).total_seconds(), 0), 1)
        extra["log_tail"] = self.backend.log_tail(action.name, 10)  # its instance's log
        return extra

    def _update(self, action: Update) -> bool:
        rec = self.store.read(action.name)
        if rec is None:
            return False
        if rec.port is None:  # Idle: nothing rendered to redo, only the facts it states
            self.store.write(self.maker.described(rec, action.entry))
            self.event(action.name, action.verb, action.reason, "updated in place (idle)")
            return True
        rendered = self.maker.render(
            action.entry, rec.devices, rec.port, rec.extra_ports, name=rec.name
        )
        started = rec.started_at
        self.store.write(
            replace(
                self.maker.described(rec, action.entry),
                probe=rendered.probe,
                liveness=rendered.liveness,
                grace_seconds=rendered.grace_seconds,
                ready_deadline_at=rec.ready_deadline_at
                if started is None
                else started + timedelta(seconds=rendered.deadline_seconds),
            )
        )
        self.event(action.name, action.verb, action.reason, "updated in place (no restart)")
        return True

    def _markready(self, action: MarkReady) -> bool:
        rec = self.store.read(action.name)
        if rec is None:
            return False
        started = rec.started_at or self.now()
        took = (self.now() - started).total_seconds()
        at, boot = self.now(), self.maker.boot()
        self.store.write(replace(rec, phase=Phase.READY, ready_at=at, ready_boot=boot, message=""))
        self.event(action.name, "ready", action.reason, f"ready after {took:.1f}s")
        return True

    def _markspec(self, action: MarkSpec) -> bool:
        rec = self.store.read(action.name)
        if rec is None:
            return False
        message = "" if action.valid else action.reason
        self.store.write(replace(rec, spec_valid=action.valid, message=message))
        self.event(action.name, action.verb, action.reason, "valid" if action.valid else "invalid")
        return True

    def _adopt(self, action: Adopt) -> bool:
        rec = self.store.read(action.name)
        if rec is None:
            return False
        started = rec.started_at or self.now()
        # Its maker died before writing the container it ran: the runtime's labels say it.
        container = rec.container or self.backend.container_of(rec)
        adopted = replace(
            rec, ref=action.ref, container=container, phase=Phase.STARTING, started_at=started
        )
        failpoints.hit("executor.adopt.before_write")
        self.store.write(adopted)
        self.event(action.name, action.verb, action.reason, f"adopted pid {action.ref.pid}")
        return True

    def _resync(self, action: Resync) -> bool:
        """Write where the backend runs the instance now; a new engine is probed again."""
        rec = self.store.read(action.name)
        if rec is None:
            return False
        now, at = action.instance, self.now()
        moved = replace(
            rec,
            node=now.node,
            host=now.host,
            port=now.port,
            devices=now.devices,
            message=now.message,
            ref=rec.ref if now.ref is None else now.ref,
            # A Ray actor that restarted its engine's container reports the new one.
            container=rec.container if now.ref is None else now.container,
        )
        if now.ref is None or action.restarted:
            moved = replace(
                moved, phase=Phase.STARTING, ready_at=None, ready_boot=None, liveness_failures=0
            )
        if action.restarted:
            window = _deadline_window(rec)
            deadline = at + window if window is not None else None
            moved = replace(
                moved, restarts=rec.restarts + 1, started_at=at, ready_deadline_at=deadline
            )
        self.store.write(moved)
        self.event(action.name, action.verb, action.reason, f"restarts {moved.restarts}")
        return True

    def _release(self, action: Release) -> bool:
        self.backend.sweep(action.nonce)
        failpoints.hit("executor.release.before_delete")
        self.store.delete(action.name)
        self.event(action.name, action.verb, action.reason, "record dropped")
        return True

    def _reap(self, action: Reap) -> bool:
        for proc in action.processes:
            self.backend.kill(proc.ref)
        for nonce in {p.nonce for p in action.processes}:
            self.backend.sweep(nonce)
        pids = ",".join(str(p.ref.pid) for p in action.processes)
        self.event(action.name, action.verb, action.reason, f"killed {pids}")
        return True

    def _pull(self, action: Pull) -> bool:
        """Start the pull the plan asks for; record the deployment Pulling (holding nothing).

        A new progress figure alone is written but changes nothing the planner acts on,
        so it ends the pass's rounds (a pull never keeps a pass busy).
        """
        changed = False
        if action.spawn and self.puller is not None:
            where = self.puller.start(action.entry, action.waiting)
            self.event(action.name, action.verb, action.reason, f"started {where}")
            changed = True
        current = self.store.read(action.name)
        if not action.record or (current is not None and current.holds):
            return changed  # a rolling update's pull: the serving record stays as it is
        pending = self.maker.pending(action.entry, action.reason, name=action.name)
        record = replace(pending, phase=Phase.PULLING)
        if current is not None and _same_pending(current, record):
            return changed
        self.store.write(record)
        if current is None or current.phase is not Phase.PULLING:
            return True
        return changed or current.spec_hash != record.spec_hash

    def _hold(self, action: Hold) -> bool:
        current = self.store.read(action.name)
        record = self.maker.pending(action.entry, action.reason, name=action.name)
        if current is not None and _same_pending(current, record):
            return False
        self.store.write(record)
        self.event(action.name, action.verb, action.reason, "pending")
        return True

    def _reject(self, action: Reject) -> bool:
        if self.store.read(action.name) is not None:
            return False
        self.store.write(self.maker.rejected(action.name, action.reason))
        self.event(action.name, action.verb, action.reason, "pending")
        return True

    def _probed(self, action: Probed) -> bool:
        """Count the liveness failures in a row; the message says so while any are counted."""
        rec = self.store.read(action.name)
        if rec is None or rec.phase is not Phase.READY:
            return False
        message = action.reason if action.failures else ""
        self.store.write(replace(rec, liveness_failures=action.failures, message=message))
        outcome = f"{action.failures} failures in a row" if action.failures else "answering"
        self.event(action.name, action.verb, action.reason, outcome)
        return True

    def _conflict(self, action: Conflict) -> bool:
        log.warning("conflict", deployment=action.name, reason=action.reason)
        return False


def _same_pending(a: Record, b: Record) -> bool:
    keys = ("phase", "message", "spec_hash", "owner", "source")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _deadline_window(rec: Record) -> timedelta | None:
    """The readiness window the record was given (deadline - start), for a new engine."""
    if rec.ready_deadline_at is None or rec.started_at is None:
        return None
    return rec.ready_deadline_at - rec.started_at
