"""Applies a plan's actions; never decides. Writes the record after each step.

Every action appends an event to the deployment's journal and logs one line
(deployment, action, reason, outcome). The actions that run or stop an engine are the
:class:`Launcher`'s (`reconciler/launcher.py`); the rest only edit records, here.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, assert_never

from controller import failpoints
from controller.backends.base import Backend, Puller
from controller.core.actions import (
    Adopt,
    AnyAction,
    Conflict,
    Fail,
    Fetch,
    Hold,
    HoldChange,
    HoldRestart,
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
    Restart,
    Resync,
    Start,
    Stop,
    Update,
)
from controller.core.manifest.specs import base_name
from controller.core.state import CHANGE_HELD, Phase, Record
from controller.errors import NotProvenOurs
from controller.logsetup import get_logger
from controller.reconciler.launcher import GatewayDrain, Launcher, Reserve, no_drain, no_reserve
from controller.reconciler.leases import RecordMaker, kept_count
from controller.reconciler.memwait import MemoryGate
from controller.store.instances import logfiles
from controller.store.instances.events import Journal
from controller.store.instances.records import RecordStore

if TYPE_CHECKING:  # the hooks' queue: loaded only where node.yaml names hooks
    from controller.store.instances.outbox import Notifications

log = get_logger("reconcile")

# An event's facts for a later pass that reads the journal, not for a person reading the
# log: the set that left a history open (launcher ``_drop``).
JOURNAL_ONLY = frozenset({"owner"})


# slots: setting a name handed on to the launcher (`drain`) fails loudly, not silently.
@dataclass(kw_only=True, slots=True)
class Executor:
    store: RecordStore
    backend: Backend
    journal: Journal
    maker: RecordMaker  # builds the records this executor writes
    puller: Puller | None = None  # model pulls (spec.source); None: none are started
    notify: Notifications | None = None  # node.yaml's hooks: queued here, sent off the pass
    # The launcher's, handed on at construction (the daemon sets `launcher.drain` later).
    log_max_bytes: InitVar[int] = logfiles.DEFAULT_MAX_BYTES
    log_keep: InitVar[int] = logfiles.DEFAULT_KEEP
    memory: InitVar[MemoryGate | None] = None  # NVML's word before a start
    drain: InitVar[GatewayDrain] = no_drain
    reserve: InitVar[Reserve] = no_reserve  # how a start takes its devices and port
    launcher: Launcher = field(init=False)  # the process side: starts and teardowns
    _tally: Counter[tuple[str, str]] = field(default_factory=Counter)
    _tally_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(
        self,
        log_max_bytes: int,
        log_keep: int,
        memory: MemoryGate | None,
        drain: GatewayDrain,
        reserve: Reserve,
    ) -> None:
        self.launcher = Launcher(
            store=self.store,
            backend=self.backend,
            maker=self.maker,
            event=self.event,
            log_max_bytes=log_max_bytes,
            log_keep=log_keep,
            memory=MemoryGate() if memory is None else memory,
            drain=drain,
            puller=self.puller,
            reserve=reserve,
            failed=self._failed,
        )

    # -- the one entry point ------------------------------------------------------

    def apply(self, action: AnyAction) -> bool:
        """Apply one action; True when it changed anything. An engine its teardown could
        not prove ours ends this action only: its record says why (``Launcher.tear``)."""
        try:
            return self._apply(action)
        except NotProvenOurs:
            return False  # kept as it was: another round would only find the same

    def _apply(self, action: AnyAction) -> bool:
        match action:
            case Start():
                return bool(self.start([action]))
            case Restart():
                return self.launcher.restart(action)
            case Stop():  # and Replace: the old instance goes, the next round starts the new
                return self.launcher.stop(action)
            case Promote():
                return self.launcher.promote(action)
            case Park():
                return self.launcher.park(action)
            case Preempt():
                return self.launcher.preempt(action)
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
                return self.launcher.release(action)
            case Reap():
                return self.launcher.reap(action)
            case Pull():
                return self._pull(action)
            case Fetch():
                return self.launcher.fetch(action)
            case Hold():
                return self._hold(action)
            case HoldRestart():
                return self._hold_restart(action)
            case HoldChange():
                return self._hold_change(action)
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
        # An engine that failed, an action that did: what `journalctl -p warning` is for.
        say = log.warning if action == "fail" or outcome == "failed" else log.info
        shown = {k: v for k, v in extra.items() if k not in JOURNAL_ONLY}
        say("action", deployment=name, action=action, reason=reason, outcome=outcome, **shown)
        self.journal.append(name, action, reason, outcome, **extra)
        with self._tally_lock:  # teardowns report from their own threads
            self._tally[(action, "failed" if outcome == "failed" else "ok")] += 1

    def take_tally(self) -> dict[tuple[str, str], int]:
        """(action, outcome) -> how many since the last call: reconcile_actions_total."""
        with self._tally_lock:
            tally, self._tally = dict(self._tally), Counter()
        return tally

    def take_held(self) -> dict[str, str]:
        """Engines kept since the last call for a replacement that cannot start: why."""
        return self.launcher.take_held()

    def start(self, starts: Sequence[Start]) -> list[Start]:
        """A round's starts, reserved together then spawned (see :meth:`Launcher.start`)."""
        return self.launcher.start(starts)

    # -- handlers of the actions that edit records --------------------------------------

    def _fail(self, action: Fail) -> bool:
        rec = self.store.read(action.name)
        if rec is None:
            return False
        if self.launcher.begin(rec, action):
            return True  # in the daemon: its record written once its group is gone
        self.launcher.tear(rec, action.verb, action.reason, lambda: self.backend.teardown(rec))
        self._failed(rec, action)
        return True

    def _failed(self, rec: Record, action: Fail) -> None:
        """After a Fail's teardown: the outcome on record (``rec``: the record then)."""
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
        if action.revision_only:
            # A commit that touched nothing under the git path (a busy monorepo) moves every
            # record's `revision` (DESIGN: each record carries the commit it was applied
            # from; `status` shows it) and nothing else: no event, or each such commit
            # journaled one per deployment; the source's `applied` and `history` say it once.
            self.store.write(replace(rec, revision=self.maker.revision))
            return True
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
        message = rec.message if not rec.spec_valid else ""  # a broken manifest's stays said
        self.store.write(
            replace(rec, phase=Phase.READY, ready_at=at, ready_boot=boot, message=message)
        )
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

    def _pull(self, action: Pull) -> bool:
        """Start the pull the plan asks for; record the deployment Pulling (holding nothing).

        A new progress figure alone is written but changes nothing the planner acts on,
        so it ends the pass's rounds (a pull never keeps a pass busy).
        """
        changed = False
        if action.spawn and self.puller is not None:
            where = self.puller.start(action.entry, action.waiting)
            self.event(action.name, action.verb, action.reason, f"started {where}")
            # The others waiting for the same file hear of it too, as they hear of its end.
            for other in sorted(set(action.waiting) - {base_name(action.name)}):
                self.event(other, action.verb, action.reason, f"started {where}")
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
        record = replace(record, restarts=kept_count(current, record))  # waits for room
        if current is not None and _same_pending(current, record):
            return False
        self.store.write(record)
        self.event(action.name, action.verb, action.reason, "pending")
        return True

    def _hold_restart(self, action: HoldRestart) -> bool:
        """A due restart the drain holds: the message says so; the lease stays for it."""
        rec = self.store.read(action.name)
        if rec is None or rec.phase is not Phase.BACKOFF or rec.message == action.reason:
            return False
        self.store.write(replace(rec, message=action.reason))
        self.event(action.name, action.verb, action.reason, str(Phase.BACKOFF))
        return True

    def _hold_change(self, action: HoldChange) -> bool:
        """A spec change the drain holds: the running record's message says so, once; once
        the hold is over, those words (and only those) go."""
        rec = self.store.read(action.name)
        message = "" if action.over else action.reason
        if rec is None or rec.message == message or rec.phase not in (Phase.READY, Phase.STARTING):
            return False  # gone, said, or no longer running (its BackOff words are its own)
        if action.over and CHANGE_HELD not in rec.message:
            return False
        self.store.write(replace(rec, message=message))
        self.event(action.name, action.verb, action.reason, str(rec.phase))
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
        failures = f"{action.failures} failure{'s' if action.failures > 1 else ''}"
        outcome = f"{failures} in a row" if action.failures else "answering"
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
