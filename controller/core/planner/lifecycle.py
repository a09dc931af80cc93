"""A record's life once it has run: readiness, liveness, crash, back-off, restart, resync.

Each function judges one of our records whose manifest is valid and unchanged and
returns what it needs (a Pending one asks to be placed again: a :class:`Want`).
"""

from __future__ import annotations

from datetime import timedelta

from controller.core.actions import (
    AnyAction,
    Fail,
    HoldRestart,
    MarkReady,
    Probed,
    Release,
    Restart,
    Resync,
    Stop,
)
from controller.core.devices.placement import ledger_for
from controller.core.elapsed import elapsed
from controller.core.manifest.specs import Entry
from controller.core.planner.context import Context, Judged, Want
from controller.core.state import (
    Phase,
    Record,
    RecordView,
    backoff,
    backoff_cause,
)

BACKOFF_RESET = 600.0  # seconds Ready after which a crash counts as the first again
CLOCK_SLACK = 1.0  # seconds a back-off may seem longer than its length (rounding, writes)


def restarts_after(policy: str, code: int | None) -> bool:
    """Whether ``restartPolicy`` restarts an engine that exited with ``code`` (None: unknown)."""
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def lifecycle(ctx: Context, view: RecordView, entry: Entry) -> list[Judged]:
    rec = view.record
    if rec.phase is Phase.PENDING:
        return [Want(entry, "retrying placement", rec.name)]
    if rec.phase is Phase.PULLING:  # placed once its pulls are done (planner/pulling)
        return [Want(entry, _pulled(entry), rec.name)]
    if rec.phase in (Phase.FAILED, Phase.SUCCEEDED):
        return []  # terminal until the spec changes
    if view.alive and _moved(view):
        return [_resync(view)]
    if view.alive:
        return list(running(ctx, view))
    if rec.phase is Phase.BACKOFF:
        return list(_backoff_due(ctx, view, entry))
    return [_exited(ctx, view)]


def _pulled(entry: Entry) -> str:
    """What a Pulling record waited for, the reason it is placed with: its model files,
    its container image (a spec may name either, or both)."""
    spec = entry.deployment.spec
    waited = (
        ("model files in the cache", spec.source is not None),
        ("image on the node", spec.container is not None),
    )
    return " and ".join(what for what, needed in waited if needed) or "its pull ended"


def running(ctx: Context, view: RecordView) -> tuple[AnyAction, ...]:
    """A live engine: evicted by a drain, Ready once probed, retried past its deadline."""
    rec = view.record
    if ctx.drain is not None and ctx.drain.evict:
        return (Stop(name=rec.name, reason=f"evicted: {ctx.drain_text()}", drain=True, evict=True),)
    if rec.phase is Phase.READY:
        return liveness(ctx, view)
    if rec.phase is not Phase.STARTING:
        return ()
    if view.probe is not None and view.probe.ready:
        return (MarkReady(name=rec.name, reason=view.probe.detail),)
    if past_deadline(ctx, view):
        return (retry(ctx, rec, _not_ready(ctx, view)),)
    return ()


def _not_ready(ctx: Context, view: RecordView) -> str:
    """Why a Starting engine is retried at its deadline. One the backend is still
    bringing back (Ray restarting its actor after its node was lost) never ran: the
    backend's words, not the probe of the lost engine's old address ("connection
    refused", and a hint about `{host}`, sent people to the engine's command)."""
    now = view.instance
    if now is not None and now.ref is None and now.message:
        return f"not back by its readiness deadline: {now.message}"
    last = f" (last probe: {view.probe.detail})" if view.probe else ""
    return f"not ready by its readiness deadline{last}{_loopback_hint(ctx, view)}"


def _loopback_hint(ctx: Context, view: RecordView) -> str:
    """On a cluster the engine is probed at its node's address: a command engine whose
    argv names no ``{host}`` binds what its own default is, most often loopback alone,
    and is refused there forever. Say so where that is the likely cause."""
    entry = ctx.entry(view.record.name)
    refused = view.probe is not None and "connection refused" in view.probe.detail.lower()
    if not (view.record.on_cluster and refused and entry is not None):
        return ""
    spec = entry.deployment.spec
    if spec.engine != "command" or any("{host}" in a for a in (*(spec.command or ()), *spec.args)):
        return ""
    return (
        "; on this backend the engine must listen on its node's address: pass it "
        "`{host}` (e.g. `--host {host}`)"
    )


def liveness(ctx: Context, view: RecordView) -> tuple[AnyAction, ...]:
    """A Ready engine's liveness answers (none counted before, oldest first):
    failureThreshold failures in a row restart it like a crash (back-off and all); fewer
    are counted in the record, and an answer after failures sets the count back to 0."""
    rec, probe = view.record, view.record.liveness
    if probe is None:
        return ()
    failures, threshold = rec.liveness_failures, probe.failure_threshold
    for answer in view.liveness:
        failures = 0 if answer.ready else failures + 1
        if failures >= threshold:
            why = f"liveness probe {probe.kind} failed {failures} times in a row"
            return (retry(ctx, rec, f"{why} (last: {answer.detail})"),)
    if not view.liveness or failures == rec.liveness_failures:
        return ()
    last = view.liveness[-1]
    if failures == 0:
        why = f"liveness probe passes again: {last.detail}"
    else:
        why = f"liveness probe failed ({failures} of {threshold} in a row): {last.detail}"
    return (Probed(name=rec.name, reason=why, failures=failures),)


def retry(ctx: Context, rec: Record, why: str, view: RecordView | None = None) -> Fail:
    """BackOff until the next restart is due (or Failed under restartPolicy Never)."""
    restarts = rec.restarts
    if _ready_for(ctx, rec) >= BACKOFF_RESET:
        restarts = 0  # it ran fine for 10 minutes: this crash counts as the first
    if rec.restart_policy == "Never":
        return Fail(name=rec.name, reason=f"{why}; restartPolicy Never", phase=Phase.FAILED)
    delay = backoff(restarts)
    when = "now" if delay == 0 else f"in {delay:g}s"
    if delay == 0 and ctx.drain is not None:  # "restart now" would not happen: say what holds it
        when = drain_held(ctx)
    return Fail(
        name=rec.name,
        reason=f"{why}; restart {when}",
        phase=Phase.BACKOFF,
        retry_at=ctx.now + timedelta(seconds=delay),
        restarts=restarts,
        exit=view.exit if view else None,
    )


def _ready_for(ctx: Context, rec: Record) -> float:
    """Seconds since it was last Ready (0: not Ready since its start), on the boot clock
    where the record has it: an hour's step back does not keep a crash counting on."""
    if rec.ready_at is None:
        return 0.0
    return elapsed(ctx.now, rec.ready_at, ctx.observed.boot, rec.ready_boot)


def past_deadline(ctx: Context, view: RecordView) -> bool:
    """Starting for longer than its readiness deadline. The engine's age by the boot clock
    decides where it is known, so a wall-clock step either way neither kills an engine
    early nor lets one start for an extra hour; else the recorded wall-clock deadline."""
    rec = view.record
    if view.age is not None and rec.ready_deadline_seconds is not None:
        return view.age >= rec.ready_deadline_seconds
    return rec.ready_deadline_at is not None and ctx.now >= rec.ready_deadline_at


def backoff_waits(ctx: Context, rec: Record) -> bool:
    """The back-off is not over. No back-off is longer than ``backoff(restarts)`` (at
    least the first's), so one due further from now than that was set by a clock since
    stepped back: it is over (it never waits longer than its configured length from now)."""
    if rec.backoff_until is None or ctx.now >= rec.backoff_until:
        return False
    left = (rec.backoff_until - ctx.now).total_seconds()
    return left <= backoff(max(rec.restarts, 1)) + CLOCK_SLACK


def _backoff_due(ctx: Context, view: RecordView, entry: Entry) -> tuple[Judged, ...]:
    rec = view.record
    if backoff_waits(ctx, rec):
        return ()
    if ctx.drain is not None:  # nothing restarts while the node is drained: say so, once
        held = f"{backoff_cause(rec.message)}; restart {drain_held(ctx)}"
        return () if rec.message == held else (HoldRestart(name=rec.name, reason=held),)
    if rec.unleased_backoff:  # its devices may be another's now: placed by the ledger
        return (Want(entry, f"back-off over (restart {rec.restarts + 1}): placing it", rec.name),)
    gone = _no_way_back(ctx, rec)
    if gone:  # a restart is a start: it never lands where a placement could not
        moved = Release(
            name=rec.name,
            reason=f"{'; '.join(gone)}: placing it afresh",
            nonce=rec.nonce,
            restarts=rec.restarts + 1,
            afresh="other devices",
        )
        return (moved,)
    taken = [p for p in rec.ports if p in ctx.observed.listening]
    if taken:  # a restart there would only crash-loop: release, place afresh next round
        reason = f"port {taken[0]} was taken by another process while the engine was down"
        # the start there is the restart the back-off waited for: counted as one
        return (Release(name=rec.name, reason=reason, nonce=rec.nonce, restarts=rec.restarts + 1),)
    return (
        Restart(
            name=rec.name,
            reason=f"back-off over (restart {rec.restarts + 1})",
            entry=entry,
            restarts=rec.restarts + 1,
        ),
    )


def _no_way_back(ctx: Context, rec: Record) -> list[str]:
    """Why a local record's restart may not go back to its devices: one taken out of the
    inventory (a card sent for repair), or one whose size was lowered below what its
    holders ask of it (invariant: what a device's holders ask never exceeds its memory).
    The engine ran on there until it exited; a cluster record's devices are its node's."""
    if rec.on_cluster:
        return []
    have = ctx.inventory.by_key()
    gone = [f"{d} is no longer in the node's inventory" for d in rec.devices if d not in have]
    if gone or rec.memory is None:
        return gone
    ledger = ledger_for((v.record for v in ctx.observed.records.values()), ctx.observed)
    over = [have[d] for d in rec.devices if (ledger.room(have[d]) or 0) < 0]
    return [f"{d.key} has {d.describe_memory()}, less than its holders ask" for d in over]


def drain_held(ctx: Context) -> str:
    """What the drain holds is said in these words: after "restart " in a BackOff message
    (the views find it by ``state.RESTART_HELD`` and count no time down), after a spec
    change a running engine waits to apply (``state.CHANGE_HELD``)."""
    return f"held: {ctx.drain_text()}"


def _exited(ctx: Context, view: RecordView) -> Fail | Release:
    rec = view.record
    exit_text = str(view.exit) if view.exit else "exited"
    code = view.exit.code if view.exit else None
    if not restarts_after(rec.restart_policy, code):
        phase = Phase.SUCCEEDED if code == 0 else Phase.FAILED
        reason = f"engine {exit_text}; restartPolicy {rec.restart_policy}"
        return Fail(name=rec.name, reason=reason, phase=phase, exit=view.exit)
    taken = _taken_before_ready(ctx, rec)
    if taken is not None:  # no crash of its own: no count, no back-off, another port now
        reason = (
            f"port {taken} was taken by another process before the engine bound it (engine "
            f"{exit_text} before it was Ready): placing it on another port, no restart counted"
        )
        return Release(name=rec.name, reason=reason, nonce=rec.nonce, restarts=rec.restarts)
    return retry(ctx, rec, f"engine {exit_text}", view)


def _taken_before_ready(ctx: Context, rec: Record) -> int | None:
    """A port of this node's start that was never Ready, bound now by another process
    (its own engine is dead): what the engine died of ("address already in use"), as an
    engine binds its port only once loaded, minutes after reconcile chose it."""
    if rec.phase is not Phase.STARTING or rec.on_cluster:
        return None
    return next((p for p in rec.ports if p in ctx.observed.listening), None)


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
