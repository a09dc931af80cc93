"""Judge every name the plan sees: a new deployment, one of ours, another manifest
set's, a reservation whose maker died, and engine processes no record accounts for.

Every function returns what it found (:data:`Judged`); nothing here places a start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from controller.core.actions import (
    Adopt,
    AnyAction,
    Conflict,
    Fail,
    MarkReady,
    MarkSpec,
    Park,
    Promote,
    Reap,
    Reject,
    Release,
    Replace,
    Stop,
    Update,
)
from controller.core.devicefaults import describe
from controller.core.manifest.names import in_repo
from controller.core.manifest.specs import (
    NOT_HASHED,
    Entry,
    base_name,
    changed_fields,
    document_default,
    document_hash,
    is_next,
    next_name,
    spec_document,
    with_config,
    with_key_file,
    with_secrets,
)
from controller.core.planner.context import (
    EMPTIED,
    Context,
    Desired,
    Judged,
    Prefetch,
    Roll,
    Want,
)
from controller.core.planner.lifecycle import lifecycle, running
from controller.core.planner.ondemand import idle_reason, parked
from controller.core.planner.recreate import drain_holds, hold, recreate, unheld
from controller.core.planner.rolling import judge_next, rolling, rollout
from controller.core.state import SPEC_INVALID, MarkedProcess, Phase, Record, RecordView

TEARDOWN = "finishing a teardown under way"  # a Terminating record's Stop


# Records on an Unhealthy device (devicefaults.py) are moved: the instance is stopped
# and its record left Pending holding nothing (a ``Replace``: ``plan`` shows destroy and
# create), and the next round places it again like any start, on the devices the ledger
# still offers (an Unhealthy one is held by its fault, ``placement.ledger_for``).
def move_off_unhealthy(ctx: Context, view: RecordView) -> list[AnyAction]:
    """A teardown for our record holding an Unhealthy device; [] otherwise."""
    rec = view.record
    faults = ctx.observed.unhealthy
    bad = [d for d in rec.devices if d in faults] if rec.holds else []
    if not bad or rec.phase is Phase.RESERVED:
        return []  # a reservation's maker starts it; the round after moves it
    why = "; ".join(describe(faults[d]) for d in bad)
    if ctx.entry(rec.name) is None:
        return [Stop(name=rec.name, reason=f"{why}: stopping it")]
    return [Replace(name=rec.name, reason=f"{why}: moving it to a healthy device", fields=())]


# Spec fields a running engine never sees: a change to only these updates the record.
IN_PLACE = ("readiness", "livenessProbe", "restartPolicy", "stopGracePeriodSeconds", "priority")
SCALED_TO_ZERO = "scaled to 0: declared, nothing running"
RESTARTED = "restarted by `reconcile restart`"
VALID_AGAIN = "manifest is valid again"  # a rejected manifest, fixed


def judge(ctx: Context) -> list[Judged]:
    found: list[Judged] = [*_orphans(ctx)]
    desired, observed = ctx.desired, ctx.observed
    for name in sorted(set(ctx.instances) | set(observed.records) | set(desired.invalid)):
        found += _judge(ctx, name)
    return _handed_on(found)


def _handed_on(found: list[Judged]) -> list[Judged]:
    """A promotion retires the old instance itself (drained, torn down, its record
    overwritten by the ``@next``'s), so whatever the old one's own judging asked for this
    round (a Restart, a Replace, a liveness Fail, a Want to place it) gives way: it would
    start or stop an engine the promotion retires, as ``plan`` drops a preempted record's
    own action. Orphans' reaps stay: they are other engines' processes."""
    promoted = {j.name for j in found if isinstance(j, Promote)}
    return [j for j in found if isinstance(j, Promote | Reap) or _subject(j) not in promoted]


def _subject(judged: Judged) -> str:
    """The record a judged action or request is about."""
    return judged.record if isinstance(judged, Want | Roll | Prefetch) else judged.name


def _judge(ctx: Context, name: str) -> list[Judged]:
    entry = ctx.instances.get(name)
    view = ctx.observed.records.get(name)
    if view is None:
        return _unrecorded(ctx, name, entry)
    if view.record.elsewhere(ctx.observed.node):
        return []  # another node's record: only that node may act on it
    if not ctx.ours(view.record):
        return _foreign(ctx, view, entry)
    return _own(ctx, view, entry)


def _unrecorded(ctx: Context, name: str, entry: Entry | None) -> list[Judged]:
    if name in ctx.observed.unreadable or next_name(name) in ctx.observed.records:
        return []  # never over an unknown version; a `@next` takes the name
    if name in ctx.observed.spared:  # an engine no pass of this set may adopt or reap
        reason = f"name {name!r} is held by {ctx.observed.spared[name]}"
        return [Conflict(name=name, reason=reason)]
    if name in ctx.observed.adopting:  # `plan`: the pass gives the engine its record back
        ref = ctx.observed.adopting[name]
        reason = (f"record torn or lost: the pass adopts its engine (pid {ref.pid}), as its "
                  "marker (or its spawn note) names it")  # fmt: skip
        return [Adopt(name=name, reason=reason, ref=ref)]
    if entry is None and name in ctx.desired.skipped:
        return []  # another node's broken manifest: its error is said, no record here
    if entry is None:  # every deployment a pass has seen gets a record, so status shows it
        error = ctx.desired.invalid[name]
        return [Reject(name=name, reason=f"{SPEC_INVALID}not started): {error}")]
    if ctx.scaled_to_zero(name):
        return [Park(name=name, reason=SCALED_TO_ZERO, entry=entry)]
    if parked(ctx, entry, None):
        return [Park(name=name, reason="OnDemand: idle until a request", entry=entry)]
    if name != entry.name:
        return [Want(entry, f"new replica (replicas: {ctx.desired.count(entry.name)})", name)]
    return [Want(entry, "new deployment")]


def _foreign(ctx: Context, view: RecordView, entry: Entry | None) -> list[Judged]:
    """Another manifest set's record: only a dead reservation is ours to resolve."""
    rec = view.record
    if rec.phase is Phase.RESERVED and not view.maker_alive:
        return [_resolve_reservation(view)]  # invariant 3 binds every pass
    if entry is None:
        return []
    # Most often the same set run with other -f folders (its owner is their paths): the
    # fix is its old name, not a rename.
    source = in_repo(ctx.desired.repo, rec.source)
    reason = (
        f"name {rec.name!r} is owned by another manifest set ({rec.owner}, "
        f"from {source}): if that set is this one under other -f folders, pass "
        f"`--owner {rec.owner!r}` (every run of a set must give it one name); else rename "
        "one of the two deployments"
    )
    return [Conflict(name=rec.name, reason=reason)]


def _own(ctx: Context, view: RecordView, entry: Entry | None) -> list[Judged]:
    rec = view.record
    if rec.phase is Phase.RESERVED:
        return [] if view.maker_alive else [_resolve_reservation(view)]
    if rec.phase is Phase.TERMINATING:
        # Its gateway drain may still run (the gateway outlives the pass that died): one
        # that finishes the stop in place drains first, so what it streams ends whole.
        # Its words say why it goes (a preemption's victim, a pruned engine): `plan` beside
        # a daemon still draining it said "interrupted" alone, of a teardown under way.
        why = f"{TEARDOWN}: {rec.message}" if rec.message else TEARDOWN
        return [Stop(name=rec.name, reason=why, drain=True)]
    if moved := move_off_unhealthy(ctx, view):
        return list(moved)
    if is_next(rec.name):
        return judge_next(ctx, view)
    if entry is None and ctx.scaled_away(rec.name):
        return list(_scaled_down(ctx, view))
    if entry is None:
        return list(_undeclared(ctx, view))
    marked: list[Judged] = []
    if not rec.spec_valid:
        marked.append(MarkSpec(name=rec.name, reason=VALID_AGAIN, valid=True))
    return marked + _declared(ctx, view, entry)


def _declared(ctx: Context, view: RecordView, entry: Entry) -> list[Judged]:
    judged = _judge_declared(ctx, view, entry)
    return unheld(view.record, judged) + judged


def _judge_declared(ctx: Context, view: RecordView, entry: Entry) -> list[Judged]:
    """Our record of a valid manifest: parked, wanted, changed, or living its life."""
    rec = view.record
    if ctx.scaled_to_zero(rec.name):
        if rec.phase is not Phase.IDLE or rec.spec_hash != entry.hash:
            return [Park(name=rec.name, reason=SCALED_TO_ZERO, entry=entry)]
        return list(_restated(ctx, rec, entry))  # an alias routes to it, idle or not
    if parked(ctx, entry, rec):
        if rec.phase is not Phase.IDLE or rec.spec_hash != entry.hash:
            act = ctx.desired.activations.get(entry.name)
            return [Park(name=rec.name, reason=idle_reason(entry, rec, act), entry=entry)]
        return list(_restated(ctx, rec, entry))
    if rec.phase is Phase.IDLE and rec.message == SCALED_TO_ZERO:
        return [Want(entry, f"scaled up to {ctx.desired.count(entry.name)}", rec.name)]
    if rec.phase is Phase.IDLE:
        return [Want(entry, "requested through the gateway", rec.name)]
    if rec.spec_hash != entry.hash:  # a rejected manifest's record states no spec to diff
        return _changed(ctx, view, entry, why=None if rec.stored_spec else VALID_AGAIN)
    if ctx.desired.restart_due(rec):
        return _changed(ctx, view, entry, why=RESTARTED)
    # A moved manifest is restated whatever the engine's state: invariant 4 finds a broken
    # file's deployments by the record's source, so a stale one would prune on a typo.
    moved = _moved(ctx, rec, entry)
    restated = [*_restated(ctx, rec, entry)] if (view.alive and rec.port) or moved else []
    return restated + lifecycle(ctx, view, entry)


def _restated(ctx: Context, rec: Record, entry: Entry) -> tuple[Update, ...]:
    """Facts that change nothing that runs (labels, the NOT_HASHED fields, the file it is
    declared in, the manifests' commit) differ from the record's: it is rewritten in
    place, the engine keeps running."""
    old, new = rec.stored_spec, spec_document(entry.deployment.spec)
    stale = [
        f"spec.{k}"
        for k in sorted(NOT_HASHED)
        if old.get(k) != new.get(k) and not _brought_by_upgrade(k, old, new)
    ]
    if rec.labels != entry.deployment.metadata.labels:
        stale.insert(0, "metadata.labels")
    if stale:
        return (Update(name=rec.name, reason=f"{', '.join(stale)} changed", entry=entry),)
    if _moved(ctx, rec, entry):
        was, now = (in_repo(ctx.desired.repo, f) for f in (rec.source, entry.source))
        return (Update(name=rec.name, reason=f"manifest moved to {now} (was {was})", entry=entry),)
    if rec.revision != ctx.desired.revision:
        reason = f"manifests now at commit {_short(ctx.desired.revision)} (no spec change)"
        return (Update(name=rec.name, reason=reason, entry=entry, revision_only=True),)
    return ()


def _brought_by_upgrade(key: str, old: dict[str, object], new: dict[str, object]) -> bool:
    """A field the record's document lacks, declared at its default: an older reconcile
    wrote the record before the field existed, so nothing was edited (each record an
    upgrade from 2026-12-01 found had an update event, and `plan` exit 2, saying
    `spec.fallbacks ... changed`)."""
    return key not in old and new.get(key) == document_default(key)


def _moved(ctx: Context, rec: Record, entry: Entry) -> bool:
    """The deployment is now declared in another file of this run's folders than its
    record names. A record's file outside them (another checkout of the set: CI planning
    against the node's records) is not this run's to restate."""
    if rec.source == entry.source:
        return False
    folders = [f.rstrip("/") + "/" for f in ctx.desired.folders]
    return any(rec.source.startswith(f) for f in folders)


def _short(revision: str | None) -> str:
    return ",".join(r[:12] for r in revision.split(",")) if revision else "none"


def _undeclared(ctx: Context, view: RecordView) -> tuple[AnyAction, ...]:
    """Our record whose manifest is gone, or broken (invariant 4: keep it running)."""
    rec = view.record
    error = ctx.desired.invalid.get(base_name(rec.name))
    if error is None and rec.source in ctx.desired.broken_sources:
        error = ctx.desired.source_errors.get(rec.source, f"{rec.source} could not be loaded")
    if error is None and rec.source in ctx.desired.emptied:
        error = f"{in_repo(ctx.desired.repo, rec.source)}: {EMPTIED}"
    if error is not None:
        return _broken(view, error)
    if not ctx.desired.prune:
        return ()  # invariant 5: an empty or missing folder prunes nothing
    unselected = ctx.unselected(rec)
    if view.alive or view.markers or rec.holds:
        reason = unselected or ctx.removed(rec, "manifest removed (was {})")
        # Its file declares others (renamed in place?): its model may be served on by the
        # new name, so its answers in flight end first (its engine ends on SIGTERM).
        drain = unselected is None and bool(ctx.still_declaring(rec))
        return (Stop(name=rec.name, reason=reason, undeclared=True, drain=drain),)
    reason = unselected or ctx.removed(rec, "manifest removed")
    return (Release(name=rec.name, reason=reason, nonce=rec.nonce, undeclared=True),)


def _scaled_down(ctx: Context, view: RecordView) -> tuple[AnyAction, ...]:
    """A replica beyond the desired count: the highest-numbered go, the rest stay."""
    rec = view.record
    reason = f"scaled down to {ctx.desired.count(base_name(rec.name))}"
    if view.alive or view.markers or rec.holds:
        return (Stop(name=rec.name, reason=reason, drain=True),)
    return (Release(name=rec.name, reason=reason, nonce=rec.nonce),)


def _broken(view: RecordView, error: str) -> tuple[AnyAction, ...]:
    rec = view.record
    if rec.phase in (Phase.STARTING, Phase.READY) and not view.alive:
        # Its engine died meanwhile: record that (no restart without a valid spec).
        exit_text = str(view.exit) if view.exit else "exited"
        reason = f"engine {exit_text}; no restart until its manifest is valid"
        return (
            Fail(
                name=rec.name,
                reason=reason,
                phase=Phase.BACKOFF,
                restarts=rec.restarts,
                exit=view.exit,
            ),
        )
    message = f"{SPEC_INVALID}{_engine_state(view)}): {error}"
    marked: tuple[AnyAction, ...] = ()
    if rec.spec_valid or rec.message != message:
        marked = (MarkSpec(name=rec.name, reason=message, valid=False),)
    return marked + _came_up(view)


def _came_up(view: RecordView) -> tuple[MarkReady, ...]:
    """An engine left running while its manifest is broken is still probed: one that was
    Starting is Ready once it answers (on the spec it was started with), so `status` and
    the gateway see it serve rather than `Starting` until the manifest is fixed."""
    rec, probe = view.record, view.probe
    if view.alive and rec.phase is Phase.STARTING and probe is not None and probe.ready:
        return (MarkReady(name=rec.name, reason=probe.detail),)
    return ()


def _unseen_changed(rec: Record, entry: Entry) -> bool:
    """envFrom's values, vLLM's --config file or llama.cpp's key file differ from the
    record's: its hash is not the stored spec's with these digests (an in-place field
    changed beside them must not hide them). Unknown where the values were not read
    (`plan` without the age key): as if unchanged, or an in-place change read as a
    replacement, the hash lacking the values the record's covers."""
    if entry.secrets_unread:
        return False
    if not entry.secret_digest and not entry.config_digest and not entry.key_file_digest:
        return False
    return _covered(document_hash(rec.stored_spec), entry, entry.secret_digest) != rec.spec_hash


def _covered(base: str, entry: Entry, secret_digest: str) -> str:
    """``base`` (a spec document's hash) covering the entry's --config file, key file and
    secrets."""
    hash_ = with_key_file(with_config(base, entry.config_digest), entry.key_file_digest)
    return with_secrets(hash_, secret_digest) if secret_digest else hash_


def rekeyed(desired: Desired, records: Iterable[Record]) -> list[Record]:
    """This set's records that a release before hashed otherwise, what it ran on unchanged
    as far as that release could tell: given today's hash, so an upgrade restarts no
    engine. Before the secrets key, envFrom's values were hashed unkeyed (a changed value
    matches neither, and restarts it); before --config files were read, no file was;
    before llama.cpp's key file was hashed, it was not (that release could not tell an
    edit either: the engine kept the key it started with, so the record is kept too)."""
    out = []
    for rec in records:
        entry = desired.entries.get(base_name(rec.name))
        if entry is None or rec.owner != desired.owner:
            continue
        base = document_hash(rec.stored_spec)
        today = _covered(base, entry, entry.secret_digest)
        if rec.spec_hash != today and rec.spec_hash in _before(base, entry):
            out.append(replace(rec, spec_hash=today))
    return out


def _before(base: str, entry: Entry) -> set[str]:
    """The hashes a release before gave ``entry``'s values (see rekeyed): none covered a
    key file."""
    secrets = {entry.secret_digest, entry.unkeyed_digest} - {""}
    bases = {base, with_config(base, entry.config_digest)} if entry.config_digest else {base}
    old = {with_secrets(b, d) for b in bases for d in secrets} if secrets else set(bases)
    return old - {_covered(base, entry, entry.secret_digest)}


def _unseen(entry: Entry) -> str:
    """What changed when no field did: envFrom's values, vLLM's --config file or
    llama.cpp's --api-key-file (the hash covers them)."""
    unseen = ["spec.envFrom's values"] if entry.deployment.spec.env_from else []
    if entry.config_digest:
        unseen.append("vLLM's --config file")
    if entry.key_file_digest:
        unseen.append("llama.cpp's --api-key-file")
    return " or ".join(unseen) or "spec"


def _changed(
    ctx: Context, view: RecordView, entry: Entry, *, why: str | None = None
) -> list[Judged]:
    """The instance gives way to a new one (``why``: not a spec change, a restart asked)."""
    rec = view.record
    declared = spec_document(entry.deployment.spec)
    fields = () if why else tuple(changed_fields(rec.stored_spec, declared))
    named = [f"spec.{f}" for f in fields]
    unseen_changed = not why and _unseen_changed(rec, entry)
    if unseen_changed or not named:
        named.append(_unseen(entry))
    shown = why or ", ".join(named) + " changed"
    in_place = fields and all(f.split(".")[0] in IN_PLACE for f in fields)
    if view.alive and in_place and not unseen_changed:
        return [Update(name=rec.name, reason=shown, entry=entry, fields=fields)]
    if view.alive and next_name(rec.name) in ctx.observed.records:
        return list(running(ctx, view))  # rolling: the old one serves until the new is Ready
    if drain_holds(ctx, view):
        return hold(ctx, view, shown)
    if rolling(entry) and view.alive and rec.phase is Phase.READY:
        return rollout(ctx, view, entry, shown, fields)
    if view.alive or view.markers or rec.holds:
        return recreate(ctx, view, entry, shown, fields)
    if rec.phase is Phase.PENDING or rec.unleased_backoff:
        # Waiting for room (a recreate's, a preemption's) or for a pull's retry: placed
        # with the new spec, never dropped, so the gateway keeps the name and holds its
        # requests meanwhile.
        return [Want(entry, f"{shown}: placing the new spec", rec.name)]
    return [Release(name=rec.name, reason=shown, nonce=rec.nonce)]


def _resolve_reservation(view: RecordView) -> Adopt | Release:
    rec = view.record
    # A maker alive here is this process, whose pass failed after the reservation.
    left = "left it in a pass that failed" if view.maker_here else "is gone"
    leader = leader_of(view.markers)
    if leader is not None:
        return Adopt(
            name=rec.name,
            reason=f"its maker (pid {_pid(rec)}) {left}; engine pid {leader.ref.pid} runs",
            ref=leader.ref,
        )
    return Release(
        name=rec.name,
        reason=f"reservation's maker (pid {_pid(rec)}) {left} and no engine was spawned",
        nonce=rec.nonce,
    )


def _orphans(ctx: Context) -> list[Reap]:
    by_nonce: dict[str, list[MarkedProcess]] = {}
    for proc in ctx.observed.orphans:
        by_nonce.setdefault(proc.nonce, []).append(proc)
    reaps = []
    for nonce, procs in sorted(by_nonce.items()):
        pids = ", ".join(str(p.ref.pid) for p in procs)
        reason = f"engine processes ({pids}) of instance {nonce} have no record"
        reaps.append(Reap(name=procs[0].name, reason=reason, processes=tuple(procs)))
    return reaps


def _engine_state(view: RecordView) -> str:
    if view.alive:
        return "engine left running"
    return "not started" if view.record.phase is Phase.PENDING else "engine not running"


def leader_of(markers: Sequence[MarkedProcess]) -> MarkedProcess | None:
    """The engine itself: the marker process whose parent is not one of them."""
    pids = {m.ref.pid for m in markers}
    roots = sorted((m for m in markers if m.ppid not in pids), key=lambda m: m.ref.start_time)
    return roots[0] if roots else None


def _pid(rec: Record) -> str:
    return str(rec.reserved_by.pid) if rec.reserved_by else "?"
