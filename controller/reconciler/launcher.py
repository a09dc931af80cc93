"""The executor's process side: the actions that bring an engine up or take one down.

A round's starts reserved and spawned (with the GPU memory gate before each exec), a
restart in place, and the teardowns (stop, replace, promote, park, preempt, a dead
reservation released, strays reaped): each writes the record around its step on the
backend, so a crash between them is finished by a later pass. The record-only actions
and the journal are the executor's (`reconciler/executor.py`), which composes this.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar, assert_never

from controller import failpoints
from controller.backends.base import Backend, Held, Puller, StartRequest, engine_path
from controller.core.actions import (
    Fail,
    Fetch,
    Park,
    Preempt,
    Promote,
    Reap,
    Release,
    Replace,
    Restart,
    Start,
    Stop,
)
from controller.core.engines.program import no_program
from controller.core.manifest import backendnames
from controller.core.manifest.names import base_name, instance_of, is_next
from controller.core.manifest.specs import Entry, next_name
from controller.core.plan import backoff, restarts_after
from controller.core.state import CANNOT_EXEC, ExitInfo, Phase, Record, UnreadExit
from controller.errors import (
    ContainerError,
    ContainerExited,
    ExecFailed,
    ImagePullFailed,
    NotProvenOurs,
    PullingFirst,
    SpawnError,
    Unplaceable,
)
from controller.host import procscan
from controller.reconciler.leases import Lease, RecordMaker, kept_count
from controller.reconciler.memwait import MemoryGate, Stopped
from controller.redact import redact_args
from controller.store import diskspace, sidefiles
from controller.store.instances import logfiles
from controller.store.instances.events import REMOVED, REMOVED_OUTCOME
from controller.store.instances.records import RecordStore
from controller.store.side import scale

# Before a RollingUpdate stops the old instance: (old, new) -> returns once the front door
# sends nothing more to the old one and its in-flight requests ended (bounded by the
# old one's grace period). The daemon injects the gateway's; without one, nothing waits.
GatewayDrain = Callable[[Record, Record | None], None]


class GatewayDrains(Protocol):
    """The daemon's drains, part of its deferred stops (``begin``): asked, then looked at
    by each later pass, never waited for (the gateway's keeper)."""

    def ask_drain(self, old: Record, new: Record | None) -> bool:
        """Route nothing more to ``old`` (``new`` takes its requests); False: nothing
        routes to it, nothing to wait for."""
        ...

    def drain_answered(self, old: Record) -> bool:
        """Its requests in flight ended (or the gateway's share of its grace did)."""
        ...

    def end_drain(self, old: Record) -> None: ...

    def resume_drain(self, old: Record) -> bool:
        """Look at a drain of ``old`` that a daemon before this one asked and did not see
        end, as if this one had asked it; False: no such ask stands."""
        ...


# Seconds past a drained engine's grace period for the gateways' answers (a poll or two),
# as the gateway keeper's blocking drain gives them (``registry.DRAIN_SLACK``).
DRAIN_SLACK = 2.0
LATE_SWEEP_POLL = 0.05  # seconds between the sweeps of a dead reservation's late engine

T = TypeVar("T")

# The teardowns a daemon's pass begins and a later pass finishes (``Launcher.begin``).
Deferred = Stop | Park | Preempt | Fail | Promote
# What a Fail's teardown ends in: its record written, the failure said (the executor's).
FailEnd = Callable[[Record, Fail], None]


def no_fail_end(rec: Record, action: Fail) -> None:
    raise RuntimeError("this launcher was built without a Fail's end: it cannot fail one")


def no_drain(old: Record, new: Record | None) -> None:
    """No front door (`--once`, `up`): nothing is routed to the old one, nothing waits."""
    return None


# A round's starts reserved together under the placement lock, in the plan's order: each
# with its Lease, or the Pending record written instead (the reconciler's: it holds the
# lock, the inventory and the round's observations). Reserved starts only are returned.
Reserve = Callable[[Sequence[Start]], list[tuple[Start, Lease | Record]]]


def no_reserve(starts: Sequence[Start]) -> list[tuple[Start, Lease | Record]]:
    raise RuntimeError("this executor was built without reservations: it cannot start")


class EventSink(Protocol):
    """The executor's `event`: journal one step under its deployment and count it."""

    def __call__(self, name: str, action: str, reason: str, outcome: str, **extra: Any) -> None: ...


@dataclass(kw_only=True)
class Launcher:
    """Starts and stops engines through the backend; journals each step by ``event``."""

    store: RecordStore
    backend: Backend
    maker: RecordMaker  # builds the records a start writes
    event: EventSink
    log_max_bytes: int = logfiles.DEFAULT_MAX_BYTES
    log_keep: int = logfiles.DEFAULT_KEEP
    memory: MemoryGate = field(default_factory=MemoryGate)  # NVML's word before a start
    drain: GatewayDrain = no_drain
    drains: GatewayDrains | None = None  # the daemon's: a deferred stop's drain (``begin``)
    puller: Puller | None = None  # told when a start uses its entry's pulled files
    reserve: Reserve = no_reserve  # how a start takes its devices and port
    # The daemon's: a stop signals and goes on, a later pass finishes it (``stop``), so
    # one engine's grace period holds up no other deployment. `--once` and `down` wait.
    defer_stops: bool = False
    failed: FailEnd = no_fail_end  # after a Fail's teardown (the executor's record write)

    def __post_init__(self) -> None:
        self.memory.owner_of = self._owner_of
        self._kept: dict[str, str] = {}  # a Ready engine kept for its replacement: why
        self._held: dict[str, str] = {}  # ... or not stopped (not proven ours): take_held
        self._dropping = threading.Lock()  # see _drop
        # The deferred teardowns this launcher signalled: name -> (the action, its nonce),
        # what their end does (``_ended``: drop the record, Pending, Idle, BackOff...).
        self._stopping: dict[str, tuple[Deferred, str | None]] = {}
        # Those of them draining, not yet signalled (``_drain``): name -> nonce.
        self._draining: dict[str, str | None] = {}

    # -- starting -----------------------------------------------------------------

    def start(self, starts: Sequence[Start]) -> list[Start]:
        """Start a round's starts as one batch: reserved together (one placement lock, the
        plan's order, so the plan's fits are reproduced), then spawned, concurrently up to
        the backend's launch concurrency. The starts that got a reservation or a Pending
        record are returned (the rest another pass placed meanwhile), but those that wait
        for a pull: another round would only find the pull still running (a podman pull
        journalled five starts a pass)."""
        # What each waiting start said: a launch refused again for the same reason (a
        # `pullPolicy: Never` image still missing, pass after pass) is no news to journal.
        said = {s.name: r.message for s in starts if (r := self._pending(s.name)) is not None}
        reserved = self.reserve(starts)
        for start, taken in reserved:
            if is_next(start.name) and isinstance(taken, Lease):  # why a second one starts
                self.event(start.name, "roll", start.reason, "new instance beside the old")
            elif not isinstance(taken, Lease) and taken.message != said.get(start.name):
                # placed Pending under the lock (`port: 80` not as root): journalled once
                self.event(start.name, "start", "placement", "pending", error=taken.message)
        spawns = [(r, s.entry) for s, r in reserved if isinstance(r, Lease)]
        workers = min(self.backend.launch_concurrency, len(spawns))

        def spawn(lease: Lease, entry: Entry) -> bool:
            return self.spawn(lease, entry, said=said.get(lease.record.name))

        if workers <= 1:
            went = [spawn(lease, entry) for lease, entry in spawns]
        else:  # each launch touches only its own record, log and journal
            with ThreadPoolExecutor(max_workers=workers) as pool:
                went = list(pool.map(lambda pair: spawn(*pair), spawns))
        pulling = {
            lease.record.name for (lease, _), done in zip(spawns, went, strict=True) if not done
        }
        return [start for start, _ in reserved if start.name not in pulling]

    def _pending(self, name: str) -> Record | None:
        record = self.store.read(name)
        return record if record is not None and record.phase is Phase.PENDING else None

    def spawn(
        self, lease: Lease, entry: Entry, verb: str = "start", *, said: str | None = None,
        counted: int | None = None,
    ) -> bool:  # fmt: skip
        """Exec the engine of a reservation record and record its identity; what it runs
        was rendered once, when the lease was taken. False: nothing changed that another
        round would see otherwise (it waits for a pull first, or is refused as it was
        before). ``said``: the Pending message the start came from; ``counted``: the
        restart count before this start (a restart's), kept when a stop gives it up."""
        record, rendered = lease.record, lease.rendered
        assert record.port is not None and record.nonce is not None
        name = record.name  # each replica (and `@next`) has its own runtime dir
        self.store.runtime_dir(name).mkdir(mode=0o700, parents=True, exist_ok=True)
        # Each replica its own log, and a `@next` its own while the old instance writes
        # its instance's: its promotion hands it over (logfiles.hand_over).
        log_path = self.store.log_path(name)
        logfiles.rotate(log_path, self.log_max_bytes, self.log_keep)
        logfiles.write_marker(
            log_path,
            f"{verb} {name} instance {record.nonce}: {' '.join(redact_args(rendered.argv))}",
        )
        short = self.memory.wait(record, lambda why: self.event(name, verb, why, "waiting"))
        if isinstance(short, Stopped):
            return self._given_up(record, verb, log_path, counted)
        if short is not None:
            return self._no_memory(record, entry, verb, short, log_path)
        taken = self._port_taken(record)
        if taken is not None:
            return self._port_gone(record, entry, verb, taken, log_path)
        failpoints.hit("executor.spawn.before_exec")
        launch = StartRequest(entry=entry, record=record, rendered=rendered, log_path=log_path)
        try:
            where = self.backend.launch(launch)
        except Unplaceable as exc:  # the cluster has no room now: Pending, nothing held
            _not_started(log_path, str(exc))
            pending = self.maker.pending(entry, str(exc), name=name)
            outcome = "pending"
            if isinstance(exc, PullingFirst):  # on its way by itself: not the user's to fix
                # A restart's count goes on through its pull (`_reserve` takes it up).
                pending = replace(pending, phase=Phase.PULLING, restarts=record.restarts)
                outcome = "pulling"
            self.store.write(pending)
            if isinstance(exc, PullingFirst):
                self.event(name, verb, "placement", outcome, error=str(exc))
                return False  # it waits for its pull: no further round
            if said == str(exc):  # the Pending it came from, unchanged: no further round
                return False
            self.event(name, verb, "placement", outcome, error=str(exc))
            return True  # news: the next round reads it (and hears the same: no more)
        except ContainerExited as exc:  # it ran and ended: its restart policy judges it
            self._exited_at_start(record, exc, verb)
            return True
        except ImagePullFailed as exc:  # nothing ran: it waits holding nothing
            _not_started(log_path, str(exc))
            self._back_off(_unleased(record), str(exc))
            self.event(name, verb, "pull", "failed", error=str(exc))
            return True
        except SpawnError as exc:
            # A runtime's refusal says its own next move; a missing program has ours.
            hint = "" if isinstance(exc, ContainerError) else self._no_program(launch, exc)
            _not_started(log_path, f"{exc}{hint}")
            # An exec that failed is recorded as such (``Record.exec_failed``): --once
            # exits 1 on it, as Kubernetes shows RunContainerError at once.
            ended = _cannot_exec(exc, self.maker.now())
            self._back_off(record, f"{exc}{hint}", ended)
            self.event(name, verb, "spawn", "failed", error=str(exc))
            return True
        failpoints.hit("executor.spawn.before_record")
        now = self.maker.now()
        ref = where.ref
        assert ref is not None
        started = replace(
            _exec_forgotten(record),  # it exec'd: an earlier start's failure is over
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

    def _no_program(self, launch: StartRequest, exc: SpawnError) -> str:
        """The next move for a program not found, with the PATH its exec searched where
        that is known: this node's (a cluster's node searches its own)."""
        program = launch.rendered.argv[0] if launch.rendered.argv else ""
        known = isinstance(exc, ExecFailed) and not self.backend.places_engines
        looked = engine_path(program, launch.rendered.env) if known else None
        return no_program(launch.entry, looked)

    def _port_taken(self, record: Record) -> int | None:
        """A leased port another process bound since the lease chose it (a bind probe now,
        right before the launch): the engine would only die of "address in use". This
        node's ports only: a cluster's backend picks its own, on its node."""
        if self.backend.places_engines:
            return None
        return next((p for p in record.ports if not self.backend.port_bindable(p)), None)

    def _port_gone(
        self, record: Record, entry: Entry, verb: str, port: int, log_path: Path
    ) -> bool:
        """Nothing started: Pending, so the next round places it on a free port (no
        restart counted, no back-off: the engine never ran), its count kept."""
        why = (
            f"port {port} was taken by another process after it was chosen: placing it on "
            "another port"
        )
        _not_started(log_path, why)
        pending = self.maker.pending(entry, why, name=record.name)
        self.store.write(replace(pending, restarts=record.restarts))
        self.event(record.name, verb, "placement", "pending", error=why)
        return True

    def _given_up(self, record: Record, verb: str, log_path: Path, counted: int | None) -> bool:
        """A stop asked while the start waited for GPU memory: no engine ran, so nothing
        failed and no restart is counted. Pending, its lease given back (as a port
        taken before the launch leaves it), for the next run to place and start."""
        why = "the daemon stopped while the start waited for GPU memory: the next run starts it"
        _not_started(log_path, why)
        restarts = record.restarts if counted is None else counted
        self.store.write(_unplaced(record, why, restarts=restarts))
        self.event(record.name, verb, "stopping", "pending", error=why)
        return True

    def _no_memory(self, record: Record, entry: Entry, verb: str, why: str, log_path: Path) -> bool:
        """The GPU never freed the memory: back off (keeping the lease), never over-commit."""
        message = (
            f"GPU memory not free after {self.memory.timeout:g}s: {why}: "
            "stop the process holding it or lower spec.devices.memory"
        )
        _not_started(log_path, message)
        self._back_off(record, message)
        self.event(record.name, verb, "gpu memory", "not started", error=message)
        return True

    def _exited_at_start(self, record: Record, exc: ContainerExited, verb: str) -> None:
        """An engine that exited before its start was through (a container its start
        removed at once): judged as any exit, by its restart policy and with its code."""
        ended = ExitInfo(code=exc.code, at=self.maker.now())
        if restarts_after(record.restart_policy, exc.code):
            # As the planner's retry of any exit: the first restart at once, then the
            # back-off of the count so far (the next round's restart counts it).
            delay = backoff(record.restarts)
            when = "now" if delay == 0 else f"in {delay:g}s"
            self._back_off(record, f"{exc}; restart {when}", ended, delay=delay)
            self.event(record.name, verb, "spawn", "exited", error=str(exc), exit_code=exc.code)
            return
        phase = Phase.SUCCEEDED if exc.code == 0 else Phase.FAILED
        why = f"{exc}; restartPolicy {record.restart_policy}"
        ended_record = replace(record, phase=phase, message=why, last_exit=ended).released()
        self.store.write(ended_record)
        self.event(record.name, "fail", why, str(phase), exit_code=exc.code)

    def _back_off(
        self, record: Record, message: str, ended: ExitInfo | None = None, *,
        delay: float | None = None,
    ) -> None:  # fmt: skip
        """Not started: BackOff until the next restart's delay is over, saying why. A
        start that never ran waits at least the first back-off (``delay``: an exit's)."""
        delay = backoff(max(record.restarts, 1)) if delay is None else delay
        until = self.maker.now() + timedelta(seconds=delay)
        if ended is None:  # "could not exec" is said of the last start only
            record = _exec_forgotten(record)
        backing_off = replace(record, phase=Phase.BACKOFF, backoff_until=until, message=message)
        self.store.write(backing_off if ended is None else replace(backing_off, last_exit=ended))

    def _terminate(self, rec: Record, verb: str, reason: str, point: str | None = None) -> None:
        """Record Terminating, then tear down: a crash between them is finished by a later pass."""
        self._mark_terminating(replace(rec, phase=Phase.TERMINATING, message=reason))
        if point is not None:
            failpoints.hit(point)
        self.tear(rec, verb, reason, lambda: self.backend.teardown(rec))

    def _mark_terminating(self, terminating: Record) -> None:
        try:
            self.store.write(terminating)
        except OSError as exc:
            if not diskspace.full(exc):
                raise
            # A full disk, its ballast spent: the stop matters more than the note of it
            # (a crash before the record goes leaves a dead engine's record: a later
            # pass handles that as any other).

    def tear(self, rec: Record, verb: str, reason: str, teardown: Callable[[], T]) -> T:
        """``teardown`` (of ``rec``'s engine). One the backend may not prove ours
        (NotProvenOurs: nothing was signalled) keeps its record, as it was, saying why;
        the error goes on to the executor, which ends this action there (nothing after
        the teardown is done) and only this one: the rest of the pass goes on."""
        try:
            return teardown()
        except NotProvenOurs as exc:
            why = f"not stopped: {exc}"
            self.store.write(replace(rec, message=why))
            if rec.message != why:  # each pass tries again: the journal says it once
                self.event(rec.name, verb, reason, "not stopped", error=str(exc))
            self._held[rec.name] = why
            raise

    def _drain(self, rec: Record, new: Record | None, verb: str, reason: str) -> None:
        """The gateway's drain of ``rec`` before its teardown, once that teardown would not
        be refused: a gateway keeps a drained instance out of its rotation while its
        record stays, so a refusal after the drain left a running engine unrouted.
        Refused (NotProvenOurs), the record is kept as ``tear`` keeps it, undrained.
        The daemon's (``drains``) is only asked here: ``begin`` marks the record
        Terminating and signals nothing; a later pass signals it once the drain is over
        (``_finish``), so no stream in flight holds up the daemon's pass."""
        self.tear(rec, verb, reason, lambda: self.backend.prove_ours(rec))
        if self.defer_stops and self.drains is not None and not self.backend.stopped(rec):
            if self.drains.ask_drain(rec, new):
                self._draining[rec.name] = rec.nonce
            return
        self.drain(rec, new)

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

    # -- one handler per action that runs or stops an engine --------------------------

    def restart(self, action: Restart) -> bool:
        rec = self.store.read(action.name)
        if rec is None:
            return False
        self.tear(rec, action.verb, action.reason, lambda: self.backend.sweep(rec.nonce, rec.ref))
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
            started_at=None,  # the spawn's; the old engine's was not this one's
            ready_at=None,
            ready_boot=None,
            liveness_failures=0,
            unread_exit=_unread_exit(rec),
        )
        self.store.write(fresh)
        assert fresh.port is not None  # a Restart is planned only for a record holding its lease
        rendered = self.maker.render(
            action.entry, fresh.devices, fresh.port, fresh.extra_ports, name=fresh.name
        )
        lease = Lease(fresh, rendered)
        return self.spawn(lease, action.entry, verb="restart", counted=rec.restarts)

    def stop(self, action: Stop) -> bool:
        rec = self.store.read(action.name)
        if rec is None:
            return False
        if self.defer_stops and rec.phase is Phase.TERMINATING and rec.backoff_until is not None:
            return self._finish(rec, action)  # a deferred stop, begun by an earlier pass
        late = self._may_exec_late(rec, rec.nonce)  # `down` of a dead maker's reservation
        if isinstance(action, Replace) and self._kept_for(rec, action):
            return False  # it serves on until its replacement can start
        if (isinstance(action, Replace) or action.drain) and rec.holds:
            # a recreate: requests in flight end first, new ones wait; a replica scaled
            # away: its requests end first, the other replicas take the new ones
            self._drain(rec, None, action.verb, action.reason)
        if not late and self.begin(rec, action, "executor.stop.after_terminating"):
            return True
        self._terminate(rec, action.verb, action.reason, "executor.stop.after_terminating")
        if late:
            self._sweep_late(rec.nonce)
        self._stopped(rec, action)
        return True

    def begin(self, rec: Record, action: Deferred, point: str | None = None) -> bool:
        """A deferred teardown (the daemon's, ``defer_stops``): Terminating, with when its
        grace ends (``backoff_until``), then the stop signal, and the pass goes on. The
        record keeps its devices and port until the group is gone (invariants 1, 2): a
        later pass finishes it (``_finish``), woken by the engine's exit or the grace's
        end, and then does what ``action`` does after its teardown (``_ended``). False:
        not deferred (`--once`, `down`; an engine already gone; a backend that stops this
        instance by ``teardown`` alone, nothing sent), which the caller runs as before.

        Drained first (``_drain`` asked it): Terminating means draining, then signalled.
        The gateway routes nothing more to it (it is not Ready), its requests in flight
        go on, and ``backoff_until`` is the drain's end; a later pass signals it once the
        gateway's answer came or that end passed, and its grace runs from then."""
        draining = self._is_draining(rec)
        if not self.defer_stops or self.backend.stopped(rec):
            if draining:
                self._end_drain(rec)  # gone meanwhile: its teardown runs now
            return False  # nothing to wait for: the teardown's sweep is quick
        grace = rec.grace_seconds + (DRAIN_SLACK if draining else 0.0)
        until = self.maker.now() + timedelta(seconds=grace)
        marked = replace(rec, phase=Phase.TERMINATING, message=action.reason, backoff_until=until)
        self._mark_terminating(marked)
        if point is not None:
            failpoints.hit(point)
        if draining:
            self._stopping[rec.name] = (action, rec.nonce)
            return True
        if not self.tear(rec, action.verb, action.reason, lambda: self.backend.signal_stop(rec)):
            return False
        # Journalled once, at its end, as a teardown that waited was: the record says it now.
        self._stopping[rec.name] = (action, rec.nonce)
        return True

    def _finish(self, rec: Record, action: Stop) -> bool:
        """A deferred teardown's end, once its group is gone or its grace is over (then the
        SIGKILL): the teardown, then what its action does after one. Neither yet: nothing
        changes, the grace runs on. One this launcher did not begin (a daemon before it
        was killed, maybe before its signal) is signalled now, its deadline kept, and
        ends as the planner's ``Stop`` does (the record dropped; a declared deployment
        starts again from the next round)."""
        began = self._stopping.get(rec.name)
        if began is None or began[1] != rec.nonce:
            if self._resume_drain(rec):
                self._stopping[rec.name] = (action, rec.nonce)
                # Signalled once the drain is over, as ``begin``'s are; the gateways may
                # have answered before this daemon began, which asks for no pass: look now
                return self._drain_over(rec) and self._finish(rec, action)
            if not self.tear(
                rec, action.verb, action.reason, lambda: self.backend.signal_stop(rec)
            ):
                self.tear(rec, action.verb, action.reason, lambda: self.backend.teardown(rec))
                self._stopped(rec, action)
                return True
            began = self._stopping[rec.name] = (action, rec.nonce)
        elif self._is_draining(rec):
            if not self._drain_over(rec):
                return False
            self._end_drain(rec)
            if not self.backend.stopped(rec):
                return self._signal_drained(rec, began[0])
        over = rec.backoff_until is not None and self.maker.now() >= rec.backoff_until
        if not over and not self.backend.stopped(rec):
            return False
        spent = replace(rec, grace_seconds=0.0) if over else rec  # over: the SIGKILL at once
        first = began[0]
        self.tear(rec, first.verb, first.reason, lambda: self.backend.teardown(spent))
        self._stopping.pop(rec.name, None)
        self._ended(rec, first)
        return True

    def _resume_drain(self, rec: Record) -> bool:
        """A drain that the daemon before this one asked and did not see end (SIGKILLed
        while its gateways drained ``rec``) is this launcher's now: the answers in flight
        end whole before the stop signal, as they would have. Signalled at once, they
        were cut; the record keeps the drain's end (``backoff_until``) its asker gave."""
        if not self.defer_stops or self.drains is None or self.backend.stopped(rec):
            return False
        if not self.drains.resume_drain(rec):
            return False
        self._draining[rec.name] = rec.nonce
        return True

    def _is_draining(self, rec: Record) -> bool:
        return rec.name in self._draining and self._draining[rec.name] == rec.nonce

    def _drain_over(self, rec: Record) -> bool:
        """The drain of ``rec`` may end: the gateway answered, its time is up, or its
        engine is gone (a crash while it drained)."""
        up = rec.backoff_until is not None and self.maker.now() >= rec.backoff_until
        answered = self.drains is None or self.drains.drain_answered(rec)
        return up or answered or self.backend.stopped(rec)

    def _end_drain(self, rec: Record) -> None:
        self._draining.pop(rec.name, None)
        if self.drains is not None:
            self.drains.end_drain(rec)

    def _signal_drained(self, rec: Record, action: Deferred) -> bool:
        """A drained engine's stop signal: its whole grace from now (``backoff_until``)."""
        until = self.maker.now() + timedelta(seconds=rec.grace_seconds)
        self._mark_terminating(replace(rec, backoff_until=until))
        # Not proven ours (NotProvenOurs): a later pass signals it as one it did not begin.
        began = self._stopping.pop(rec.name)
        if self.tear(rec, action.verb, action.reason, lambda: self.backend.signal_stop(rec)):
            self._stopping[rec.name] = began
            return True
        # Nothing sent (it ended meanwhile): the teardown's sweep, and the action's end.
        self.tear(rec, action.verb, action.reason, lambda: self.backend.teardown(rec))
        self._ended(rec, action)
        return True

    def _ended(self, rec: Record, action: Deferred) -> None:
        """What ``action`` does once its teardown is through (``rec``: the record then)."""
        match action:
            case Stop():
                self._stopped(rec, action)
            case Park():
                self._parked(action)
            case Preempt():
                self._preempted(rec, action)
            case Fail():
                self.failed(rec, action)
            case Promote():
                # The old record goes as an interrupted promotion's does: the planner's
                # next round renames ``@next`` (planner/rolling ``judge_next``), which may
                # have been abandoned meanwhile (a newer spec): then it is not renamed.
                self._stopped(rec, Stop(name=rec.name, reason=action.reason))
            case _:
                assert_never(action)

    def forget_stops(self, records: Mapping[str, Record]) -> None:
        """Forget the deferred stops and drains another finished (a `--once` or `down`
        beside the daemon): their record is gone, or is another engine's (a new nonce). None
        of this launcher's passes would finish them, and a daemon's launcher lives as long
        as it."""
        for name, (_, nonce) in list(self._stopping.items()):
            rec = records.get(name)
            if rec is None or rec.nonce != nonce:
                del self._stopping[name]
        for name, nonce in list(self._draining.items()):  # a drain, likewise
            rec = records.get(name)
            if rec is None or rec.nonce != nonce:
                del self._draining[name]

    def carry_stops(self, before: Launcher) -> None:
        """The deferred stops a launcher this one replaces (a reload) had begun."""
        self._stopping.update(before._stopping)
        self._draining.update(before._draining)

    def _stopped(self, rec: Record, action: Stop) -> None:
        """After a stop's teardown: the record dropped, or Pending for what replaces it."""
        if isinstance(action, Replace) or action.evict:
            # The deployment stays known between the teardown and the next round's
            # reservation: a dropped record would make the gateway answer 404 to the
            # requests that should wait for the new engine. Pending holds nothing, and
            # the planner places a Pending record of a changed spec (planner/records).
            self.store.write(_unplaced(rec, action.reason))
            then = "for the new" if isinstance(action, Replace) else "until the drain ends"
            self.event(action.name, action.verb, action.reason, f"stopped; Pending {then}")
            return
        self._drop(action, "stopped; record dropped", "executor.stop.after_delete")

    def _drop(self, action: Stop | Release, outcome: str, point: str | None = None) -> None:
        """Drop the record and journal it. A pruned deployment's remembered count goes
        with it: a later manifest of the same name starts from its own spec, not from the
        count of the one before. Once its last record is gone the journal says so
        (``removed``): `events NAME` of a later deployment of the name starts there, as
        Kubernetes ties events to a uid. Its replicas are pruned concurrently: one step
        each, so the last one's look finds none and its ``removed`` comes last. A last
        record dropped while its manifest stays (`down`, a drain) leaves the history open,
        its event naming the set (``owner``): that set's pass ends it once the manifest is
        gone too (``Reconciler._end_histories``)."""
        with self._dropping:
            self.store.delete(action.name)
            if point is not None:
                failpoints.hit(point)
            name, instance = base_name(action.name), instance_of(action.name)
            left = self.store.peek().records
            last = all(base_name(other) != name for other in left)
            if all(instance_of(other) != instance for other in left):
                self.store.remove_runtime_dirs(instance)  # the instance's last record went
            if action.undeclared:  # not a replica scaled away, a recreate, `down`
                self._forget_count(action)
            ours = {} if action.undeclared or not last else {"owner": self.maker.owner}
            self.event(action.name, action.verb, action.reason, outcome, **ours)
            if last and action.undeclared:
                self.event(name, REMOVED, action.reason, REMOVED_OUTCOME)

    def _forget_count(self, action: Stop | Release) -> None:
        try:
            scale.forget(self.store.state_dir, base_name(action.name))
        except OSError as exc:  # the next pass's autoscaler forgets it (nothing runs)
            where = self.store.layout.scale
            sidefiles.warn(where, f"count of {action.name} not dropped: {exc}")

    def fetch(self, action: Fetch) -> bool:
        """A start whose image is not here fetches it first, holding nothing: Pulling
        while it runs, backing off holding nothing when it failed (the retry pulls again).
        Nothing is placed, so nobody is preempted for a pull that may fail; the next round
        places the start once its image is here. As a launch that found its image missing
        did, its Pulling record ends the pass's rounds, and it is journalled as the start's
        steps (a "pull" event says an image was pulled)."""
        try:
            held = self.backend.fetch(action.entry.deployment.spec)
        except ContainerError as exc:  # its pull could not start: a failed pull, in its words
            held = Held(str(exc), failed=True)
        if held is None:
            return True  # here now: the next round places it
        current = self.store.read(action.name)
        pending = self.maker.pending(action.entry, held.why, name=action.name)
        record = replace(pending, restarts=kept_count(current, pending))
        if held.failed:  # nothing ran: it waits out its back-off holding nothing
            self._back_off(_unleased(record), held.why)
            self.event(action.name, "start", "pull", "failed", error=held.why)
            return True
        phase = Phase.PENDING if held.pending else Phase.PULLING
        record = replace(record, phase=phase)
        fresh = current is None or current.phase is not phase
        if not fresh and current is not None and _same_wait(current, record):
            return False
        self.store.write(record)
        if fresh or held.pending:  # a Pending's news is its message
            outcome = "pending" if held.pending else "pulling"
            self.event(action.name, "start", "placement", outcome, error=held.why)
        return False  # it waits for its image: no further round (its end is the next pass's)

    def _kept_for(self, rec: Record, action: Replace) -> bool:
        """A Ready engine is not stopped for a spec whose image is not on the node yet: its
        pull is started (or its failure said) and the engine serves meanwhile, so a tag's
        typo stops nothing. Said in the journal when it changes (not on the record: a Ready
        record's message would outlive a spec changed back)."""
        if action.entry is None or rec.phase is not Phase.READY:
            return False
        held = self.backend.prepared(action.entry.deployment.spec, rec)
        if held is None:
            self._kept.pop(rec.name, None)
            return False
        if self._kept.get(rec.name) != held.why:
            self._kept[rec.name] = held.why
            self.event(rec.name, action.verb, action.reason, "waiting", error=held.why)
        if held.failed:
            self._held[rec.name] = held.why
        return True

    def take_held(self) -> dict[str, str]:
        """The engines kept since the last call because their replacement cannot start, or
        because they could not be proven ours to stop (name -> why): what ``--once`` (and
        `down`) exits 1 on, though the pass went through."""
        held, self._held = self._held, {}
        return held

    def promote(self, action: Promote) -> bool:
        """GatewayDrain and stop the old instance, then rename ``<name>@next`` to ``<name>``.

        Crash-safe in every step: the old record goes Terminating before its teardown
        (a later pass finishes it; in the daemon a later pass always does, and the round
        after renames: ``begin``), the rename is one atomic write of the new record
        under the old name (the same nonce in both tells a later pass to finish), and
        only then is ``@next`` deleted.
        """
        new = self.store.read(next_name(action.name))
        if new is None:
            return False
        old = self.store.read(action.name)
        if old is not None and old.nonce != new.nonce:
            self._drain(old, new, action.verb, action.reason)
            if self.begin(old, action, "executor.promote.after_terminating"):
                return True  # the daemon's: the rename comes once the old group is gone
            self._terminate(old, action.verb, action.reason, "executor.promote.after_terminating")
        self.store.write(replace(new, name=action.name))
        failpoints.hit("executor.promote.after_rename")
        # Before the delete: a crash in between promotes again, and hands over the rest.
        logs = self.store.log_path
        logfiles.hand_over(logs(new.name), logs(action.name), self.log_keep)
        self.store.delete(new.name)
        pid = new.ref.pid if new.ref else "none"
        self.event(action.name, action.verb, action.reason, f"serving from pid {pid}")
        return True

    def park(self, action: Park) -> bool:
        """Tear down what runs (if anything), then record the deployment Idle."""
        rec = self.store.read(action.name)
        if rec is not None and rec.holds and rec.phase is Phase.READY:
            # The plan saw no request in flight (planner/ondemand `_busy`), but the gateway
            # may have sent one since: it ends before the teardown, new ones wake it again.
            self._drain(rec, None, action.verb, action.reason)
        if rec is not None and (rec.holds or rec.ref is not None):
            if self.begin(rec, action):
                return True  # Idle once its group is gone (``_ended``)
            self._terminate(rec, action.verb, action.reason)
        self._parked(action)
        return rec is None or rec.phase is not Phase.IDLE or rec.spec_hash != action.entry.hash

    def _parked(self, action: Park) -> None:
        self.store.write(self.maker.idle(action.entry, action.reason, name=action.name))
        self.event(action.name, action.verb, action.reason, "idle: holds nothing")

    def preempt(self, action: Preempt) -> bool:
        """Stop the engine; the record stays Pending, holding nothing, saying who won. In
        the daemon the record is Terminating, holding its devices, until its group is
        gone: the winner's start waits for them (its reservation finds them held)."""
        rec = self.store.read(action.name)
        if rec is None:
            return False
        if rec.holds:  # its answers in flight end first (at most its grace period)
            self._drain(rec, None, action.verb, action.reason)
        if self.begin(rec, action):
            return True
        self.tear(rec, action.verb, action.reason, lambda: self.backend.teardown(rec))
        self._preempted(rec, action)
        return True

    def _preempted(self, rec: Record, action: Preempt) -> None:
        self.store.write(_unplaced(rec, action.reason))
        self.event(action.name, action.verb, action.reason, "stopped; Pending until room returns")

    def release(self, action: Release) -> bool:
        late = self._may_exec_late(self.store.read(action.name), action.nonce)
        self.backend.sweep(action.nonce)
        if late:
            self._sweep_late(action.nonce)
        failpoints.hit("executor.release.before_delete")
        rec = self.store.read(action.name) if action.restarts is not None else None
        if rec is not None and action.restarts is not None:  # a port move: placed again
            self.store.write(_unplaced(rec, action.reason, restarts=action.restarts))
            self.event(action.name, action.verb, action.reason, f"Pending for {action.afresh}")
            return True
        self._drop(action, "record dropped")
        return True

    def _may_exec_late(self, rec: Record | None, nonce: str | None) -> bool:
        """``rec`` is a reservation of ``nonce`` with no engine recorded, released by a pass
        (its maker is gone) or stopped by `down`: its maker may have died between its
        fork and the engine's exec. Asked of a local process engine only."""
        if nonce is None or rec is None or self.backend.name != backendnames.LOCAL:
            return False
        return rec.phase is Phase.RESERVED and rec.ref is None and rec.nonce == nonce

    def _sweep_late(self, nonce: str | None) -> None:
        """Sweep ``nonce`` again until a fork -> exec has surely ended (procscan.SETTLE).
        A maker SIGKILLed after its fork and before the child's exec leaves that child
        running: it carries the engine's marker only once it execs, tens of ms after the
        maker's death on a busy host, so the first sweep found nothing, the record went,
        and the engine then came up with no record, holding the port a start placed anew
        was given ("address in use"; the SIGKILL soak's BackOff after recovery)."""
        deadline = time.monotonic() + procscan.SETTLE
        while time.monotonic() < deadline:
            time.sleep(LATE_SWEEP_POLL)
            self.backend.sweep(nonce)

    def reap(self, action: Reap) -> bool:
        for proc in action.processes:
            if proc.noted is None:  # one found by its spawn note alone is not proven ours
                self.backend.kill(proc.ref)
        for nonce in {p.nonce for p in action.processes}:
            self.backend.sweep(nonce)
        pids = ",".join(str(p.ref.pid) for p in action.processes)
        self.event(action.name, action.verb, action.reason, f"killed {pids}")
        return True


def _unread_exit(rec: Record) -> UnreadExit | None:
    """What a restart keeps of the run it ends: a container engine whose code its runtime
    had not said (down when the pass saw it end), to read once it answers; else what
    the record kept before (a run that ended with its code leaves that one unread)."""
    ended = rec.last_exit
    if rec.container is None or rec.nonce is None or rec.on_cluster or ended is None:
        return rec.unread_exit
    if ended.code is not None or ended.signal is not None:
        return rec.unread_exit
    if rec.started_at is not None and ended.at < rec.started_at:
        return rec.unread_exit  # an earlier run's exit: this run ended otherwise (liveness)
    return UnreadExit(nonce=rec.nonce, container=rec.container, exit=ended)


def _same_wait(a: Record, b: Record) -> bool:
    keys = ("phase", "message", "spec_hash", "owner", "source", "restarts")
    return all(getattr(a, k) == getattr(b, k) for k in keys)


def _not_started(log_path: Path, why: str) -> None:
    """The line after a start's marker when no engine ran: the marker alone read as an
    engine that started and said nothing (docker's daemon down: its `image inspect`
    failed, no `run` was ever made)."""
    logfiles.write_note(log_path, f"not started: {why}")


def _cannot_exec(exc: SpawnError, now: datetime) -> ExitInfo | None:
    """The last exit of a start whose program's exec failed (its code the gate's 127);
    None for any other refusal (a runtime's, a cluster's), which says its own words."""
    if not isinstance(exc, ExecFailed):
        return None
    return ExitInfo(code=exc.code, at=now, reason=CANNOT_EXEC)


def _exec_forgotten(rec: Record) -> Record:
    """``rec`` without a last exit that says an exec failed: once a later start went
    further (it ran, or backed off for another reason) that is no longer what stops it."""
    ended = rec.last_exit
    return replace(rec, last_exit=None) if ended and ended.reason == CANNOT_EXEC else rec


def _unleased(rec: Record) -> Record:
    """``rec`` giving its lease back before its back-off (``Record.unleased_backoff``): a
    start refused before any engine ran keeps no GPU idle while it waits, and the ledger
    places its retry afresh, so no device or port is ever booked twice."""
    return replace(rec.released(), ref=None, container=None, reserved_by=None)


def _unplaced(rec: Record, reason: str, *, restarts: int = 0) -> Record:
    """``rec`` with its run and lease gone: Pending, no device, no port, no nonce, its
    restart count ``restarts`` (a port move's, which the next placement takes up)."""
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
        restarts=restarts,
    )
